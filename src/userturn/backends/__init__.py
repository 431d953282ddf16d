"""The Backend seam: a batch of raw prompts in, one generation per request out, in order.

A backend that writes user turns must accept a raw prompt (we render it ourselves, with the
model's own template). Heavy libraries are imported only inside their backend module.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from userturn.backends.batching import BatchSize, fixed_batch_size
from userturn.backends.models import resolve_model, split_spec
from userturn.chat.render import ChatTemplate
from userturn.errors import ModelError
from userturn.records import Generation, Request
from userturn.settings import parse_json


class Backend(Protocol):
    spec: str  # the model spec the user wrote, e.g. "smollm2"
    revision: str  # what changes the weights changes this
    template: ChatTemplate  # the model's own chat template
    chunk_size: int  # how many requests to hand over at once (results are stored per chunk)

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        """One Generation per request, in order. A failed request is a Generation with error.
        A request with ``past_end`` ends only at its stop markers or budget, never at the
        model's end tokens, which ``raw_text`` keeps (docs/backends.md)."""
        ...


@dataclass(frozen=True)
class BackendSpec:
    """How to build one backend, as plain values: what a Ray actor is sent to build its own.

    ``factory`` (``"module:function"``, called with this spec) builds a backend of your own
    instead of :func:`load_backend`; the module must be importable where the backend is built."""

    spec: str
    batch_size: BatchSize = 8
    base_url: str | tuple[str, ...] | None = None
    tokenizer: str | None = None
    prompt_as: str = "tokens"
    backend_args: Mapping[str, Any] = field(default_factory=dict)
    endpoint_concurrency: int = 8
    factory: str | None = None

    def build(self) -> Backend:
        if self.factory is not None:
            module, _, name = self.factory.partition(":")
            return getattr(importlib.import_module(module), name)(self)  # type: ignore[no-any-return]
        return load_backend(self.spec, batch_size=self.batch_size, base_url=self.base_url,
                            tokenizer=self.tokenizer, prompt_as=self.prompt_as,
                            backend_args=dict(self.backend_args) or None,
                            endpoint_concurrency=self.endpoint_concurrency)


def load_backend(spec: str, *, batch_size: BatchSize = 8, device: str | None = None,
                 base_url: str | Sequence[str] | None = None, tokenizer: str | None = None,
                 prompt_as: str = "tokens",
                 backend_args: Mapping[str, Any] | None = None,
                 endpoint_concurrency: int = 8) -> Backend:
    """A backend by spec: ``openai/MODEL`` is a server's /v1/completions (``base_url``, or a list
    of several servers of the same model, each sent at most ``endpoint_concurrency`` requests at
    once; the tokenizer and template loaded locally from ``tokenizer``, default MODEL); ``vllm/MODEL`` runs
    vLLM in process; ``llamacpp/FILE.gguf`` runs llama.cpp; ``fake/NAME`` is the scripted test
    backend (no model); anything else runs in process through transformers.

    ``backend_args`` go to the engine as they are: vLLM's engine arguments (``LLM(...)``, e.g.
    ``{"tensor_parallel_size": 2}``) or llama.cpp's ``Llama(...)`` arguments (e.g.
    ``{"n_ctx": 8192, "n_gpu_layers": -1}``). Without them, the JSON object in the environment
    variable ``USERTURN_VLLM_ARGS`` or ``USERTURN_LLAMACPP_ARGS`` is used.
    """
    options = BackendOptions(batch_size, device, base_url, tokenizer, prompt_as,
                             backend_args, endpoint_concurrency)
    return engine_of(spec).build(spec, options)


@dataclass(frozen=True)
class BackendOptions:
    """What ``load_backend`` was given besides the spec; each engine reads what concerns it."""

    batch_size: BatchSize = 8
    device: str | None = None
    base_url: str | Sequence[str] | None = None
    tokenizer: str | None = None
    prompt_as: str = "tokens"
    backend_args: Mapping[str, Any] | None = None
    endpoint_concurrency: int = 8


@dataclass(frozen=True)
class Engine:
    """What a spec prefix runs on: how its backend is built and how its chat template is read
    without the weights. Each function imports its engine's module (and heavy library) itself."""

    build: Callable[[str, BackendOptions], Backend]
    template: Callable[[str, str | None], ChatTemplate]  # (spec, --tokenizer)


def engine_of(spec: str) -> Engine:
    """The engine a model spec names: ``openai/`` (a server's model, never resolved locally), or
    the prefix ``resolve_model`` reads (``transformers`` when there is none)."""
    if spec.startswith(f"{OPENAI}/"):
        return ENGINES[OPENAI]
    return ENGINES[split_spec(spec)[0]]


