"""User turns through an OpenAI-compatible server's ``/v1/completions`` (vLLM, SGLang, llama.cpp
server, ``transformers serve``).

The probe renders its prompt itself, with the model's own chat template, ending in an OPEN user
turn. A chat endpoint would render the conversation again and open an ASSISTANT turn, so only the
raw completions endpoint can write user turns; a chat-only endpoint is refused when the backend is
built (chat-only endpoints remain usable as judges). The tokenizer and template are loaded
locally, from ``tokenizer`` (a local folder, an embedded name such as ``smollm2``, or a hub id;
default: the model name), and must be the served model's.

Prompts (``prompt_as``):

- ``"tokens"`` (default): the prompt goes as token ids (``prompt_token_ids``: BOS exactly once, no
  server-side template or special-token handling). vLLM, SGLang and llama.cpp server take them.
- ``"text"``: the rendered text, for servers that take strings only (``transformers serve``). The
  server tokenizes it with special tokens on, so a BOS the template wrote is dropped from the text
  when the tokenizer adds one by itself (BOS still exactly once). The server's tokenizer must parse
  the template's special tokens as such, as Hugging Face tokenizers do.

What comes back: servers strip the matched stop string from ``text`` (vLLM, SGLang, llama.cpp;
``transformers serve`` keeps it unless it is a special token, which it skips). ``raw_text`` is
rebuilt as the text up to and including the stop marker: the marker the server names
(``stop_reason`` from vLLM, ``matched_stop`` from SGLang), else one found in the text, else, for a
turn that ended on a stop or end-of-sequence token without saying which, the first stop marker
(the template's end of the user turn). ``raw_text`` holds special tokens only as far as the server
returns them (most skip them). ``text`` has special tokens removed and is stripped. Token counts
are the server's ``usage``, else counted with the local tokenizer.

Seeds: each request sends its own ``seed``. Whether a seeded sample is reproducible is the
server's promise (vLLM and SGLang: per-request seeds; ``transformers serve`` seeds its global
generator, so concurrent sampled requests may interleave); greedy requests are deterministic.

Past the end (``Request.past_end``): the request also sends ``ignore_eos`` (the model's end
tokens do not stop it) and ``skip_special_tokens: false`` (they stay in the text), as vLLM and
SGLang take them. llama.cpp's server takes ``ignore_eos`` too, but bans the end tokens instead of
going past them (a logit bias of minus infinity), so its continuations could never close a turn:
a server that names itself ``llamacpp`` (``GET /models``) is refused such requests, in one line
before any is sent; run the GGUF in process instead (``llamacpp/FILE.gguf``).

Option scores (``score_options``, backends/options.py): the prompt's token ids with each option's
appended, sent with ``echo``, ``logprobs: 1`` and ``max_tokens: 1``; the server echoes the
log-probability of every prompt token (vLLM does), and an option's score is the sum over its
tokens. A server that echoes none is refused in one line at the first call.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from userturn.backends.models import EMBEDDED, resolve_model
from userturn.backends.openai_http import APIError, OpenAIHTTP
from userturn.backends.turns import as_list, end_texts, generation_config_file
from userturn.chat.render import ChatTemplate, prompt_token_ids
from userturn.errors import ModelError
from userturn.records import Generation, Request

PromptAs = Literal["tokens", "text"]
WHAT_WORKS = ("user turns need a server that completes raw prompts at /v1/completions (vLLM, "
              "SGLang, llama.cpp server, `transformers serve`); chat-only endpoints remain "
              "usable as judges (--judge openai/MODEL)")
# How servers word "use the chat endpoint" (OpenAI: "This is a chat model and not supported in the
# v1/completions endpoint"; others: "only supports chat completions").
_CHAT_ONLY = re.compile(r"chat[ _/-]?(?:completion|model)|only supports? chat|chat[- ]only")
# What a past-end request adds to its body: vLLM's and SGLang's names.
PAST_END_BODY = {"ignore_eos": True, "skip_special_tokens": False,
                 "spaces_between_special_tokens": False}
BANS_ENDS = "llamacpp"  # the server whose ignore_eos bans end tokens (see the module's notes)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja",
                    "chat_template.json", "added_tokens.json")


class OpenAICompletionsBackend:
    """A Backend on ``POST {base_url}/completions``: one HTTP request per Request, at most
    ``concurrency`` in flight, retried on 429/5xx/timeouts/dropped connections; every failure is
    a Generation with ``error`` (the API key never appears in it).

    ``base_url`` may be a list of servers of the same model (several ``vllm serve``): each request
    goes to the endpoint with the fewest in flight, at most ``concurrency`` per endpoint. Their
    generations are keyed by the model and tokenizer, not by an address (``openai:pool:MODEL``),
    so adding or removing a server keeps the keys: every endpoint must serve the same weights."""

    def __init__(self, model: str, *, base_url: str | Sequence[str],
                 tokenizer: str | None = None,
                 api_key: str | None = None, concurrency: int = 8, timeout: float = 300.0,
                 max_attempts: int = 5, backoff: float = 1.0, max_backoff: float = 60.0,
                 prompt_as: PromptAs = "tokens", chunk_size: int = 64,
                 extra_body: Mapping[str, Any] | None = None,
                 sleep: Callable[[float], None] | None = None, probe: bool = True) -> None:
        if prompt_as not in ("tokens", "text"):
            raise ModelError(f"prompt_as must be 'tokens' or 'text', not {prompt_as!r}")
        urls = [base_url] if isinstance(base_url, str) else list(dict.fromkeys(base_url))
        if not urls or not all(urls):
            raise ModelError(f"openai/{model} needs the server's address (base_url), "
                             "for example http://127.0.0.1:8000/v1")
        self.model, self.prompt_as = model, prompt_as
        self.spec = f"openai/{model}"
        self.concurrency, self.chunk_size = max(1, concurrency), chunk_size * len(urls)
        self.extra_body = dict(extra_body or {})
        self._endpoints = [OpenAIHTTP(url, api_key=api_key, timeout=timeout,
                                      max_attempts=max_attempts, backoff=backoff,
                                      max_backoff=max_backoff, sleep=sleep) for url in urls]
        self._in_flight = [0] * len(urls)
        self._lock = threading.Lock()
        self._http = self._endpoints[0]
        self.base_url = self._http.base_url
        self._owners: set[str] = set()  # what the servers say they are (GET /models)
        if probe:  # a dead address is said before the tokenizer loads (seconds)
            for http in self._endpoints:
                self._owners |= self._reach(http)
        self.tokenizer, fingerprint = load_tokenizer(tokenizer or model)
        self.template = ChatTemplate.from_tokenizer(self.tokenizer, self.spec)
        where = _without_userinfo(self.base_url) if len(urls) == 1 else "pool"
        self.revision = f"openai:{where}:{model}" + (
            f":tokenizer={fingerprint}" if fingerprint else "")
        self._special = sorted(self.tokenizer.all_special_tokens, key=len, reverse=True)
        # The served model ends where its generation config says, beside the tokenizer's EOS.
        served = generation_config_file(self.tokenizer.name_or_path).get("eos_token_id")
        self.end_texts = end_texts([self.tokenizer.eos_token_id, *as_list(served)],
                                   lambda i: self.tokenizer.decode([i]))
        self._bos_added = _adds_bos(self.tokenizer)
        if probe:
            for http in self._endpoints:
                self._http = http
                self._probe()
            self._http = self._endpoints[0]

    def __repr__(self) -> str:
        return f"OpenAICompletionsBackend(model={self.model!r}, base_url={self.base_url!r})"

    # --- the probe: refuse a server that cannot complete raw prompts, before any run starts ---

    def _probe(self) -> None:
        ids = prompt_token_ids(self.tokenizer, "Hello")
        prompt: Any = ids if self.prompt_as == "tokens" else self._prompt_text("Hello")
        body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                **self.extra_body}
        try:
            self._http.post("/completions", body, _parse_completion)
        except APIError as exc:
            raise ModelError(self._http.redact(self._refusal(exc))) from None

    def _reach(self, http: OpenAIHTTP) -> set[str]:
        try:
            return http.reach()
        except APIError as exc:
            raise ModelError(http.redact(f"{http.base_url}/completions cannot be used "
                                         f"({_first_line(exc)})")) from None

    def _refusal(self, exc: APIError) -> str:
        where, detail = f"{self._http.base_url}/completions", exc.detail.lower()
        names_model = self.model.lower() in detail
        says_chat = bool(_CHAT_ONLY.search(detail.replace(self.model.lower(), "")))
        client_error = exc.status in (400, 404, 405, 422)
        if client_error and (says_chat or (exc.status in (404, 405) and not names_model)):
            return f"{where} does not complete raw prompts ({_first_line(exc)}): {WHAT_WORKS}"
        if client_error and names_model:
            return (f"{where} does not serve model {self.model!r} ({_first_line(exc)}); "
                    "give the model name the server serves")
        if client_error and self.prompt_as == "tokens":
            return (f"{where} refused a token-id prompt ({_first_line(exc)}); servers that take "
                    "text prompts only (`transformers serve`) need prompt_as='text'")
        if exc.status in (401, 403):
            return f"{where} refused the request ({_first_line(exc)}): check the API key"
        return f"{where} cannot be used ({_first_line(exc)})"

    # --- completions ---

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        if not requests:
            return []
        if BANS_ENDS in self._owners and any(r.past_end for r in requests):
            raise ModelError(f"{self.base_url} is a llama.cpp server: its ignore_eos bans the end "
                             "tokens rather than going past them, so it cannot continue past the "
                             "end of a turn; run the GGUF in process (llamacpp/FILE.gguf)")
        # Tokenize in this thread (a fast tokenizer is not safe to share across threads), once
        # per distinct prompt; only the HTTP requests run in parallel.
        encoded: dict[str, list[int]] = {}
        for request in requests:
            if request.prompt not in encoded:
                encoded[request.prompt] = prompt_token_ids(self.tokenizer, request.prompt)
        bodies = [self._body(r, encoded[r.prompt]) for r in requests]
        workers = min(self.concurrency * len(self._endpoints), len(requests))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            answers = list(pool.map(self._send, bodies))
        return [self._finish(r, len(encoded[r.prompt]), answer)
                for r, answer in zip(requests, answers)]

    def _body(self, request: Request, ids: list[int]) -> dict[str, Any]:
        params = request.params
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": ids if self.prompt_as == "tokens" else self._prompt_text(request.prompt),
            "max_tokens": params.max_tokens,
            "temperature": max(params.temperature, 0.0),
            "top_p": params.top_p,
            "seed": request.seed,
            "n": 1,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.past_end:
            body.update(PAST_END_BODY)
        body.update(self.extra_body)
        return body

    # --- option scores: prompt log-probabilities echoed by the server ---

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        """log P(option | prompt) of each option (backends/options.py), from the log-probabilities
        the server echoes for the prompt's tokens. Raises ModelError where the server echoes none
        or takes no token ids; any other exception is this call's failure (HTTP, a prompt too
        long)."""
        from userturn.backends.options import scored_tokens

        if self.prompt_as != "tokens":
            raise ModelError(f"{self.spec}: option scores need token-id prompts (prompt_as="
                             "'tokens'): a text prompt's tokens at the option's start are the "
                             "server's to choose")
        ids = prompt_token_ids(self.tokenizer, prompt)
        if not ids or not options:
            raise ValueError("score_options needs a prompt and at least one option")
        scored = scored_tokens([self.tokenizer(o, add_special_tokens=False)["input_ids"]
                                for o in options], whole)
        bodies = [{"model": self.model, "prompt": ids + tokens, "max_tokens": 1,
                   "temperature": 0.0, "echo": True, "logprobs": 1, **self.extra_body}
                  for tokens in scored]
        workers = min(self.concurrency * len(self._endpoints), len(bodies))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            answers = list(pool.map(self._send, bodies))
        return [self._echoed_sum(answer, len(ids), len(tokens))
                for answer, tokens in zip(answers, scored)]

    def _echoed_sum(self, answer: dict[str, Any] | str, start: int, count: int) -> float:
        """The sum of the echoed log-probabilities of the ``count`` tokens after the prompt's
        ``start`` (position 0, the first token, has none: it is never read)."""
        if isinstance(answer, str):
            raise RuntimeError(answer)
        logprobs = answer["choice"].get("logprobs")
        echoed = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        values = echoed[start:start + count] if isinstance(echoed, list) else []
        if len(values) < count or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           for v in values):
            raise ModelError(f"{self.base_url}/completions echoes no log-probabilities of the "
                             "prompt's tokens (echo with logprobs): option scores need a server "
                             "that does, such as vLLM")
        return float(sum(values))

    def _prompt_text(self, text: str) -> str:
        bos = self.tokenizer.bos_token
        if self._bos_added and bos and text.startswith(bos):
            return text[len(bos):]  # the server's tokenizer adds it again
        return text

    def _send(self, body: dict[str, Any]) -> dict[str, Any] | str:
        """The parsed response, or the error message (a failure is data, never raised)."""
        # The least busy endpoint: with at most concurrency x endpoints workers, it always has
        # a free slot, so no endpoint is sent more than its bound.
        with self._lock:
            index = min(range(len(self._endpoints)), key=self._in_flight.__getitem__)
            self._in_flight[index] += 1
        http = self._endpoints[index]
        try:
            return http.post("/completions", body, _parse_completion)
        except APIError as exc:
            return http.redact(str(exc))
        except Exception as exc:  # a broken transport must not break the whole batch
            return http.redact(f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._in_flight[index] -= 1

    def _finish(self, request: Request, prompt_tokens: int,
                answer: dict[str, Any] | str) -> Generation:
        if isinstance(answer, str):
            return Generation("", "", "error", prompt_tokens, 0, answer)
        choice, usage = answer["choice"], answer["usage"]
        text, reason = choice["text"], choice.get("finish_reason")
        if reason not in (None, "stop", "length", "eos"):  # abort, content_filter, error, ...
            return Generation("", "", "error", prompt_tokens, 0,
                              f"the server ended the completion with finish_reason={reason!r}")
        raw, visible, finish = self._cut(text, request.stop, reason, _named_stop(choice))
        for special in self._special:
            visible = visible.replace(special, "")
        completion = usage.get("completion_tokens")
        if not isinstance(completion, int):
            completion = len(self.tokenizer(raw, add_special_tokens=False)["input_ids"])
        prompt = usage.get("prompt_tokens")
        return Generation(visible.strip(), raw, finish,
                          prompt if isinstance(prompt, int) else prompt_tokens, completion)

    @staticmethod
    def _cut(text: str, stop: tuple[str, ...], reason: str | None,
             named: str | None) -> tuple[str, str, Literal["stop", "length"]]:
        """(raw_text, visible text, finish reason) of a completion's text."""
        hits = [(text.find(m), m) for m in stop if m in text]
        if hits:  # the server kept the marker (or did not stop on it): cut at the first one
            position, marker = min(hits)
            return text[:position + len(marker)], text[:position], "stop"
        if reason == "length":
            return text, text, "length"
        marker = named if named in stop else (stop[0] if stop else "")
        return text + marker, text, "stop"


