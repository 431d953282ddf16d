"""Past the end of sequence (``Request.past_end``): what the continuation arm asks of a backend.
Left to continue a closed conversation, a model writes its end tokens and goes on (a user turn,
an assistant turn, text outside any turn); only the request's stop markers and its token budget
end the completion, and ``raw_text`` keeps the end tokens, so a parser can see where turns end.

On the tiny real model (both transformers engines), the scripted fake, an OpenAI-compatible server
on 127.0.0.1 and the stand-in for vLLM's API (tests/vllm_fake.py); llama.cpp in
tests/test_llamacpp.py. A request without ``past_end`` is what it was: the same turns, the same
body sent."""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from typing import Any

import pytest
from openai_fake import FakeOpenAI
from vllm_fake import install_vllm

from userturn.backends.fake import SCRIPTED_FOLLOW_UP, ScriptedBackend, probe_script
from userturn.backends.hf import TransformersBackend
from userturn.backends.models import ModelRef, resolve_model
from userturn.backends.openai import OpenAICompletionsBackend
from userturn.chat.continuation import continuation_markers, next_role_options, parse_continuation
from userturn.chat.render import render_user_turn
from userturn.errors import ModelError
from userturn.probe.arms import ArmBudget, ArmContext
from userturn.probe.continuation import ContinuationArm, next_role_scores
from userturn.records import GenerationParams, Request

CONVERSATION = [{"role": "user", "content": "Tom has 3 boxes of 12 pencils. How many pencils?"},
                {"role": "assistant", "content": "He has 36 pencils."}]
OTHER = [{"role": "user", "content": "Write a short poem about the sea."},
         {"role": "assistant", "content": "The sea is blue."}]
# The tiny model's greedy continuation of this one writes its EOS <|im_end|> a few tokens in.
ENDS_ON_EOS = [{"role": "user", "content": "Write a short poem about the sea."},
               {"role": "assistant", "content": "The answer is 42."}]
GREEDY = GenerationParams(0.0, 1.0, 40)


def closed(backend: Any) -> str:
    """The conversation rendered through the end of the assistant's turn, no header opened."""
    return backend.template.render(CONVERSATION)


# --- the scripted fake ------------------------------------------------------------------------

def test_the_fake_goes_past_its_end_tokens_to_a_stop_marker_or_its_budget() -> None:
    backend = ScriptedBackend(lambda r: "Sure.<|im_end|>\n<|im_start|>user\nWhy 36?<|im_end|>\nok")
    ended, stopped, cut = backend.complete([
        Request("p", GREEDY, ("<|im_end|>",)),
        Request("p", GREEDY, ("Why",), past_end=True),
        Request("p", GenerationParams(0.0, 1.0, 2), (), past_end=True)])
    assert (ended.raw_text, ended.finish_reason) == ("Sure.<|im_end|>", "stop")
    assert stopped.raw_text == "Sure.<|im_end|>\n<|im_start|>user\nWhy"
    assert stopped.finish_reason == "stop" and stopped.text == "Sure.\nuser"
    assert (cut.raw_text, cut.finish_reason, cut.completion_tokens) == \
        ("Sure.<|im_end|>\n<|im_start|>user", "length", 2)
    (free,) = backend.complete([Request("p", GREEDY, (), past_end=True)])
    assert free.finish_reason == "length" and free.raw_text.endswith("<|im_end|>\nok")


def test_fake_model_specs_continue_a_closed_conversation_with_a_user_turn() -> None:
    backend = ScriptedBackend(probe_script)
    prompt = closed(backend)
    (turn,) = backend.complete([Request(prompt, GREEDY, ("<|im_start|>assistant",),
                                        past_end=True)])
    assert turn.raw_text == f"<|im_start|>user\n{SCRIPTED_FOLLOW_UP}<|im_end|>\n" \
                            "<|im_start|>assistant"
    probe = render_user_turn(backend.template, CONVERSATION)
    (opened,) = backend.complete([Request(probe.text, GREEDY, probe.stop)])
    assert opened.text == SCRIPTED_FOLLOW_UP  # the opened arm's turn is what it was


