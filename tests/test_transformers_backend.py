"""The transformers backend on the tiny real model: order, budgets, stops, seeds, batching.
The refill engine against the static batches it replaced: tests/test_rows_busy.py."""

from __future__ import annotations

import functools

import pytest
import torch

from userturn.backends.batching import CPU_WIDTHS
from userturn.backends.hf import TransformersBackend
from userturn.backends.models import resolve_model
from userturn.chat.render import render_user_turn
from userturn.records import GenerationParams, Request

GREEDY = GenerationParams(temperature=0.0, max_tokens=12)
HOT = GenerationParams(temperature=1.0, max_tokens=12)


def probe_prompt(backend, answer: str):
    messages = [{"role": "user", "content": "Tom has 3 boxes of 12 pencils. How many pencils?"},
                {"role": "assistant", "content": answer}]
    return render_user_turn(backend.template, messages)


def requests(backend, params, seeds, answers=("He has 36.", "The total is 36 pencils.")):
    out = []
    for answer in answers:
        prompt = probe_prompt(backend, answer)
        out.extend(Request(prompt.text, params, prompt.stop, seed) for seed in seeds)
    return out


def test_greedy_is_deterministic_and_order_is_kept(tiny_backend):
    batch = requests(tiny_backend, GREEDY, [0])
    first, second = tiny_backend.complete(batch), tiny_backend.complete(list(reversed(batch)))
    assert [g.text for g in first] == [g.text for g in reversed(second)]
    alone = [tiny_backend.complete([r])[0] for r in batch]
    assert [g.text for g in alone] == [g.text for g in first]


def test_max_tokens_bounds_the_turn_and_reports_length(tiny_backend):
    (generation,) = tiny_backend.complete(requests(tiny_backend, GREEDY, [0])[:1])
    assert generation.finish_reason == "length"
    assert generation.completion_tokens == GREEDY.max_tokens
    assert generation.prompt_tokens > 20 and generation.error is None


def test_sampling_is_reproducible_per_seed_whatever_the_batch(tiny_backend):
    batch = requests(tiny_backend, HOT, [11, 12, 13])
    together = [g.text for g in tiny_backend.complete(batch)]
    again = [g.text for g in tiny_backend.complete(batch)]
    singly = [tiny_backend.complete([r])[0].text for r in batch]
    assert together == again == singly
    assert len(set(together[:3])) == 3  # different seeds, different samples


def test_stop_marker_cuts_the_turn_and_raw_text_keeps_it(tiny_backend):
    base = requests(tiny_backend, GREEDY, [0])[0]
    (free,) = tiny_backend.complete([base])
    words = free.text.split()
    marker = words[len(words) // 2]  # a string the model is known to produce greedily
    stopped = Request(base.prompt, base.params, (marker,), 0)
    (cut,) = tiny_backend.complete([stopped])
    assert cut.finish_reason == "stop"
    assert marker not in cut.text and cut.raw_text.endswith(marker)
    assert free.text.startswith(cut.text)
    assert cut.completion_tokens < free.completion_tokens


def test_user_turn_prompt_has_bos_once_and_ends_in_the_user_header(tiny_backend):
    prompt = probe_prompt(tiny_backend, "He has 36.")
    assert prompt.text.endswith("He has 36.<|im_end|>\n<|im_start|>user\n")
    assert prompt.stop == ("<|im_end|>", "<|im_start|>assistant")


def test_batch_size_auto_on_the_cpu_measures_the_width_on_first_use_and_says_it(tiny_backend):
    """Units are 8 batches' worth of prompts (the refill queue) of the widest width measured, from
    the start; the width is measured when the weights are there, said once, and the turns are
    those of any width."""
    backend = TransformersBackend(resolve_model("tiny"), batch_size="auto", device="cpu")
    assert (backend.batch_size, backend.chunk_size, backend.searching) == (8, 256, False)
    batch = requests(backend, GREEDY, [0])
    with pytest.warns(UserWarning, match=r"^tiny: --batch-size auto: \d+ rows at once on cpu "
                      r"\(row-tokens/s measured at \d+ tokens a row, by width: 4: \d+, 8: \d+, "
                      r"16: \d+, 32: \d+\)$"):
        got = backend.complete(batch)
    assert backend.batch_size in CPU_WIDTHS and backend.chunk_size == 256
    assert [g.text for g in got] == [g.text for g in tiny_backend.complete(batch)]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        backend.complete(batch)


def test_batch_size_auto_on_the_cpu_with_static_batches_is_the_cpu_batch():
    backend = TransformersBackend(resolve_model("tiny"), batch_size="auto", device="cpu",
                                  batching="static")
    assert (backend.batch_size, backend.chunk_size, backend.measuring) == (8, 8, False)


def fail_wide_forwards(backend: TransformersBackend, too_wide) -> list[int]:  # type: ignore[no-untyped-def]
    """The model's forward runs out of memory where ``too_wide(input_ids)``; returns the rows of
    every forward tried (its signature kept: the backend reads it)."""
    forward = backend.model.forward
    rows: list[int] = []

    @functools.wraps(forward)
    def tight(*args, **kwargs):  # type: ignore[no-untyped-def]
        ids = kwargs["input_ids"]
        rows.append(ids.shape[0])
        if too_wide(ids):
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: {tuple(ids.shape)})")
        return forward(*args, **kwargs)

    backend.model.forward = tight
    return rows


def test_batch_size_auto_halves_on_out_of_memory_and_keeps_what_fit(tiny_backend):
    """The search with an injected fault: any forward of more than 3 rows runs out of memory.
    The width halves (10 rows in flight -> 5 -> 2), says so, keeps 2 for the rest of the run,
    and every prompt gets the text it gets in any other batch."""
    backend = TransformersBackend(resolve_model("tiny"), batch_size="auto", device="cpu",
                                  auto_start=16)
    sizes = fail_wide_forwards(backend, lambda ids: ids.shape[0] > 3)
    batch = requests(backend, GREEDY, range(5))  # 10 requests
    with pytest.warns(UserWarning) as said:
        got = backend.complete(batch)
    assert [g.error for g in got] == [None] * 10
    assert [g.text for g in got] == [g.text for g in tiny_backend.complete(batch)]
    assert sizes[1:4] == [10, 5, 2] and max(sizes[3:]) == 2  # sizes[0]: the cache check
    messages = [str(w.message) for w in said]
    assert messages == [
        "tiny: --batch-size auto: a batch of 10 prompts ran out of memory (OutOfMemoryError); "
        "trying 5",
        "tiny: --batch-size auto: a batch of 5 prompts ran out of memory (OutOfMemoryError); "
        "trying 2",
        "tiny: --batch-size auto: batches of 2 prompts fit on cpu"]
    sizes.clear()
    backend.complete(requests(backend, HOT, [1, 2, 3]))  # the next call starts from what fit
    assert sizes[0] == 2 and max(sizes) == 2 and backend.batch_size == 2


def test_a_fixed_batch_that_runs_out_of_memory_fails_only_its_culprit(tiny_backend):
    """Without the search, a batch out of memory is retried one prompt at a time, as any
    failed batch is: here the one long prompt fails alone, stored as data."""
    backend = TransformersBackend(resolve_model("tiny"), batch_size=4, device="cpu")
    long_prompt = requests(backend, GREEDY, [0], answers=("36 " * 40,))[0]
    fail_wide_forwards(backend, lambda ids: ids.shape[1] > 100)
    got = backend.complete([*requests(backend, GREEDY, [0]), long_prompt])
    assert [g.error is None for g in got] == [True, True, False]
    assert "OutOfMemoryError" in (got[2].error or "")