def _openai_backend(spec: str, options: BackendOptions) -> Backend:
    if not options.base_url:
        raise ModelError(f"{spec} needs the server's address: --base-url "
                         "http://HOST:PORT/v1 (an OpenAI-compatible /v1/completions server)")
    from userturn.backends.openai import OpenAICompletionsBackend

    return OpenAICompletionsBackend(spec.split("/", 1)[1], base_url=options.base_url,
                                    tokenizer=options.tokenizer,
                                    prompt_as=options.prompt_as,  # type: ignore[arg-type]
                                    concurrency=options.endpoint_concurrency)


def _fake_backend(spec: str, options: BackendOptions) -> Backend:
    from userturn.backends.fake import ScriptedBackend, probe_script

    return ScriptedBackend(probe_script, spec=spec,
                           chunk_size=fixed_batch_size(options.batch_size))


def _vllm_backend(spec: str, options: BackendOptions) -> Backend:
    from userturn.backends.vllm import VLLMBackend

    return VLLMBackend(resolve_model(spec), options=_engine_args("vllm", options.backend_args),
                       chunk_size=max(fixed_batch_size(options.batch_size), 64))


def _llamacpp_backend(spec: str, options: BackendOptions) -> Backend:
    from userturn.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend(resolve_model(spec),
                           options=_engine_args("llamacpp", options.backend_args),
                           chunk_size=fixed_batch_size(options.batch_size))


def _transformers_backend(spec: str, options: BackendOptions) -> Backend:
    from userturn.backends.hf import TransformersBackend

    return TransformersBackend(resolve_model(spec), batch_size=options.batch_size,
                               device=options.device)


def _engine_args(backend: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    if given is not None:
        return dict(given)
    name = f"USERTURN_{backend.upper()}_ARGS"
    text = os.environ.get(name, "").strip()
    if not text:
        return {}
    try:
        value = parse_json(text)
    except ValueError as exc:  # not JSON, or nested too deep to read
        raise ModelError(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ModelError(f"{name} must be a JSON object, not {type(value).__name__}")
    return value


def load_template(spec: str, tokenizer: str | None = None) -> ChatTemplate:
    """The chat template of a model, without loading its weights. ``openai/MODEL`` takes it from
    ``tokenizer`` (a local folder, embedded name or hub id; default MODEL), as its backend does."""
    return engine_of(spec).template(spec, tokenizer)


def _no_tokenizer(spec: str, tokenizer: str | None) -> None:
    if tokenizer is not None:
        raise ModelError("--tokenizer is for openai/MODEL models: other models bring their own")


def _openai_template(spec: str, tokenizer: str | None) -> ChatTemplate:
    from userturn.backends.openai import load_tokenizer

    loaded, _ = load_tokenizer(tokenizer or spec.split("/", 1)[1])
    return ChatTemplate.from_tokenizer(loaded, spec)


def _fake_template(spec: str, tokenizer: str | None) -> ChatTemplate:
    _no_tokenizer(spec, tokenizer)
    from userturn.backends.fake import fake_template

    return fake_template(spec)


def _gguf_template(spec: str, tokenizer: str | None) -> ChatTemplate:
    _no_tokenizer(spec, tokenizer)
    from userturn.backends.llamacpp import read_gguf_template

    return read_gguf_template(resolve_model(spec).path, spec)


def _tokenizer_template(spec: str, tokenizer: str | None) -> ChatTemplate:
    """The template of a model folder or hub id, from its tokenizer (transformers and vLLM)."""
    _no_tokenizer(spec, tokenizer)
    from transformers import AutoTokenizer

    try:
        loaded = AutoTokenizer.from_pretrained(resolve_model(spec).path)
    except OSError as exc:
        raise ModelError(f"cannot load the tokenizer of {spec!r}: {str(exc).splitlines()[0]}") from exc
    return ChatTemplate.from_tokenizer(loaded, spec)


OPENAI = "openai"
# The one table of engines, by spec prefix. Every prefix but openai/ is also one that
# ``resolve_model`` reads (``models.BACKENDS``), since those name a model to find here.
ENGINES: Mapping[str, Engine] = {
    OPENAI: Engine(_openai_backend, _openai_template),
    "transformers": Engine(_transformers_backend, _tokenizer_template),
    "vllm": Engine(_vllm_backend, _tokenizer_template),
    "llamacpp": Engine(_llamacpp_backend, _gguf_template),
    "fake": Engine(_fake_backend, _fake_template),
}