# --- an OpenAI-compatible server ----------------------------------------------------------------

def served(server: FakeOpenAI) -> OpenAICompletionsBackend:
    return OpenAICompletionsBackend("tiny-served", base_url=server.url, tokenizer="tiny",
                                    sleep=lambda seconds: None)


def test_a_server_is_asked_to_ignore_eos_and_keep_special_tokens_past_the_end() -> None:
    with FakeOpenAI() as server:
        backend = served(server)
        plain = Request(closed(backend), GREEDY, ("<|im_end|>",), 3)
        backend.complete([plain])
        backend.complete([replace(plain, past_end=True)])
    before, after = (r.body for r in server.completions[-2:])
    assert after == {**before, "ignore_eos": True, "skip_special_tokens": False,
                     "spaces_between_special_tokens": False}
    assert not {"ignore_eos", "skip_special_tokens"} & set(before)  # as it was


def test_a_llamacpp_server_is_refused_past_the_end_before_any_request() -> None:
    # llama.cpp's server takes ignore_eos, but bans the end tokens rather than going past them.
    with FakeOpenAI(owned_by="llamacpp") as server:
        backend = served(server)
        request = Request(closed(backend), GREEDY, ("<|im_end|>",), 3)
        sent = len(server.completions)
        with pytest.raises(ModelError) as refused:
            backend.complete([request, replace(request, past_end=True)])
        assert len(server.completions) == sent
        assert "\n" not in str(refused.value) and "llamacpp/" in str(refused.value)
        (turn,) = backend.complete([request])  # its ordinary turns are served as before
        assert turn.error is None and turn.text
    with FakeOpenAI(owned_by="vllm") as server:
        (turn,) = served(server).complete([replace(request, past_end=True)])
        assert turn.error is None and server.completions[-1].body["ignore_eos"] is True


# --- vLLM, through the stand-in -------------------------------------------------------------------

