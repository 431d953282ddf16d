"""Who speaks next, as log-probabilities: ``score_options`` read at the end of a closed
conversation, on every engine that can read a prompt's continuations.

The tiny real model shows the scores are the model's own (a plain forward pass gives the same
numbers for a role header, an end token, one token or several); an OpenAI-compatible server on
127.0.0.1 with scripted echoed log-probabilities shows the sum taken over the right positions, and
a server that echoes none refused in one line; a stand-in for vLLM's API (tests/vllm_fake.py) shows
the same for its prompt log-probabilities where vLLM is not installed."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from helpers import plain_logprob
from openai_fake import Fail, FakeOpenAI
from vllm_fake import install_vllm

from userturn.backends.fake import ScriptedBackend, probe_script
from userturn.backends.models import resolve_model
from userturn.backends.openai import OpenAICompletionsBackend
from userturn.backends.options import can_score_prompts
from userturn.chat.render import prompt_token_ids
from userturn.errors import ModelError

CONVERSATION = [{"role": "user", "content": "Tom has 3 boxes of 12 pencils. How many pencils?"},
                {"role": "assistant", "content": "He has 36 pencils."}]
# What may come next after the assistant's closed turn, in the tiny model's ChatML: the user's
# header, the assistant's, the end of the text; and a plain word.
NEXT = ("<|im_start|>user\n", "<|im_start|>assistant\n", "<|endoftext|>", " Thanks")


def closed(backend: Any) -> str:
    """The conversation rendered through the end of the assistant's turn, no header opened."""
    return backend.template.render(CONVERSATION)


def encoded(backend: Any, option: str) -> list[int]:
    return backend.tokenizer(option, add_special_tokens=False)["input_ids"]


# --- the tiny real model: the scores are the model's own -----------------------------------------

def test_next_role_scores_equal_a_plain_forward_pass(tiny_backend) -> None:
    prompt = closed(tiny_backend)
    assert prompt.endswith("<|im_end|>\n") and not prompt.endswith("<|im_start|>user\n")
    lengths = [len(encoded(tiny_backend, o)) for o in NEXT]
    assert min(lengths[:2]) > 1 and lengths[2] == 1  # the headers are several tokens
    whole = tiny_backend.score_options(prompt, NEXT, whole=True)
    assert whole == pytest.approx([plain_logprob(tiny_backend, prompt, o) for o in NEXT],
                                  abs=2e-4)
    # By default an option is read as far as it must be to tell it apart: the two headers share
    # <|im_start|> (read whole), the end token is one token, the word is read by its first.
    parts = tiny_backend.score_options(prompt, NEXT)
    word = tiny_backend.tokenizer.decode(encoded(tiny_backend, NEXT[3])[:1])
    assert parts[:3] == pytest.approx(whole[:3], abs=2e-4)
    assert parts[3] == pytest.approx(plain_logprob(tiny_backend, prompt, word), abs=2e-4)
    assert len({round(s, 5) for s in whole}) == len(NEXT)


def test_which_backends_can_score_a_prompt(tiny_backend, openai_scores) -> None:
    backend, _ = openai_scores
    assert can_score_prompts(tiny_backend) and can_score_prompts(backend)
    # The scripted fake scores from its script (the continuation arm's tests run on it); an
    # engine with no scoring seam cannot.
    assert can_score_prompts(ScriptedBackend(probe_script))
    assert not can_score_prompts(object())


# --- an OpenAI-compatible server that echoes prompt log-probabilities ---------------------------

def echoed(position: int, token: int) -> float:
    """The scripted server's log-probability of ``token`` at ``position`` of a prompt."""
    return -(0.01 * position + 0.001 * token)


@pytest.fixture
def openai_scores() -> Iterator[tuple[OpenAICompletionsBackend, FakeOpenAI]]:
    with FakeOpenAI(prompt_logprob=echoed) as server:
        yield OpenAICompletionsBackend("tiny-served", base_url=server.url, tokenizer="tiny",
                                       sleep=lambda seconds: None, max_attempts=2), server


