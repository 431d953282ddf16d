"""The transformers backend: rows refilled as turns finish (:mod:`userturn.backends.refill`), or
left-padded static batches through ``model.generate``.

A call's prompts form one queue: at most ``batch_size`` rows are in flight, and a row whose turn
ends hands its slot to the next prompt, whatever their decoding parameters and stop markers. The
static batches remain for a model whose cache the loop cannot cut and join, and as the reference
the loop is checked against (greedy turns, seeded samples: tests/test_rows_busy.py).

Sampling draws each row's token from a uniform number that is a hash of the row's seed and the
step, computed for the whole batch at once on the model's device (see :mod:`userturn.backends.sampling`).
A row's sample therefore does not depend on which other requests share its batch, so a resumed
run (different batches) reproduces the samples of an uninterrupted one, and sampling costs no
per-row work: on a GPU, one small kernel chain per step instead of a launch per row.
"""

from __future__ import annotations

from statistics import median
from typing import Any, Literal, Sequence

from userturn.backends.batching import CPU_BATCH, CPU_WIDTHS, QUEUE_WIDTHS, BatchSize, choose_width
from userturn.backends.models import ModelRef
from userturn.backends.refill import Row, generate_rows, refills, row_rates
from userturn.backends.sampling import SeededSampler
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
from userturn.records import Generation, GenerationParams, Request

AUTO_START = 256  # the first batch --batch-size auto tries on a GPU
Batching = Literal["refill", "static"]


