"""Credentials: the one place that reads API keys, and the one scrubber every outgoing text passes.

A key is read once, here, stripped of the whitespace a shell or a ``.env`` file leaves around it
(a trailing CR or LF makes an invalid header, and a server echoes the whole string back), and
remembered. ``scrub`` then removes from any text, before it is stored, printed or written, every
run of 8 or more characters of a remembered key (a prefix a server shows before stars, the last
characters, a middle slice), in any case, raw, JSON-escaped (``\\u002d`` for ``-``, in any mix),
URL-encoded (``%2D``), as HTML entities (``&#45;``), split by a line break, and base64-encoded (an
Authorization header a server echoes encoded).
The store, the HTTP transport, the CLI's stdout and stderr and every file writer call ``scrub``.
"""

from __future__ import annotations

import base64
import bisect
import html
import os
import re
import threading

from userturn.errors import ConfigError

REDACTED = "[redacted]"
MIN_PIECE = 8  # any run of this many characters of a key (or more) is taken for the key
MIN_PARTIAL = MIN_PIECE  # the name of before: the shortest prefix of a key that is scrubbed
MIN_KEY = 4  # shorter "keys" are not secrets worth scrubbing (and would eat ordinary words)

_lock = threading.Lock()
_keys: set[str] = set()
_needles: tuple[str, ...] = ()  # every key and its base64 forms, lower-cased
_pieces: re.Pattern[str] | None = None  # any MIN_PIECE-long window of a needle
# Every piece of MIN_PIECE characters of a needle holds one of these 4-grams (those at offsets
# 0, 4, 8...): a text holding none of them holds no piece, found by C-speed substring search.
_anchors: tuple[str, ...] = ()


def api_key(variable: str = "OPENAI_API_KEY", given: str | None = None) -> str | None:
    """The key ``given``, else the one in ``variable``, stripped and remembered; None if unset."""
    raw = given if given is not None else os.environ.get(variable)
    key = clean(raw, variable)
    remember(key)
    return key


def clean(raw: str | None, where: str = "the API key") -> str | None:
    if raw is None:
        return None
    key = raw.strip()
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in key):
        # Not a key a server accepts; and an HTTP header cannot carry it.
        raise ConfigError(f"{where} holds whitespace or control characters inside the key")
    return key or None


