"""The transformers backend: left-padded batches through ``model.generate``.

Sampling draws each row's token from a uniform number that is a hash of the row's seed and the
step, computed for the whole batch at once on the model's device (see :mod:`userturn.backends.sampling`).
A row's sample therefore does not depend on which other requests share its batch, so a resumed
run (different batches) reproduces the samples of an uninterrupted one, and sampling costs no
per-row work: on a GPU, one small kernel chain per step instead of a launch per row.
"""

from __future__ import annotations

from typing import Any, Sequence

from userturn.backends.models import ModelRef
from userturn.backends.sampling import SeededSampler
from userturn.backends.turns import as_list, finish_turn, specials_longest_first, split_stops
from userturn.chat.render import ChatTemplate, prompt_token_ids
from userturn.errors import ModelError
from userturn.records import Generation, GenerationParams, Request


class TransformersBackend:
    def __init__(self, ref: ModelRef, *, batch_size: int = 8, device: str | None = None,
                 trust_remote_code: bool = False) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own bars report progress; theirs interleave
        self.spec, self.revision, self.batch_size = ref.spec, ref.revision, batch_size
        self.chunk_size = batch_size
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(ref.path, trust_remote_code=trust_remote_code)
            self.model = AutoModelForCausalLM.from_pretrained(
                ref.path, dtype=torch.float32 if self.device == "cpu" else "auto",
                trust_remote_code=trust_remote_code,
            ).to(self.device).eval()
        except OSError as exc:
            raise ModelError(f"cannot load model {ref.spec!r}: {str(exc).splitlines()[0]}") from exc
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.template = ChatTemplate.from_tokenizer(self.tokenizer, ref.spec)
        self._special = specials_longest_first(self.tokenizer.all_special_tokens)
        # The model's context: a prompt that does not fit fails alone, a budget that runs past it
        # is clamped to what is left (once said).
        self.context_length: int | None = getattr(self.model.config, "max_position_embeddings",
                                                  None)
        self._clamp_warned = False

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        results: list[Generation | None] = [None] * len(requests)
        # A batch shares decoding parameters and stop markers; keep the caller's order within.
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault((request.params, request.stop), []).append(index)
        for (params, stop), indices in groups.items():
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start:start + self.batch_size]
                outputs = self._generate_batch([requests[i] for i in batch], params, stop)
                for index, output in zip(batch, outputs):
                    results[index] = output
        return [r for r in results if r is not None]

    def _generate_batch(self, requests: Sequence[Request], params: GenerationParams,
                        stop: tuple[str, ...]) -> list[Generation]:
        """One batch; a prompt longer than the context fails alone, and a batch that fails as a
        whole (out of memory) is retried one request at a time, so only the culprit fails."""
        encoded = [prompt_token_ids(self.tokenizer, r.prompt) for r in requests]
        context = self.context_length
        results: list[Generation | None] = [None] * len(requests)
        fitting = []
        for index, ids in enumerate(encoded):
            if context is not None and len(ids) >= context:
                results[index] = Generation(
                    "", "", "error", len(ids), 0, f"the prompt has {len(ids)} tokens: more than "
                    f"the model's context of {context} leaves room for")
            else:
                fitting.append(index)
        if fitting:
            try:
                outputs = self._run([requests[i] for i in fitting], [encoded[i] for i in fitting],
                                    params, stop)
            except (RuntimeError, ValueError, MemoryError) as exc:
                if len(fitting) == 1:
                    (index,) = fitting
                    results[index] = Generation("", "", "error", len(encoded[index]), 0,
                                                f"{type(exc).__name__}: {exc}")
                    outputs = []
                else:  # stored per request, counted, retried on re-run
                    outputs = [self._generate_batch([requests[i]], params, stop)[0]
                               for i in fitting]
            for index, output in zip(fitting, outputs):
                results[index] = output
        return [r for r in results if r is not None]

    def _run(self, requests: Sequence[Request], encoded: list[list[int]],
             params: GenerationParams, stop: tuple[str, ...]) -> list[Generation]:
        import torch

        batch = self.tokenizer.pad({"input_ids": encoded}, return_tensors="pt").to(self.device)
        stop_ids, stop_strings = self._split_stops(stop)
        budget = params.max_tokens
        if self.context_length is not None:
            budget = min(budget, self.context_length - batch["input_ids"].shape[1])
            if budget < params.max_tokens and not self._clamp_warned:
                import warnings

                self._clamp_warned = True
                warnings.warn(f"{self.spec}: a token budget of {params.max_tokens} runs past the "
                              f"model's context of {self.context_length}: generating at most "
                              "what the context leaves", stacklevel=2)
        kwargs: dict[str, Any] = {}
        if not params.greedy:
            kwargs["logits_processor"] = [
                SeededSampler(params, [r.seed for r in requests], self.device,
                               prompt_width=batch["input_ids"].shape[1])]
        if stop_strings:
            kwargs["stopping_criteria"] = [_StopOnStrings(self.tokenizer, stop_strings, batch["input_ids"].shape[1])]
        config = self.model.generation_config.__class__.from_dict(
            {**self.model.generation_config.to_dict(), "do_sample": False, "temperature": None,
             "top_p": None, "top_k": None, "max_new_tokens": budget,
             "max_length": None, "eos_token_id": stop_ids,
             "pad_token_id": self.tokenizer.pad_token_id}
        )
        with torch.inference_mode():
            output = self.model.generate(**batch, generation_config=config, **kwargs)
        new_tokens = output[:, batch["input_ids"].shape[1]:].tolist()
        return [self._finish(tokens, len(ids), stop, set(stop_ids))
                for tokens, ids in zip(new_tokens, encoded)]

    def _split_stops(self, stop: tuple[str, ...]) -> tuple[list[int], list[str]]:
        eos = [*as_list(self.model.generation_config.eos_token_id), self.tokenizer.eos_token_id]
        return split_stops(stop, self._encode, eos, self._special)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _finish(self, tokens: list[int], prompt_tokens: int, stop: tuple[str, ...],
                stop_ids: set[int]) -> Generation:
        return finish_turn(tokens, prompt_tokens, stop, stop_ids, self._decode, self._special,
                           self.tokenizer.pad_token_id)

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)


class _StopOnStrings:
    """Stops a row once its generated text contains a multi-token stop marker."""

    def __init__(self, tokenizer: Any, markers: Sequence[str], prompt_length: int) -> None:
        self.tokenizer, self.markers, self.prompt_length = tokenizer, list(markers), prompt_length
        self.window = 4 + max(len(tokenizer(m, add_special_tokens=False)["input_ids"]) for m in markers)

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        tails = input_ids[:, max(self.prompt_length, input_ids.shape[1] - self.window):]
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=False)
        done = [any(m in text for m in self.markers) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

