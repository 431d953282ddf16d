"""Role markers cut at token boundaries, not at characters.

A turn marker derived from sentinel renders is text such as ``<|im_end|>\\n`` or
``<SPECIAL_11>Assistant\\n``. Comparing two such markers character by character can cut in the
middle of a special token (``<|assistant|><`` from ``<|assistant|></think>`` and
``<|assistant|><think>``), and using a whole header as a stop includes text the model does not
write where a turn ends. So markers are split into pieces, each either one special token or a run
of plain text, and every comparison and cut happens between pieces.

Special tokens come from the tokenizer where there is one (its added tokens: exact), and from
the shapes every published template we know writes them in otherwise (``<|x|>``, ``<｜x｜>``,
``<x>``, ``[X]``, ``[|x|]``, MiniMax's ``]~b]``).
"""

from __future__ import annotations

import os
import re
from typing import Iterable

Piece = tuple[str, bool]  # (text, is a special token)

_SHAPES = (
    r"<\|[^<>|\s]{1,48}\|>",  # <|im_end|>, <|start_header_id|>
    r"<\|[A-Za-z_]{1,24}>|<[A-Za-z_]{1,24}\|>",  # Gemma 4's <|turn> and <turn|>
    r"<｜[^｜<>]{1,48}｜>",  # DeepSeek's full-width bars
    r"</?[A-Za-z_][\w.:-]{0,48}>",  # <start_of_turn>, </s>, <think>, <SPECIAL_11>, <seed:bos>
    r"\[/?[A-Za-z_]{2,32}\]",  # [INST], [/INST], [SYSTEM_PROMPT], [gMASK], [THINK]
    r"\[\|[^|\]\s]{1,32}\|\]",  # EXAONE's [|user|], [|endofturn|]
    r"\]~!?b[\[\]]|\[e~\[",  # MiniMax's ]~!b[, ]~b], [e~[
)
_SHAPE = re.compile("|".join(_SHAPES))
# Tags that open or close a thinking block: scaffolding a generation prompt adds after the role
# header, never part of the header a model writes when it speaks.
THINKING_TAGS = frozenset({"<think>", "</think>", "[THINK]", "[/THINK]", "<seed:think>",
                           "</seed:think>", "◁think▷", "◁/think▷"})


class TokenLexer:
    """Splits marker text into special tokens and plain text."""

    def __init__(self, specials: Iterable[str] = ()) -> None:
        known = sorted({s for s in specials if s and not s.isspace()}, key=len, reverse=True)
        parts = [re.escape(s) for s in known] + list(_SHAPES)
        self._pattern = re.compile("|".join(parts))
        self.specials = frozenset(known)

    def pieces(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        at = 0
        for match in self._pattern.finditer(text):
            if match.start() > at:
                out.append((text[at:match.start()], False))
            out.append((match.group(), True))
            at = match.end()
        if at < len(text):
            out.append((text[at:], False))
        return out

    def common_prefix(self, first: str, second: str) -> str:
        """The longest common prefix that ends between pieces: a special token is taken whole or
        not at all; plain text may be cut anywhere (it is not a token of its own)."""
        kept = []
        for (a, special_a), (b, special_b) in zip(self.pieces(first), self.pieces(second)):
            if (a, special_a) == (b, special_b):
                kept.append(a)
                continue
            if not special_a and not special_b:
                kept.append(common_prefix(a, b))
            break
        return "".join(kept)

    def first_special(self, text: str) -> str:
        return next((piece for piece, special in self.pieces(text) if special), "")

    def before_thinking(self, text: str) -> str:
        """``text`` up to its first thinking tag (``<|assistant|></think>`` -> ``<|assistant|>``)."""
        kept = []
        for piece, special in self.pieces(text):
            if special and piece in THINKING_TAGS:
                break
            kept.append(piece)
        return "".join(kept)

    def ends_inside_token(self, stop: str) -> str | None:
        """The known special token that ``stop`` ends inside of (its last text is the start of
        that token, as ``<`` is of ``<think>``), else None. Only known tokens can say this."""
        pieces = self.pieces(stop)
        if not pieces or pieces[-1][1]:
            return None
        tail = pieces[-1][0]
        for token in sorted(self.specials):
            for size in range(1, len(token)):
                if tail.endswith(token[:size]) and token[:size].strip():
                    return token
        return None


def common_prefix(first: str, second: str) -> str:
    """The longest common prefix, character by character (token boundaries: ``TokenLexer``)."""
    return os.path.commonprefix([first, second])
