"""The transformers backend on the tiny real model: order, budgets, stops, seeds, batching."""

from __future__ import annotations

import pytest
import torch

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


def test_batch_size_auto_is_the_cpu_batch_on_the_cpu():
    backend = TransformersBackend(resolve_model("tiny"), batch_size="auto", device="cpu")
    assert (backend.batch_size, backend.chunk_size, backend.searching) == (8, 8, False)


def test_batch_size_auto_halves_on_out_of_memory_and_keeps_what_fit(tiny_backend):
    """The search with an injected fault: any batch above 3 prompts runs out of memory. The
    batch halves (10 -> 5 -> 2), says so, keeps 2 for the rest of the run, and every prompt
    gets the text it gets in any other batch."""
    backend = TransformersBackend(resolve_model("tiny"), batch_size="auto", device="cpu",
                                  auto_start=16)
    sizes: list[int] = []
    generate = backend.model.generate

    def tight(*args, **kwargs):  # type: ignore[no-untyped-def]
        rows = kwargs["input_ids"].shape[0]
        sizes.append(rows)
        if rows > 3:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: {rows} rows)")
        return generate(*args, **kwargs)

    backend.model.generate = tight
    batch = requests(backend, GREEDY, range(5))  # 10 requests
    with pytest.warns(UserWarning) as said:
        got = backend.complete(batch)
    assert [g.error for g in got] == [None] * 10
    assert [g.text for g in got] == [g.text for g in tiny_backend.complete(batch)]
    assert sizes == [10, 5, 2, 2, 2, 2, 2]
    messages = [str(w.message) for w in said]
    assert messages == [
        "tiny: --batch-size auto: a batch of 10 prompts ran out of memory (OutOfMemoryError); "
        "trying 5",
        "tiny: --batch-size auto: a batch of 5 prompts ran out of memory (OutOfMemoryError); "
        "trying 2",
        "tiny: --batch-size auto: batches of 2 prompts fit on cpu"]
    sizes.clear()
    backend.complete(requests(backend, HOT, [1, 2, 3]))  # the next call starts from what fit
    assert sizes == [2, 2, 2] and backend.batch_size == 2


def test_a_fixed_batch_that_runs_out_of_memory_fails_only_its_culprit(tiny_backend):
    """Without the search, a batch out of memory is retried one prompt at a time, as any
    failed batch is: here the one long prompt fails alone, stored as data."""
    backend = TransformersBackend(resolve_model("tiny"), batch_size=4, device="cpu")
    generate = backend.model.generate
    long_prompt = requests(backend, GREEDY, [0], answers=("36 " * 40,))[0]

    def tight(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs["input_ids"].shape[1] > 100:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return generate(*args, **kwargs)

    backend.model.generate = tight
    got = backend.complete([*requests(backend, GREEDY, [0]), long_prompt])
    assert [g.error is None for g in got] == [True, True, False]
    assert "OutOfMemoryError" in (got[2].error or "")