def test_vllm_is_asked_to_ignore_eos_and_stops_only_at_the_markers(monkeypatch) -> None:
    from transformers import AutoTokenizer

    from userturn.backends.vllm import VLLMBackend

    tiny = resolve_model("tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny.path)
    written = "Why 36?<|im_end|>\n<|im_start|>user\nThank you!<|im_end|>\n"
    engine = install_vllm(monkeypatch, tokenizer(written, add_special_tokens=False)["input_ids"])
    backend = VLLMBackend(tiny, options={"max_model_len": 512})
    request = Request(closed(backend), GREEDY, ("Thank",), 0)
    ended, past = backend.complete([request, replace(request, past_end=True)])
    first, second = engine.params
    eos = tokenizer.eos_token_id
    assert not first.ignore_eos and eos in first.stop_token_ids
    assert second.ignore_eos and eos not in second.stop_token_ids
    assert second.skip_special_tokens is False and second.stop == ["Thank"]
    assert (ended.raw_text, ended.finish_reason) == ("Why 36?<|im_end|>", "stop")
    assert past.raw_text == "Why 36?<|im_end|>\n<|im_start|>user\nThank"
    assert past.finish_reason == "stop" and "<|im_end|>" not in past.text


# --- transformers, both engines, on the tiny model ----------------------------------------------

ENGINES = ("refill", "static")


@pytest.fixture(scope="module")
def ends_early(tmp_path_factory: pytest.TempPathFactory, tiny_backend: Any) -> ModelRef:
    """A copy of the tiny model that ends its continuation of the closed conversation at its
    third token: <|endoftext|>, which is also its pad token, joins the generation config's EOS
    ids and is written where the tiny model writes a plain word (``tiny.add_end_token``)."""
    from userturn.backends.tiny import add_end_token

    (free,) = tiny_backend.complete([Request(closed(tiny_backend), GenerationParams(0.0, 1.0, 8),
                                             (), 0, past_end=True)])
    ids = tiny_backend.tokenizer(free.raw_text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 3 and ids[2] not in ids[:2]
    folder = tmp_path_factory.mktemp("ends-early") / "model"
    shutil.copytree(resolve_model("tiny").path, folder)
    add_end_token(folder, "<|endoftext|>", replaces=ids[2])
    return ModelRef("ends-early", "transformers", str(folder), str(folder), "ends-early")


def engines(ref: ModelRef, width: int = 4) -> list[TransformersBackend]:
    return [TransformersBackend(ref, batch_size=width, batching=way) for way in ENGINES]


def goes_past(ref: ModelRef, conversation: list[dict[str, str]], end: str) -> None:
    """On both engines: the greedy continuation of ``conversation`` stops at ``end`` within a
    few tokens; past the end it goes on to its budget, or to a marker written after ``end``."""
    outcomes = []
    for backend in engines(ref):
        prompt = backend.template.render(conversation)
        (ended,) = backend.complete([Request(prompt, GREEDY, (), 0)])
        assert ended.finish_reason == "stop" and ended.completion_tokens < 10
        assert ended.raw_text.endswith(end) and end not in ended.raw_text[:-len(end)]
        (free,) = backend.complete([Request(prompt, GREEDY, (), 0, past_end=True)])
        assert (free.finish_reason, free.completion_tokens) == ("length", GREEDY.max_tokens)
        assert free.raw_text.startswith(ended.raw_text)  # the same tokens, then on past the end
        at = len(ended.raw_text) + 4  # a marker written a few characters past the end
        marker = free.raw_text[at:at + 4]
        assert free.raw_text.find(marker) == at
        (stopped,) = backend.complete([Request(prompt, GREEDY, (marker,), 0, past_end=True)])
        assert stopped.finish_reason == "stop"
        assert stopped.raw_text == free.raw_text[:at + len(marker)]
        assert ended.completion_tokens < stopped.completion_tokens < GREEDY.max_tokens
        assert end in stopped.raw_text and end not in stopped.text
        outcomes.append((ended, free, stopped))
    assert outcomes[0] == outcomes[1]  # the refill loop and the static batches agree


def test_a_continuation_goes_past_the_tokenizers_eos_to_its_stop_marker() -> None:
    goes_past(resolve_model("tiny"), ENDS_ON_EOS, "<|im_end|>")


def test_past_the_generation_configs_eos_which_is_also_the_pad_token(ends_early) -> None:
    assert TransformersBackend(ends_early).tokenizer.pad_token == "<|endoftext|>"
    goes_past(ends_early, CONVERSATION, "<|endoftext|>")


def test_an_end_token_that_is_the_pad_id_is_kept_where_the_model_wrote_it(ends_early) -> None:
    """Past the end, trailing pad ids are not a static batch's filling: a budget that ends on the
    end token keeps it; and a row that stops on its marker while its batch goes on is cut where
    it stopped."""
    refill, static = engines(ends_early)
    prompt = closed(refill)
    at_end = Request(prompt, GenerationParams(0.0, 1.0, 3), (), 0, past_end=True)
    got = [backend.complete([at_end])[0] for backend in (refill, static)]
    assert got[0] == got[1]
    assert (got[0].finish_reason, got[0].completion_tokens) == ("length", 3)
    assert got[0].raw_text.endswith("<|endoftext|>")
    (free,) = refill.complete([Request(prompt, GREEDY, (), 0, past_end=True)])
    early = free.raw_text.split("<|endoftext|>", 1)[1].split()[0]  # a word right after the end
    short, long = (Request(text, GREEDY, (early,), 0, past_end=True)
                   for text in (prompt, refill.template.render(OTHER)))
    alone = [refill.complete([short])[0], refill.complete([long])[0]]
    assert alone[0].completion_tokens + 10 < alone[1].completion_tokens  # padded 10 steps or more
    assert static.complete([short, long]) == alone == refill.complete([short, long])


def varied(prompts: list[str], marker: str) -> list[Request]:
    """Continuations of each prompt, of budgets 3 and 20, greedy and sampled, to a marker or not,
    past the end or not, and to a marker that is a special token."""
    out = []
    for n, prompt in enumerate(prompts):
        for budget in (3, 20):
            for params in (GenerationParams(0.0, 1.0, budget), GenerationParams(0.7, 0.9, budget)):
                seed = 0 if params.greedy else 11 * budget + n
                for stop in ((), (marker,), ("<|im_end|>",)):
                    out += [Request(prompt, params, stop, seed, past_end=True),
                            Request(prompt, params, stop, seed)]
    return out


def test_both_engines_give_the_same_continuations_and_leave_other_turns_alone(ends_early) -> None:
    """The static batches never mix a past-end request with another (they share one setting);
    the refill loop does, and gives what they give."""
    static = TransformersBackend(ends_early, batch_size=4, batching="static")
    prompts = [closed(static), static.template.render(OTHER)]
    (free,) = static.complete([Request(prompts[0], GREEDY, (), 0, past_end=True)])
    batch = varied(prompts, free.raw_text.split("<|endoftext|>", 1)[1].split()[1])
    random.Random(0).shuffle(batch)
    expected = static.complete(batch)
    outcomes = {(r.past_end, g.finish_reason) for r, g in zip(batch, expected)}
    assert outcomes == {(True, "stop"), (True, "length"), (False, "stop"), (False, "length")}
    for width in (2, 5):
        assert TransformersBackend(ends_early, batch_size=width).complete(batch) == expected



def test_the_continuation_arm_stops_at_every_end_its_engine_has(ends_early) -> None:
    """The arm renders, stops and parses with the engine's end tokens, not the template's alone:
    a model whose generation config also ends at <|endoftext|> (Qwen2.5's case: its BOS) stops
    there, the continuation reads as closed where it wrote it, and P(end) counts it."""
    import torch

    backend = TransformersBackend(ends_early)
    assert set(backend.end_texts) == {"<|im_end|>", "<|endoftext|>"}
    context = ArmContext(CONVERSATION, None, [(0.0, 0, 0)], "d", "i", "c", None, "self", "none")
    (job,) = ContinuationArm().jobs(backend, context, ArmBudget(1.0, 40, 40, "drop"))
    assert job.request.prompt == closed(backend) and "<|endoftext|>" in job.request.stop
    (generation,) = backend.complete([job.request])
    assert generation.raw_text.endswith("<|endoftext|>") and generation.completion_tokens == 3
    # Read as the run reads it: words, closed at the engine's end, not read on past it.
    markers = continuation_markers(backend.template, backend.end_texts)
    parsed = parse_continuation(markers, generation.raw_text)
    assert (parsed.role, parsed.closed) == ("text", True)
    assert parsed.end_at == len(generation.raw_text) - len("<|endoftext|>")
    # P(end) is P(<|im_end|>) + P(<|endoftext|>) at the prompt's end, as one forward pass says.
    ids = torch.tensor([backend.tokenizer(job.request.prompt)["input_ids"]])
    with torch.no_grad():
        last = torch.log_softmax(backend.model(ids).logits[0, -1], dim=-1)
    p_end = {t: float(last[backend.tokenizer.convert_tokens_to_ids(t)].exp())
             for t in ("<|im_end|>", "<|endoftext|>")}
    scores = next_role_scores(backend, job.request.prompt, next_role_options(markers))
    assert scores["end"] == pytest.approx(sum(p_end.values()), rel=1e-4)
    assert p_end["<|endoftext|>"] > 0  # the second end counts
