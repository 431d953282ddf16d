"""A scripted backend for tests: deterministic text per request, counted calls, injected faults."""

from __future__ import annotations

from typing import Callable, Sequence

from ..records import Generation, Request
from ..render import ChatTemplate
from ..tiny import CHATML_TEMPLATE

Script = Callable[[Request], str]


class ScriptedBackend:
    """Answers each request with ``script(request)``; raises nothing, counts every request.

    ``fail`` marks requests that come back as stored errors (a fault injected as data).
    """

    def __init__(self, script: Script, *, spec: str = "fake/scripted", revision: str = "scripted",
                 template: ChatTemplate | None = None, chunk_size: int = 8,
                 fail: Callable[[Request], bool] | None = None) -> None:
        self.spec, self.revision, self.chunk_size = spec, revision, chunk_size
        self.template = template or ChatTemplate(CHATML_TEMPLATE, spec, None, "<|im_end|>")
        self.script, self.fail = script, fail
        self.calls = 0
        self.requests: list[Request] = []

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        self.calls += len(requests)
        self.requests.extend(requests)
        return [self._one(r) for r in requests]

    def _one(self, request: Request) -> Generation:
        if self.fail is not None and self.fail(request):
            return Generation("", "", "error", len(request.prompt), 0, "injected fault")
        text = self.script(request)
        return Generation(text, text + (request.stop[0] if request.stop else ""), "stop",
                          len(request.prompt), len(text.split()) + 1)