def _parse_completion(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        text = choice["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise APIError(f"malformed response: {raw[:200]!r}", False) from None
    if not isinstance(text, str) or not isinstance(choice, dict):
        raise APIError(f"malformed response: {raw[:200]!r}", False)
    usage = data.get("usage")
    return {"choice": choice, "usage": usage if isinstance(usage, dict) else {}}


def _named_stop(choice: Mapping[str, Any]) -> str | None:
    """The stop string the server says it stopped on (vLLM ``stop_reason``, SGLang
    ``matched_stop``); a token id there means an end token, not one of our strings."""
    for key in ("stop_reason", "matched_stop"):
        value = choice.get(key)
        if isinstance(value, str):
            return value
    return None


def _first_line(exc: APIError) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 240 else text[:240] + "..."


def _without_userinfo(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _adds_bos(tokenizer: Any) -> bool:
    bos_id = tokenizer.bos_token_id
    if bos_id is None:
        return False
    return tokenizer("", add_special_tokens=True)["input_ids"][:1] == [bos_id]


def _generation_ends(folder: str) -> list[int]:
    """The end-of-sequence ids of the generation config beside a local tokenizer (the server's
    model ends there too); none where there is no such file."""
    file = Path(folder) / "generation_config.json"
    try:
        return as_list(json.loads(file.read_text()).get("eos_token_id"))
    except (OSError, ValueError, AttributeError):
        return []


def load_tokenizer(name: str) -> tuple[Any, str | None]:
    """The tokenizer (with its chat template) from an embedded name, a local folder or a hub id,
    and a fingerprint of it where one is known."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(name).expanduser()
    if name in EMBEDDED:
        ref = resolve_model(name)
        location, fingerprint = ref.path, f"{name}:{ref.revision}"
    elif path.is_dir():
        location, fingerprint = str(path.resolve()), _fingerprint_tokenizer(path)
    elif name.count("/") == 1 and not name.startswith((".", "/", "~")):
        location, fingerprint = name, None  # a hub id (online users)
    else:
        raise ModelError(
            f"cannot find the tokenizer {name!r}: give the served model's tokenizer (--tokenizer) "
            f"as a local folder, an embedded model ({', '.join(EMBEDDED)}) or a hub id")
    try:
        return AutoTokenizer.from_pretrained(location), fingerprint
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"cannot load the tokenizer {name!r}: {first}") from exc


def _fingerprint_tokenizer(folder: Path) -> str | None:
    digest, found = hashlib.sha256(), False
    for name in _TOKENIZER_FILES:
        file = folder / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes())
            found = True
    return "sha256:" + digest.hexdigest()[:16] if found else None
