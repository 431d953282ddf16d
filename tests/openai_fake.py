"""A small scripted OpenAI-compatible chat server on 127.0.0.1, for tests that must stay offline.

Each POST to ``/v1/chat/completions`` is answered by the next scripted action (``then``), or, once
the script is used up, by ``responder(request)`` -- by default a well-formed verdict chosen by
``verdict(messages)``. Every request is recorded with its headers and body.

    with FakeOpenAI() as fake:
        fake.then(Fail(429, retry_after="2"), Garbage())
        client = OpenAIChatClient("m", base_url=fake.url, api_key="sk-test")
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest


@dataclass(frozen=True)
class Recorded:
    """One request as the server received it."""

    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.raw)

    @property
    def messages(self) -> list[dict[str, str]]:
        return self.body["messages"]


# --- actions: what the server does with one request ------------------------------------------

@dataclass(frozen=True)
class Answer:
    """A 200 reply; content None means the verdict chosen by the server's ``verdict`` function."""

    content: str | None = None
    delay: float = 0.0


@dataclass(frozen=True)
class Garbage:
    content: str = "I think this one is probably fine, hard to say."


@dataclass(frozen=True)
class Fail:
    status: int
    retry_after: str | None = None
    body: str = '{"error": {"message": "scripted failure"}}'


@dataclass(frozen=True)
class Hang:
    """Say nothing for ``seconds`` (cut short when the server stops)."""

    seconds: float = 30.0


@dataclass(frozen=True)
class Drop:
    """Close the connection without a response."""


Action = Answer | Garbage | Fail | Hang | Drop
Verdict = Callable[[list[dict[str, str]]], dict[str, str]]


def default_verdict(messages: list[dict[str, str]]) -> dict[str, str]:
    return {"label": "generic", "rationale": "It could follow any answer."}


@dataclass
class FakeOpenAI:
    verdict: Verdict = default_verdict
    responder: Callable[[Recorded], Action] | None = None
    requests: list[Recorded] = field(default_factory=list)
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self._script: deque[Action] = deque()
        self._lock = threading.Lock()
        self._in_flight = 0
        self.stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    # --- scripting ---
    def then(self, *actions: Action) -> FakeOpenAI:
        """Queue actions for the next requests, in arrival order."""
        with self._lock:
            self._script.extend(actions)
        return self

    def always(self, action: Action) -> FakeOpenAI:
        """Answer every unscripted request with ``action``."""
        self.responder = lambda request: action
        return self

    def next_action(self, request: Recorded) -> Action:
        with self._lock:
            self.requests.append(request)
            if self._script:
                return self._script.popleft()
        return self.responder(request) if self.responder else Answer()

    def completion(self, request: Recorded, content: str | None) -> bytes:
        if content is None:
            content = json.dumps(self.verdict(request.messages))
        return json.dumps({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
            "model": request.body.get("model", ""),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }).encode()

    def enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    # --- lifecycle ---
    @property
    def url(self) -> str:
        assert self._server is not None, "the server is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> FakeOpenAI:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)  # port 0: a free port
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()  # wakes hanging handlers
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeOpenAI/1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        fake: FakeOpenAI = self.server.fake  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = Recorded(self.path, dict(self.headers.items()), raw)
        if not self.path.endswith("/chat/completions"):
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        fake.enter()
        self._release = fake.leave  # called once, just before a reply goes out
        try:
            self._act(fake, fake.next_action(request), request)
        finally:
            self._leave_once()

    def _leave_once(self) -> None:
        # A request stops counting as in flight before its reply is written: the client may send
        # its next request the moment it reads the reply.
        release, self._release = getattr(self, "_release", None), None
        if release is not None:
            release()

    def _act(self, fake: FakeOpenAI, action: Action, request: Recorded) -> None:
        if isinstance(action, Answer):
            if action.delay:
                fake.stopping.wait(action.delay)
            self._send(200, fake.completion(request, action.content))
        elif isinstance(action, Garbage):
            self._send(200, fake.completion(request, action.content))
        elif isinstance(action, Fail):
            extra = {"Retry-After": action.retry_after} if action.retry_after else {}
            self._send(action.status, action.body.encode(), extra)
        elif isinstance(action, Hang):
            fake.stopping.wait(action.seconds)
            self.close_connection = True
        elif isinstance(action, Drop):
            self.close_connection = True  # no status line at all: the client sees a hang-up

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self._leave_once()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up (timeout) before we answered
            pass


@pytest.fixture
def openai_fake() -> Iterator[FakeOpenAI]:
    """A running fake server, stopped after the test."""
    with FakeOpenAI() as fake:
        yield fake
