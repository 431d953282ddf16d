"""The transformers backend on the tiny real model: order, budgets, stops, seeds, batching."""

from __future__ import annotations

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
