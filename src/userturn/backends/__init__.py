"""The Backend seam: a batch of raw prompts in, one generation per request out, in order.

A backend that writes user turns must accept a raw prompt (we render it ourselves, with the
model's own template). Heavy libraries are imported only inside their backend module.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ..errors import ModelError
from ..models import resolve_model
from ..records import Generation, Request
from ..render import ChatTemplate


class Backend(Protocol):
    spec: str  # the model spec the user wrote, e.g. "smollm2"
    revision: str  # what changes the weights changes this
    template: ChatTemplate  # the model's own chat template
    chunk_size: int  # how many requests to hand over at once (results are stored per chunk)

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        """One Generation per request, in order. A failed request is a Generation with error."""
        ...


def load_backend(spec: str, *, batch_size: int = 8, device: str | None = None,
                 base_url: str | None = None, tokenizer: str | None = None,
                 prompt_as: str = "tokens") -> Backend:
    """A backend by spec: ``openai/MODEL`` is a server's /v1/completions (``base_url``, with the
    tokenizer and template loaded locally from ``tokenizer``, default MODEL); anything else runs
    in process through transformers."""
    if spec.startswith("openai/"):
        if not base_url:
            raise ModelError(f"{spec} needs the server's address: --base-url "
                             "http://HOST:PORT/v1 (an OpenAI-compatible /v1/completions server)")
        from .openai import OpenAICompletionsBackend

        return OpenAICompletionsBackend(spec.split("/", 1)[1], base_url=base_url,
                                        tokenizer=tokenizer, prompt_as=prompt_as)
    ref = resolve_model(spec)
    if ref.backend == "fake":
        raise ModelError("fake/ models are scripted in tests: construct ScriptedBackend directly")
    from .hf import TransformersBackend

    return TransformersBackend(ref, batch_size=batch_size, device=device)


def load_template(spec: str) -> ChatTemplate:
    """The chat template of a model, without loading its weights."""
    ref = resolve_model(spec)
    if ref.backend == "fake":
        raise ModelError("fake/ models have no template to load")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(ref.path)
    except OSError as exc:
        raise ModelError(f"cannot load the tokenizer of {spec!r}: {str(exc).splitlines()[0]}") from exc
    return ChatTemplate.from_tokenizer(tokenizer, spec)
