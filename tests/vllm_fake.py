"""A stand-in for vLLM's in-process API, for tests where vLLM is not installed (CI): ``vllm.LLM``,
``SamplingParams``, ``TokensPrompt`` and ``current_platform``, put in ``sys.modules`` for one test.
It records what the backend asks for and answers in vLLM's documented shapes.

    engine = install_vllm(monkeypatch, stream=ids, prompt_logprob=lambda j, token: -0.1 * j)
    backend = VLLMBackend(resolve_model("tiny"))

The stand-in model writes ``stream`` (token ids) whatever the prompt, and stops as vLLM's
``SamplingParams`` say it does: at the tokenizer's EOS unless ``ignore_eos``, at an id of
``stop_token_ids``, at a stop string (kept in the output, as ``include_stop_str_in_output``
asks), or after ``max_tokens``. With ``prompt_logprobs`` set, a prompt's log-probabilities are
vLLM's list: None for the first token, then one ``{token id: Logprob}`` per token holding the
prompt's own token at ``prompt_logprob(position, token)``.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pytest


@dataclass(frozen=True)
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class SamplingParams:
    """The fields the backend sets, with vLLM's defaults for those it leaves out."""

    def __init__(self, **settings: Any) -> None:
        self.ignore_eos = False
        self.stop: list[str] | None = None
        self.stop_token_ids: list[int] | None = None
        self.max_tokens = 16
        self.prompt_logprobs: int | None = None
        self.skip_special_tokens = True
        self.__dict__.update(settings)


def tokens_prompt(**fields: Any) -> dict[str, Any]:  # vLLM's TokensPrompt is a TypedDict
    return dict(fields)


@dataclass
class StandIn:
    stream: list[int]
    prompt_logprob: Callable[[int, int], float] | None
    calls: list[tuple[list[list[int]], list[SamplingParams]]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def params(self) -> list[SamplingParams]:
        """Every SamplingParams the engine was given, in order."""
        return [p for _, params in self.calls for p in params]


class _LLM:
    def __init__(self, standin: StandIn, model: str, tokenizer: str, **settings: Any) -> None:
        from transformers import AutoTokenizer

        self.standin, self.tokenizer = standin, AutoTokenizer.from_pretrained(tokenizer)
        standin.settings = settings
        config = types.SimpleNamespace(max_model_len=settings.get("max_model_len", 512),
                                       get_vocab_size=lambda: len(self.tokenizer))
        self.llm_engine = types.SimpleNamespace(model_config=config)

    def generate(self, prompts: Sequence[dict[str, Any]],
                 params: SamplingParams | Sequence[SamplingParams],
                 use_tqdm: bool = True) -> list[Any]:
        ids = [list(p["prompt_token_ids"]) for p in prompts]
        if isinstance(params, SamplingParams):  # one for every prompt, as vLLM takes it
            params = [params] * len(ids)
        self.standin.calls.append((ids, list(params)))
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=self._write(p))],
                                      prompt_logprobs=self._prompt_logprobs(prompt, p))
                for prompt, p in zip(ids, params)]

    def _write(self, params: SamplingParams) -> list[int]:
        out: list[int] = []
        for token in self.standin.stream:
            out.append(token)
            text = self.tokenizer.decode(out, skip_special_tokens=params.skip_special_tokens)
            if (len(out) >= params.max_tokens or token in (params.stop_token_ids or ())
                    or (not params.ignore_eos and token == self.tokenizer.eos_token_id)
                    or any(s in text for s in params.stop or ())):
                break
        return out

    def _prompt_logprobs(self, prompt: list[int], params: SamplingParams) -> Any:
        if params.prompt_logprobs is None:
            return None
        score = self.standin.prompt_logprob
        assert score is not None, "the stand-in was given no prompt log-probabilities"
        return [None] + [{token: Logprob(score(j, token), 1)}
                         for j, token in enumerate(prompt) if j > 0]


def install_vllm(monkeypatch: pytest.MonkeyPatch, stream: Sequence[int] = (),
                 prompt_logprob: Callable[[int, int], float] | None = None) -> StandIn:
    """Put the stand-in where ``import vllm`` finds it, for this test only."""
    standin = StandIn(list(stream), prompt_logprob)
    vllm = types.ModuleType("vllm")
    vllm.LLM = lambda **settings: _LLM(standin, **settings)  # type: ignore[attr-defined]
    vllm.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    vllm.sampling_params = types.ModuleType("vllm.sampling_params")  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = tokens_prompt  # type: ignore[attr-defined]
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: True)  # type: ignore[attr-defined]
    for name, module in (("vllm", vllm), ("vllm.inputs", inputs), ("vllm.platforms", platforms),
                         ("vllm.sampling_params", vllm.sampling_params)):
        monkeypatch.setitem(sys.modules, name, module)
    return standin