class TransformersBackend:
    """``batching``: ``refill`` (the default) keeps ``batch_size`` rows busy, refilled from
    calls (units) of QUEUE_WIDTHS batches' worth of prompts; ``static`` runs left-padded batches
    of ``batch_size`` through ``model.generate``, each as long as its longest turn.

    ``batch_size="auto"``: on a GPU, batches start at ``auto_start`` prompts and halve each
    time one runs out of memory, for the rest of the run (the size found is said once); on the
    CPU, where memory is rarely what limits a batch, the refill engine measures a step at each of
    CPU_WIDTHS rows on first use and takes the narrowest within NEAR_BEST of the best rate (said
    once); the static engine takes CPU_BATCH. ``auto_start`` given searches on any device.

    The tokenizer (the chat template, the keys of every generation) loads now; the weights on
    first use, so a finished run re-run, which generates nothing, never loads them
    (``load_seconds``: the time they took, which the run counts as its model load)."""

    def __init__(self, ref: ModelRef, *, batch_size: BatchSize = CPU_BATCH,
                 device: str | None = None, trust_remote_code: bool = False,
                 auto_start: int | None = None, batching: Batching = "refill") -> None:
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
        # On the CPU, the refill engine measures its width when the weights are there.
        self.measuring = batch_size == "auto" and not self.searching and batching == "refill"
        self._batch_said = not self.searching
        self.batching: Batching = batching
        # Units hold QUEUE_WIDTHS batches of the widest the measurement may choose: the width
        # comes when the weights do, the units are cut before.
        widest = max(CPU_WIDTHS) if self.measuring else self.batch_size
        self.chunk_size = widest * QUEUE_WIDTHS if batching == "refill" else self.batch_size
        self._can_refill: bool | None = None
        self._logits_processors: Any = None
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
        # Read without the weights: a finished run's keys are made without loading them.
        eos = generation_config_file(ref.path).get("eos_token_id",
                                                   getattr(config, "eos_token_id", None))
        self.end_texts = end_texts([*as_list(eos), self.tokenizer.eos_token_id],
                                   lambda i: self.tokenizer.decode([i]))
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
        if not requests:
            return []
        if self.batching == "refill" and self._refills():
            return self._complete_refilled(requests)
        return self._complete_static(requests)

    def _refills(self) -> bool:
        if self._can_refill is None:
            self._can_refill = refills(self.model)
        return self._can_refill

    def _complete_refilled(self, requests: Sequence[Request]) -> list[Generation]:
        """Every request in one queue, ``batch_size`` rows in flight; a prompt longer than the
        context fails alone."""
        encoded = [prompt_token_ids(self.tokenizer, r.prompt) for r in requests]
        results: list[Generation | None] = [self._too_long(ids) for ids in encoded]
        fitting = [i for i, result in enumerate(results) if result is None]
        rows = [self._row(requests[i], encoded[i]) for i in fitting]
        if rows:
            self._measure_width(rows)
            for index, row, out in zip(fitting, rows, self._generate_rows(rows)):
                results[index] = (
                    Generation("", "", "error", len(row.ids), 0, out) if isinstance(out, str)
                    else self._finish(out, len(row.ids), requests[index], set(row.stop_ids)))
        return [r for r in results if r is not None]

    def _generate_rows(self, rows: list[Row]) -> list[list[int] | str]:
        """Each row's tokens, or the error it failed with. While searching, running out of
        memory halves the width and starts again; any other failure of several rows is retried
        one row at a time, so only the culprit fails."""
        while True:
            try:
                out: list[list[int] | str] = list(generate_rows(
                    self.model, rows, self.batch_size, decode=self._decode,
                    pad_id=self.tokenizer.pad_token_id, processors=self._processors()))
            except (RuntimeError, ValueError, MemoryError) as exc:
                in_flight = min(self.batch_size, len(rows))
                if self.searching and in_flight > 1 and _out_of_memory(exc):
                    self._halve(in_flight, exc)
                    continue
                if len(rows) == 1:
                    return [f"{type(exc).__name__}: {exc}"]
                return [self._generate_rows([row])[0] for row in rows]
            self._say_batch_size(min(self.batch_size, len(rows)))
            return out

    def _row(self, request: Request, ids: list[int]) -> Row:
        stop_ids, strings = self._split_stops(request.stop, request.past_end)
        window = 4 + max((len(self._encode(m)) for m in strings), default=0)
        params = request.params
        return Row(tuple(ids), self._budget(params.max_tokens, len(ids)),
                   0.0 if params.greedy else params.temperature, params.top_p, request.seed,
                   frozenset(stop_ids), tuple(strings), window)

    def _processors(self) -> Any:
        """The logits processors ``generate`` applies for this backend's settings (the model's
        generation_config: suppress_tokens, ...), so refilled rows choose as static batches do.
        ``_get_logits_processor`` is private to transformers, and the one place that list is
        made (its own continuous batching calls it too)."""
        if self._logits_processors is None:
            self._logits_processors = self.model._get_logits_processor(
                generation_config=self._generation_config(1, []), device=self.device)
        return self._logits_processors

    def _measure_width(self, rows: Sequence[Row]) -> None:
        """--batch-size auto on the CPU: the width from a measurement of this model at the
        call's lengths (once, said once)."""
        if not self.measuring:
            return
        import warnings

        self.measuring = False
        length = int(median(len(r.ids) for r in rows) + median(r.budget for r in rows) // 2)
        rates = row_rates(self.model, CPU_WIDTHS, length)
        self.batch_size = choose_width(rates)
        measured = ", ".join(f"{width}: {rate:.0f}" for width, rate in rates.items())
        warnings.warn(f"{self.spec}: --batch-size auto: {self.batch_size} rows at once on "
                      f"{self.device} (row-tokens/s measured at {length} tokens a row, by "
                      f"width: {measured})", stacklevel=3)

    def _complete_static(self, requests: Sequence[Request]) -> list[Generation]:
        results: list[Generation | None] = [None] * len(requests)
        # A batch shares decoding parameters, stop markers and whether it ends at end of
        # sequence; keep the caller's order within.
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault((request.params, request.stop, request.past_end), []).append(index)
        for (params, stop, _), indices in groups.items():
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
        results: list[Generation | None] = [self._too_long(ids) for ids in encoded]
        fitting = [i for i, result in enumerate(results) if result is None]
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

    def _too_long(self, ids: Sequence[int]) -> Generation | None:
        """The error of a prompt that leaves no room in the model's context, else None."""
        context = self.context_length
        if context is None or len(ids) < context:
            return None
        return Generation("", "", "error", len(ids), 0, f"the prompt has {len(ids)} tokens: "
                          f"more than the model's context of {context} leaves room for")

    def _budget(self, max_tokens: int, prompt_width: int) -> int:
        """``max_tokens``, clamped to what the context leaves after ``prompt_width`` (said
        once)."""
        if self.context_length is None or prompt_width + max_tokens <= self.context_length:
            return max_tokens
        if not self._clamp_warned:
            import warnings

            self._clamp_warned = True
            warnings.warn(f"{self.spec}: a token budget of {max_tokens} runs past the "
                          f"model's context of {self.context_length}: generating at most "
                          "what the context leaves", stacklevel=3)
        return self.context_length - prompt_width

    def _generation_config(self, budget: int, stop_ids: list[int]) -> Any:
        """The model's generation config, decoding switched to ours: greedy ``generate`` (a
        sampled row's draw is made by SeededSampler), ``budget`` new tokens, ``stop_ids``."""
        return self.model.generation_config.__class__.from_dict(
            {**self.model.generation_config.to_dict(), "do_sample": False, "temperature": None,
             "top_p": None, "top_k": None, "max_new_tokens": budget,
             "max_length": None, "eos_token_id": stop_ids,
             "pad_token_id": self.tokenizer.pad_token_id})

    def _run(self, requests: Sequence[Request], encoded: list[list[int]],
             params: GenerationParams, stop: tuple[str, ...]) -> list[Generation]:
        import torch

        batch = self.tokenizer.pad({"input_ids": encoded}, return_tensors="pt").to(self.device)
        past_end = requests[0].past_end  # one value per batch (_complete_static)
        stop_ids, stop_strings = self._split_stops(stop, past_end)
        budget = self._budget(params.max_tokens, batch["input_ids"].shape[1])
        kwargs: dict[str, Any] = {}
        if not params.greedy:
            kwargs["logits_processor"] = [
                SeededSampler(params, [r.seed for r in requests], self.device,
                               prompt_width=batch["input_ids"].shape[1])]
        on_strings = None
        if stop_strings:
            on_strings = _StopOnStrings(self.tokenizer, stop_strings, batch["input_ids"].shape[1])
            kwargs["stopping_criteria"] = [on_strings]
        config = self._generation_config(budget, stop_ids)
        with torch.inference_mode():
            output = self.model.generate(**batch, generation_config=config, **kwargs)
        new_tokens = output[:, batch["input_ids"].shape[1]:].tolist()
        if past_end and on_strings is not None:
            # A row that said its stop string is padded while the others go on; past the end,
            # the pad id may be a token the model wrote (often the EOS), so the row is cut where
            # it stopped rather than stripped of trailing pads.
            new_tokens = [tokens[:end] if end else tokens
                          for tokens, end in zip(new_tokens, on_strings.ended)]
        return [self._finish(tokens, len(ids), request, set(stop_ids))
                for tokens, ids, request in zip(new_tokens, encoded, requests)]

    def _split_stops(self, stop: tuple[str, ...],
                     past_end: bool = False) -> tuple[list[int], list[str]]:
        """(stop ids, stop strings): the markers', and every end-of-sequence id (the generation
        config's and the tokenizer's) unless the request goes on past them."""
        eos = [] if past_end else [*as_list(self.model.generation_config.eos_token_id),
                                   self.tokenizer.eos_token_id]
        return split_stops(stop, self._encode, eos, self._special)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _finish(self, tokens: list[int], prompt_tokens: int, request: Request,
                stop_ids: set[int]) -> Generation:
        # Trailing pads are a static batch's filling, except past the end of sequence, where
        # the pad id may be a token the model wrote (and where _run cuts the rows itself).
        pad = None if request.past_end else self.tokenizer.pad_token_id
        return finish_turn(tokens, prompt_tokens, request.stop, stop_ids, self._decode,
                           self._special, pad)

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
        self.ended: list[int | None] = []  # per row: its new tokens when it first said a marker

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        tails = input_ids[:, max(self.prompt_length, input_ids.shape[1] - self.window):]
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=False)
        done = [any(m in text for m in self.markers) for text in texts]
        if not self.ended:
            self.ended = [None] * len(done)
        written = input_ids.shape[1] - self.prompt_length
        self.ended = [end if end is not None or not said else written
                      for end, said in zip(self.ended, done)]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

