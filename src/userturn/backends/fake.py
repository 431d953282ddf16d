"""A scripted backend for tests: deterministic text per request, counted calls, injected faults.

The model spec ``fake/NAME`` loads it with :func:`probe_script` (a fixed answer and a fixed
follow-up), so the command line can be tested without torch or a model."""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

from userturn.backends.tiny import CHATML_TEMPLATE, SPECIAL_TOKENS
from userturn.chat.render import ChatTemplate
from userturn.records import Generation, Request

Script = Callable[[Request], str]

USER_HEADER = "<|im_start|>user\n"  # the fake template is ChatML: a probe prompt ends with it
SCRIPTED_ANSWER = "Adding the two amounts gives the total.\n#### 42"
SCRIPTED_FOLLOW_UP = "Why did you add the two amounts instead of multiplying them?"
# What the fake model writes past the end of a closed conversation: a user turn, closed, and
# the text after it that only the budget or a stop marker cuts.
SCRIPTED_CONTINUATION = (f"{USER_HEADER}{SCRIPTED_FOLLOW_UP}<|im_end|>\n"
                         "<|im_start|>assistant\nBecause the question asks for the total.")


def probe_script(request: Request) -> str:
    """The script of ``fake/NAME`` specs: a fixed answer to every query, a fixed follow-up
    question in every user turn, and past the end of a conversation (``past_end``) a user turn
    with that question, so a command runs end to end without a model."""
    if request.past_end:
        return SCRIPTED_CONTINUATION
    return SCRIPTED_FOLLOW_UP if request.prompt.endswith(USER_HEADER) else SCRIPTED_ANSWER


def fake_template(spec: str) -> ChatTemplate:
    return ChatTemplate(CHATML_TEMPLATE, spec, None, "<|im_end|>")


class ScriptedBackend:
    """Answers each request with ``script(request)``; raises nothing, counts every request.

    The script's text is the whole turn the model would write: it is cut at the first stop marker
    it contains (finish "stop", ``raw_text`` keeping the marker) or, one whitespace-separated word
    a token, at ``max_tokens`` (finish "length"); a turn that fits ends on the first stop marker.
    Past the end (``Request.past_end``) nothing but a stop marker or the budget ends it: a text
    with no stop marker is all the model wrote before its budget ran out (finish "length"), and
    its special tokens stay in ``raw_text`` only, as the real backends keep them.
    ``fail`` marks requests that come back as stored errors (a fault injected as data).
    """

    def __init__(self, script: Script, *, spec: str = "fake/scripted", revision: str = "scripted",
                 template: ChatTemplate | None = None, chunk_size: int = 8,
                 fail: Callable[[Request], bool] | None = None) -> None:
        self.spec, self.revision, self.chunk_size = spec, revision, chunk_size
        self.template = template or fake_template(spec)
        self.script, self.fail = script, fail
        self.calls = 0
        self.scored = 0
        self.requests: list[Request] = []

    # What the scripted model gives each next-role option at a closed conversation's end: an
    # option naming the user (its header) 0.6, the assistant 0.3, anything else (the end) 0.05.
    OPTION_PROBABILITIES = (("user", 0.6), ("assistant", 0.3))

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        """Scripted log-probabilities of continuations of ``prompt`` (the scoring seam of the
        real engines), counted in ``scored``."""
        if not options:
            raise ValueError("score_options needs a prompt and at least one option")
        self.scored += 1
        return [math.log(next((p for role, p in self.OPTION_PROBABILITIES if role in option),
                              0.05)) for option in options]

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        self.calls += len(requests)
        self.requests.extend(requests)
        return [self._one(r) for r in requests]

    def _one(self, request: Request) -> Generation:
        if self.fail is not None and self.fail(request):
            return Generation("", "", "error", len(request.prompt), 0, "injected fault")
        text = self.script(request)
        hits = [(text.find(m), m) for m in request.stop if m in text]
        if hits:
            position, marker = min(hits)
            text, end = text[:position], marker
        elif request.past_end:
            end = None  # no end of its own: the budget ends it
        else:
            end = request.stop[0] if request.stop else ""
        words = list(re.finditer(r"\S+", text))
        budget = request.params.max_tokens
        if end is None or len(words) + 1 > budget:  # the turn and its end marker do not fit: cut
            raw = text[:words[budget - 1].end()] if budget <= len(words) else text
            return Generation(self._visible(raw, request), raw, "length", len(request.prompt),
                              min(len(words), budget))
        return Generation(self._visible(text, request), text + end, "stop", len(request.prompt),
                          len(words) + 1)

    @staticmethod
    def _visible(raw: str, request: Request) -> str:
        """The text without ChatML's special tokens past the end (the fake template's), as a
        real backend strips its tokenizer's."""
        if request.past_end:
            for token in SPECIAL_TOKENS:
                raw = raw.replace(token, "")
        return raw.strip()
