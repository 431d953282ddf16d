"""The transformers backend: left-padded batches through ``model.generate``.

Sampling draws each row's token from a uniform number that is a hash of the row's seed and the
step, computed for the whole batch at once on the model's device (see :mod:`userturn.backends.sampling`).
A row's sample therefore does not depend on which other requests share its batch, so a resumed
run (different batches) reproduces the samples of an uninterrupted one, and sampling costs no
per-row work: on a GPU, one small kernel chain per step instead of a launch per row.
"""

from __future__ import annotations

from typing import Any, Sequence

from userturn.backends.batching import CPU_BATCH, BatchSize
from userturn.backends.models import ModelRef
from userturn.backends.sampling import SeededSampler
from userturn.backends.turns import as_list, finish_turn, specials_longest_first, split_stops
from userturn.chat.render import ChatTemplate, prompt_token_ids
from userturn.errors import ModelError
from userturn.records import Generation, GenerationParams, Request

AUTO_START = 256  # the first batch --batch-size auto tries on a GPU


class TransformersBackend:
    """``batch_size="auto"``: on a GPU, batches start at ``auto_start`` prompts and halve each
    time one runs out of memory, for the rest of the run (the size found is said once); on the
    CPU, where memory is rarely what limits a batch, it is CPU_BATCH. ``auto_start`` given
    searches on any device.

    The tokenizer (the chat template, the keys of every generation) loads now; the weights on
    first use, so a finished run re-run, which generates nothing, never loads them
    (``load_seconds``: the time they took, which the run counts as its model load)."""

    def __init__(self, ref: ModelRef, *, batch_size: BatchSize = CPU_BATCH,
                 device: str | None = None, trust_remote_code: bool = False,
                 auto_start: int | None = None) -> None:
        import torch
        from transformers import AutoConfig, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own bars report progress; theirs interleave
        self.spec, self.revision = ref.spec, ref.revision
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        on_gpu = self.device.startswith("cuda")
        # While searching, a batch that runs out of memory is halved rather than failed.
        self.searching = batch_size == "auto" and (on_gpu or auto_start is not None)
        if self.searching:
            self.batch_size = auto_start or AUTO_START
        else:
            self.batch_size = CPU_BATCH if batch_size == "auto" else int(batch_size)
        self._batch_said = not self.searching
        self.chunk_size = self.batch_size
        self._ref, self._trust_remote_code = ref, trust_remote_code
        self._model: Any = None
        self.load_seconds = 0.0
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(ref.path, trust_remote_code=trust_remote_code)
            config = AutoConfig.from_pretrained(ref.path, trust_remote_code=trust_remote_code)
        except OSError as exc:
            raise ModelError(f"cannot load model {ref.spec!r}: {str(exc).splitlines()[0]}") from exc
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.template = ChatTemplate.from_tokenizer(self.tokenizer, ref.spec)
        self._special = specials_longest_first(self.tokenizer.all_special_tokens)
        # The model's context: a prompt that does not fit fails alone, a budget that runs past it
        # is clamped to what is left (once said).
        self.context_length: int | None = getattr(config, "max_position_embeddings", None)
        self._clamp_warned = False

    @property
    def model(self) -> Any:
        """The weights, loaded on first use."""
        if self._model is None:
            import time

            import torch
            from transformers import AutoModelForCausalLM

            start = time.perf_counter()
            try:
                self._model = AutoModelForCausalLM.from_pretrained(
                    self._ref.path, dtype=torch.float32 if self.device == "cpu" else "auto",
                    trust_remote_code=self._trust_remote_code,
                ).to(self.device).eval()
            except OSError as exc:
                raise ModelError(f"cannot load model {self._ref.spec!r}: "
                                 f"{str(exc).splitlines()[0]}") from exc
            self.load_seconds += time.perf_counter() - start
        return self._model

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        results: list[Generation | None] = [None] * len(requests)
        # A batch shares decoding parameters and stop markers; keep the caller's order within.
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault((request.params, request.stop), []).append(index)
        for (params, stop), indices in groups.items():
            start = 0
            while start < len(indices):
                batch = indices[start:start + self.batch_size]
                try:
                    outputs = self._generate_batch([requests[i] for i in batch], params, stop)
                except _OutOfMemory as exc:  # only while searching, and only batches above 1
                    self._halve(len(batch), exc.__cause__)
                    continue
                self._say_batch_size(len(batch))
                for index, output in zip(batch, outputs):
                    results[index] = output
                start += len(batch)
        return [r for r in results if r is not None]

    def _halve(self, tried: int, error: BaseException | None) -> None:
        """A batch of ``tried`` prompts ran out of memory: every batch from now on is at most
        half of it."""
        import warnings

        import torch

        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()  # what the failed batch held
        self.batch_size = max(1, min(self.batch_size, tried) // 2)
        warnings.warn(f"{self.spec}: --batch-size auto: a batch of {tried} prompts ran out of "
                      f"memory ({type(error).__name__}); trying {self.batch_size}",
                      stacklevel=3)

    def _say_batch_size(self, fitted: int) -> None:
        """Said once, when the search has its answer: a full batch fitted."""
        if not self._batch_said and fitted == self.batch_size:
            import warnings

            self._batch_said = True
            warnings.warn(f"{self.spec}: --batch-size auto: batches of {self.batch_size} prompts "
                          f"fit on {self.device}", stacklevel=3)

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
                if self.searching and len(fitting) > 1 and _out_of_memory(exc):
                    raise _OutOfMemory() from exc
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

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        """log P(option | prompt) of each option (a local judge's verdict: backends/options.py)."""
        if getattr(self, "_options", None) is None:
            from userturn.backends.options import TransformersOptions

            self._options = TransformersOptions(
                self.model, self.tokenizer, lambda text: prompt_token_ids(self.tokenizer, text),
                self.device, self._check_fits)
        return self._options.score_options(prompt, options, whole=whole)

    def _check_fits(self, ids: Sequence[int]) -> None:
        from userturn.backends.options import OPTION_ROOM

        if self.context_length is not None and len(ids) + OPTION_ROOM > self.context_length:
            raise ValueError(f"the prompt has {len(ids)} tokens: more than the model's "
                             f"context of {self.context_length} leaves room for")


class _OutOfMemory(Exception):
    """A batch ran out of memory while --batch-size auto searches: halve it and go again."""


def _out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, (torch.OutOfMemoryError, MemoryError))


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

