"""A small scripted OpenAI-compatible server on 127.0.0.1, for tests that must stay offline.

Each POST to ``/v1/chat/completions`` or ``/v1/completions`` is answered by the next scripted
action (``then``), or, once the script is used up, by ``responder(request)``. By default a chat
request gets a well-formed verdict chosen by ``verdict(messages)``, and a completions request a
deterministic fake completion (``fake_completion``). Every request is recorded with its headers
and body.

    with FakeOpenAI() as fake:
        fake.then(Fail(429, retry_after="2"), Garbage())
        client = OpenAIChatClient("m", base_url=fake.url, api_key="sk-test")

The fake completions model: a prompt (text or token ids) with a seed and a temperature gives a
fixed stream of word tokens (" how", " many", ...), ending in the request's first stop string (as
a real model ends its turn); greedy requests ignore the seed. The server honours ``max_tokens``
(one word, one token) and ``stop`` (the earliest stop string ends the text) and, like vLLM, strips
the matched stop string from the text, unless ``keep_stop`` (like ``transformers serve``).
``name_stop`` adds vLLM's ``stop_reason``; ``chat_only`` answers 404 on /v1/completions;
``text_prompts_only`` answers 400 to token-id prompts (like ``transformers serve``).
``prompt_logprob(position, token)`` makes it echo a token-id prompt's log-probabilities when asked
(``echo`` with ``logprobs``), in vLLM's shape: ``token_logprobs`` None for the first token, then
one per prompt token, then the generated token's; without it nothing is echoed (``logprobs``
null), as from a server that returns none. ``owned_by`` answers ``GET /v1/models`` with one model
owned by that name (vLLM says ``vllm``, llama.cpp's server ``llamacpp``); without it the GET is
not served.
"""

from __future__ import annotations

import hashlib
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

    @property
    def is_completion(self) -> bool:
        return not self.path.endswith("/chat/completions")


# --- actions: what the server does with one request ------------------------------------------

@dataclass(frozen=True)
class Answer:
    """A 200 reply; content None means the verdict chosen by the server's ``verdict`` function
    (chat) or the fake model's completion (completions). ``finish_reason`` overrides the one a
    completion reports."""

    content: str | None = None
    delay: float = 0.0
    finish_reason: str | None = None


@dataclass(frozen=True)
class Garbage:
    """Chat: a well-formed reply whose content is no verdict. Completions: a 200 whose body is
    not a completion at all."""

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


WORDS = ("how", "many", "why", "did", "you", "multiply", "three", "by", "twelve", "thanks",
         "can", "explain", "the", "second", "step", "again", "what", "if", "he", "gives",
         "away", "ten", "pencils", "ok", "so", "is", "it", "really", "boxes", "answer", "more")


def fake_tokens(prompt: Any, seed: int, temperature: float, count: int = 24) -> list[str]:
    """The fake model's word tokens for a prompt (text or ids): a pure function of the prompt,
    the temperature and (when sampling) the seed."""
    key = json.dumps([prompt, round(float(temperature), 6), seed if temperature > 0 else 0])
    tokens = []
    for index in range(count):
        digest = hashlib.sha256(f"{key}|{index}".encode()).digest()
        tokens.append(" " + WORDS[int.from_bytes(digest[:4], "big") % len(WORDS)])
    return tokens


def fake_completion(body: dict[str, Any], *, keep_stop: bool = False,
                    name_stop: bool = False) -> dict[str, Any]:
    """The fake model's answer to a /v1/completions body: text, finish reason, usage."""
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else list(stop)
    budget = int(body.get("max_tokens") or 16)
    stream = fake_tokens(body.get("prompt"), int(body.get("seed") or 0),
                         float(body.get("temperature", 1.0)))
    stream += stop[:1]  # the model ends its turn with the turn marker
    text, used, reason, matched = "", 0, "stop", None
    for token in stream:
        if used == budget:
            reason = "length"
            break
        text, used = text + token, used + 1
        hits = [(text.find(s), s) for s in stop if s in text]
        if hits:
            position, matched = min(hits)
            text = text[:position + len(matched)]
            break
    if matched and not keep_stop:
        text = text[:-len(matched)]
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
    if name_stop:
        choice["stop_reason"] = matched
    prompt = body.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    return {"choice": choice, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used,
                                        "total_tokens": prompt_tokens + used}}


@dataclass
class FakeOpenAI:
    verdict: Verdict = default_verdict
    responder: Callable[[Recorded], Action] | None = None
    requests: list[Recorded] = field(default_factory=list)
    max_in_flight: int = 0
    chat_only: bool = False  # 404 on /v1/completions, as a chat-only endpoint answers
    text_prompts_only: bool = False  # 400 on token-id prompts, as `transformers serve` answers
    keep_stop: bool = False  # leave the matched stop string in the text
    name_stop: bool = False  # say which stop string matched (vLLM's ``stop_reason``)
    prompt_logprob: Callable[[int, int], float] | None = None  # echoed per (position, token)
    owned_by: str | None = None  # GET /v1/models names this owner

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

    def record(self, request: Recorded) -> None:
        with self._lock:
            self.requests.append(request)

    @property
    def completions(self) -> list[Recorded]:
        """The /v1/completions requests, in arrival order."""
        return [r for r in self.requests if r.is_completion]

    def text_completion(self, request: Recorded, action: Answer) -> bytes:
        made = fake_completion(request.body, keep_stop=self.keep_stop, name_stop=self.name_stop)
        choice = made["choice"]
        if action.content is not None:
            choice = {**choice, "text": action.content}
        if action.finish_reason is not None:
            choice = {**choice, "finish_reason": action.finish_reason}
        prompt = request.body.get("prompt")
        if (self.prompt_logprob is not None and request.body.get("echo")
                and request.body.get("logprobs") is not None and isinstance(prompt, list)):
            echoed = [None] + [self.prompt_logprob(j, t) for j, t in enumerate(prompt) if j > 0]
            choice = {**choice, "logprobs": {"tokens": [str(t) for t in prompt] + ["?"],
                                             "token_logprobs": echoed + [-0.5]}}
        return json.dumps({
            "id": f"cmpl-{len(self.requests)}", "object": "text_completion",
            "model": request.body.get("model", ""), "choices": [choice], "usage": made["usage"],
        }).encode()

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

    def do_GET(self) -> None:
        fake: FakeOpenAI = self.server.fake  # type: ignore[attr-defined]
        if fake.owned_by is None or not self.path.endswith("/models"):
            self.send_error(501, "Unsupported method ('GET')")  # what the handler said before
            return
        model = {"id": "served", "object": "model", "owned_by": fake.owned_by}
        self._send(200, json.dumps({"object": "list", "data": [model]}).encode())

    def do_POST(self) -> None:
        fake: FakeOpenAI = self.server.fake  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = Recorded(self.path, dict(self.headers.items()), raw)
        if not self.path.endswith("/completions"):
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        if request.is_completion and fake.chat_only:
            fake.record(request)
            self._send(404, b'{"error": {"message": "This model only supports chat completions. '
                            b'Use /v1/chat/completions."}}')
            return
        if request.is_completion and fake.text_prompts_only \
                and not isinstance(request.body.get("prompt"), str):
            fake.record(request)
            self._send(400, b'{"detail": "prompt must be a string."}')
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
            if request.is_completion:
                self._send(200, fake.text_completion(request, action))
            else:
                self._send(200, fake.completion(request, action.content))
        elif isinstance(action, Garbage) and request.is_completion:
            self._send(200, action.content.encode())
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