def test_a_server_echoing_prompt_logprobs_gives_each_option_the_sum_over_its_tokens(
        openai_scores) -> None:
    backend, server = openai_scores
    prompt = closed(backend)
    ids = prompt_token_ids(backend.tokenizer, prompt)
    before = len(server.completions)
    scores = backend.score_options(prompt, NEXT, whole=True)
    sent = [r.body for r in server.completions[before:]]
    assert len(sent) == len(NEXT)
    for option, score in zip(NEXT, scores):
        tokens = encoded(backend, option)
        (body,) = [b for b in sent if b["prompt"] == ids + tokens]  # the prompt once, then it
        assert (body["echo"], body["logprobs"], body["max_tokens"]) == (True, 1, 1)
        assert body["temperature"] == 0.0
        expected = sum(echoed(len(ids) + j, t) for j, t in enumerate(tokens))
        assert score == pytest.approx(expected, abs=1e-12)  # not the first token's, not the
        # generated token's: exactly the option's positions
    before = len(server.completions)
    firsts = backend.score_options(prompt, NEXT)
    word = encoded(backend, NEXT[3])
    assert firsts[:3] == pytest.approx(scores[:3]) and len(word) > 1
    assert firsts[3] == pytest.approx(echoed(len(ids), word[0]))
    # The option no other shares a first token with is sent with that token alone (the requests
    # go out at once: in whatever order they arrive).
    second = [r.body["prompt"] for r in server.completions[before:]]
    assert ids + word[:1] in second and ids + word not in second


def test_a_server_that_echoes_no_prompt_logprobs_is_refused_in_one_line() -> None:
    with FakeOpenAI() as server:  # answers completions, echoes nothing
        backend = OpenAICompletionsBackend("tiny-served", base_url=server.url, tokenizer="tiny")
        with pytest.raises(ModelError) as refused:
            backend.score_options(closed(backend), NEXT)
        message, where = str(refused.value), server.url
    assert "\n" not in message and "log-probabilities" in message and where in message


def test_option_scores_need_token_id_prompts_and_real_options(openai_scores) -> None:
    backend, server = openai_scores
    sent = len(server.completions)
    with FakeOpenAI(prompt_logprob=echoed) as text_server:
        text = OpenAICompletionsBackend("tiny-served", base_url=text_server.url,
                                        tokenizer="tiny", prompt_as="text")
        with pytest.raises(ModelError, match="token-id prompts"):
            text.score_options(closed(text), NEXT)
    with pytest.raises(ValueError, match="no token"):
        backend.score_options(closed(backend), ["<|im_start|>user\n", ""])
    with pytest.raises(ValueError, match="at least one option"):
        backend.score_options(closed(backend), [])
    assert len(server.completions) == sent  # refused before anything was sent


def test_a_failed_request_is_an_error_of_this_call_not_a_refusal(openai_scores) -> None:
    backend, server = openai_scores
    server.then(Fail(400, body='{"error": {"message": "scripted refusal"}}'))
    with pytest.raises(RuntimeError, match="scripted refusal") as failed:
        backend.score_options(closed(backend), NEXT[2:3])
    assert not isinstance(failed.value, ModelError)
    assert backend.score_options(closed(backend), NEXT[2:3])  # the next call is answered


# --- vLLM's prompt log-probabilities, through the stand-in ----------------------------------------

def test_vllm_reads_each_option_from_its_prompt_logprobs(monkeypatch) -> None:
    from userturn.backends.vllm import VLLMBackend

    engine = install_vllm(monkeypatch, prompt_logprob=echoed)
    backend = VLLMBackend(resolve_model("tiny"), options={"max_model_len": 512})
    prompt = closed(backend)
    ids = prompt_token_ids(backend.tokenizer, prompt)
    scores = backend.score_options(prompt, NEXT, whole=True)
    (rows, params), = engine.calls
    assert rows == [ids + encoded(backend, o) for o in NEXT]
    assert all((p.prompt_logprobs, p.max_tokens, p.temperature) == (1, 1, 0.0) for p in params)
    assert scores == pytest.approx([sum(echoed(len(ids) + j, t)
                                        for j, t in enumerate(encoded(backend, o)))
                                    for o in NEXT], abs=1e-12)
    firsts = backend.score_options(prompt, NEXT)
    assert engine.calls[-1][0][3] == ids + encoded(backend, NEXT[3])[:1]
    assert firsts[3] == pytest.approx(echoed(len(ids), encoded(backend, NEXT[3])[0]))
    with pytest.raises(ValueError, match="model length"):
        backend.score_options("word " * 600, NEXT)
    assert len(engine.calls) == 2  # the long prompt was refused before the engine saw it
