"""Credentials: the one place that reads API keys, and the one scrubber every outgoing text passes.

A key is read once, here, stripped of the whitespace a shell or a ``.env`` file leaves around it
(a trailing CR or LF makes an invalid header, and a server echoes the whole string back), and
remembered. ``scrub`` then removes every remembered key from any text before it is stored,
printed or written: raw, JSON-escaped (``\\u002d`` for ``-``, in any mix), URL-encoded (``%2D``),
and as a partial prefix (a server that shows the first characters of a key and stars the rest).
The store, the HTTP transport, the CLI's stdout and stderr and every file writer call ``scrub``.
"""

from __future__ import annotations

import os
import re
import threading

from userturn.errors import ConfigError

REDACTED = "[redacted]"
MIN_PARTIAL = 8  # this many leading characters of a key are taken for the key
MIN_KEY = 4  # shorter "keys" are not secrets worth scrubbing (and would eat ordinary words)

_lock = threading.Lock()
_keys: dict[str, list[re.Pattern[str]]] = {}  # key -> one pattern per character


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
    if not key or len(key) < MIN_KEY:
        return
    with _lock:
        if key not in _keys:
            _keys[key] = [re.compile(_unit(c)) for c in key]


def _unit(char: str) -> str:
    """One character of a key in every form it is written: itself, ``\\uXXXX``, ``%XX``."""
    code = ord(char)
    forms = [re.escape(char), r"\\u" + _hex_pattern(code, 4)]
    if code < 128:
        forms.append("%" + _hex_pattern(code, 2))
    return "(?:" + "|".join(forms) + ")"


def _hex_pattern(code: int, width: int) -> str:
    """``code`` in hex of ``width`` digits, either case."""
    digits = f"{code:0{width}x}"
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in digits)


def scrub(text: str) -> str:
    """``text`` with every remembered key (and every prefix of at least MIN_PARTIAL of its
    characters, in any of its forms) replaced by ``[redacted]``."""
    if not _keys or not text:
        return text
    with _lock:
        keys = sorted(_keys.items(), key=lambda kv: len(kv[0]), reverse=True)
    for key, units in keys:
        text = _scrub_one(text, units, min(MIN_PARTIAL, len(key)))
    return text


def _scrub_one(text: str, units: list[re.Pattern[str]], required: int) -> str:
    head = re.compile("".join(u.pattern for u in units[:required]))
    out, position = [], 0
    while (match := head.search(text, position)) is not None:
        end = match.end()
        for unit in units[required:]:  # extend as far as the key goes
            more = unit.match(text, end)
            if more is None:
                break
            end = more.end()
        out.append(text[position:match.start()] + REDACTED)
        position = end
    out.append(text[position:])
    return "".join(out)


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