def remember(key: str | None) -> None:
    """Scrub ``key`` from every text from now on."""
    global _needles, _pieces, _anchors
    if not key or len(key) < MIN_KEY:
        return
    with _lock:
        if key in _keys:
            return
        _keys.add(key)
        needles = {needle.lower() for k in _keys for needle in _forms(k)}
        _needles = tuple(sorted(needles, key=len, reverse=True))
        windows = {n[i:i + MIN_PIECE] for n in _needles
                   for i in range(max(1, len(n) - MIN_PIECE + 1))}
        _pieces = re.compile(_trie_pattern(windows))
        _anchors = tuple({n[i:i + MIN_PIECE // 2] for n in _needles
                          for i in range(0, max(1, len(n) - MIN_PIECE // 2 + 1), MIN_PIECE // 2)})


def _forms(key: str) -> list[str]:
    """The key, and the base64 text that carries it inside an encoded stream (an Authorization
    header as ``Basic``/logged base64, a data URL): the key's bytes start at any of three
    offsets of a 3-byte group, and only the whole groups after that are the key's own."""
    forms = [key]
    data = key.encode()
    for offset in range(3):
        body = data[offset:]
        body = body[:len(body) - len(body) % 3]
        if len(body) >= 6:  # 8 base64 characters: shorter would not reach MIN_PIECE
            standard = base64.b64encode(body).decode()
            forms += [standard, standard.replace("+", "-").replace("/", "_")]
    return forms


def _trie_pattern(words: set[str]) -> str:
    """One regex matching any of ``words``, factored by common prefix: the engine tests one
    character class per position instead of every word in turn (the scrubber sits under
    every write)."""
    trie: dict[str, dict] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: dict[str, dict]) -> str:
        branches = [re.escape(char) + pattern(child) for char, child in sorted(node.items())
                    if char]
        optional = "" in node
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 and not optional else \
            "(?:" + "|".join(branches) + ")"
        return body + ("?" if optional else "")

    return pattern(trie)


# What stands for one character of a key in text a server echoes: JSON ``\u002d``, URL
# ``%2D``, HTML ``&#45;``/``&#x2d;``/``&lowbar;``; a line break (raw or JSON ``\n``) stands for
# nothing, so a key split over lines still reads as the key.
_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{4}|%[0-9a-fA-F]{2}|&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|"
                     r"[A-Za-z][A-Za-z0-9]{1,31});|\r?\n|\r|\\[rn]")
# The escapes that can spell a key character (not ``&amp;`` or ``&lt;``, which every page has)
_KEY_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{4}|%[0-9a-fA-F]{2}|&#|&(?:lowbar|UnderBar|period|"
                         r"sol|colon|plus|equals|num|dollar|excl|tilde);")
_LINE_BREAKS = ("\n", "\r", "\\n", "\\r")


def _decoded(escape: str) -> str:
    if escape[0] == "\\" and escape[1] == "u":
        return chr(int(escape[2:], 16))
    if escape[0] == "%":
        return chr(int(escape[1:], 16))
    if escape[0] == "&":
        decoded = html.unescape(escape)
        return decoded if len(decoded) == 1 else escape
    return ""  # a line break, raw or escaped


def _lower(text: str) -> str:
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c.lower() if len(c.lower()) == 1 else c for c in text)  # keep positions


def _normalised(text: str) -> tuple[str, list[tuple[int, int, int, bool]]]:
    """``text`` decoded and lower-cased, with its segments: (start in the result, start and end
    in ``text``, whether it is literal text (else one escape))."""
    parts: list[str] = []
    segments: list[tuple[int, int, int, bool]] = []
    length = position = 0
    for match in _ESCAPE.finditer(text):
        if match.start() > position:
            literal = _lower(text[position:match.start()])
            segments.append((length, position, match.start(), True))
            parts.append(literal)
            length += len(literal)
        decoded = _lower(_decoded(match.group()))
        segments.append((length, match.start(), match.end(), False))
        parts.append(decoded)
        length += len(decoded)
        position = match.end()
    if position < len(text):
        segments.append((length, position, len(text), True))
        parts.append(_lower(text[position:]))
    return "".join(parts), segments


def scrub(text: str) -> str:
    """``text`` with every run of at least MIN_PIECE characters of a remembered key (in any
    case, in any of the forms above, split by line breaks, or base64-encoded) replaced by
    ``[redacted]``."""
    pieces, needles, anchors = _pieces, _needles, _anchors
    if pieces is None or not text:
        return text
    # First the cheap question: does any anchor occur in the text as decoded (usually no)?
    if _KEY_ESCAPE.search(text):
        flat = _normalised(text)[0]
    else:
        flat = _lower(text)
        for mark in _LINE_BREAKS:
            flat = flat.replace(mark, "")
    if not any(anchor in flat for anchor in anchors):
        return text
    if any(mark in text for mark in ("\\", "%", "&", "\n", "\r")):
        normal, segments = _normalised(text)
    else:
        normal, segments = flat, [(0, 0, len(text), True)]
    spans: list[tuple[int, int]] = []
    position = 0
    while (match := pieces.search(normal, position)) is not None:
        start, end = match.start(), match.end()
        while end < len(normal) and any(normal[start:end + 1] in n for n in needles):
            end += 1  # extend as far as the key (or its base64) goes
        spans.append((start, end))
        position = end
    if not spans:
        return text
    starts = [segment[0] for segment in segments]
    out, last = [], 0
    for start, end in spans:
        begin, stop = _original(segments, starts, start, True), \
            _original(segments, starts, end - 1, False)
        out.append(text[last:begin] + REDACTED)
        last = stop
    out.append(text[last:])
    return "".join(out)


def _original(segments: list[tuple[int, int, int, bool]], starts: list[int], index: int,
              begin: bool) -> int:
    """Where the decoded character ``index`` begins (``begin``) or ends in the original text."""
    # The last segment starting at or before ``index``: never one that decodes to nothing (a
    # line break), as the segment after it starts at the same place.
    at = bisect.bisect_right(starts, index) - 1
    normal_start, original_start, original_end, literal = segments[at]
    if literal:
        return original_start + (index - normal_start) + (0 if begin else 1)
    return original_start if begin else original_end


def scrub_value(value: object) -> object:
    """``scrub`` through strings inside lists and dicts (metadata, JSON records)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub_value(k): scrub_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(scrub_value(v) for v in value)
    return value


class ScrubbedStream:
    """A text stream (stdout, stderr) that scrubs what is written to it."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub(text))
        return len(text)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._stream, name)
