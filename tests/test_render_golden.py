"""Golden renders of the probe prompt for every chat-template family we claim.

Each family's template is a hand-written fixture (tests/fixtures/templates/) that reproduces the
family's published prompt format. For each one we render the same conversation with
``render_user_turn`` and compare the exact prompt text and stop markers with a golden file
(tests/golden/<family>.txt and <family>.stop.json), then check the properties that matter
independently of the goldens: the prompt ends in an open user turn, the previous assistant turn is
closed, thinking is gone from history, the stop marker is the user end-of-turn, the system prompt is
where the model saw it.

Regenerate the goldens after an intended change with ``UPDATE_GOLDEN=1 pytest
tests/test_render_golden.py`` and READ the diff: a golden is only as good as the eye that checked it.
Goldens tied to a known render.py bug (``KNOWN_BUGS``) hold the correct, hand-checked value and are
never overwritten by the update run.
"""

from __future__ import annotations

import json

import pytest
from helpers import (
    ANSWER,
    FAMILIES,
    GOLDEN,
    KNOWN_BUGS,
    QUERY,
    SYSTEM,
    TEMPLATES,
    THOUGHT,
    compare_or_update,
    load_family,
)

from userturn.chat.render import (
    prompt_token_ids,
    render_assistant_turn,
    render_user_turn,
    visible_text,
)
from userturn.errors import TemplateError

BROKEN = ("cannot_open_user",)
WORKING = tuple(name for name in FAMILIES if name not in (*BROKEN, "assistant_after_user"))
THINKING = ("qwen3", "deepseek")

THINK_BLOCK = f"<think>\n{THOUGHT}\n</think>\n\n"

# What follows the visible answer in the probe prompt: the closed assistant turn, then the open
# user turn's header.
TAIL = {
    "chatml_qwen25": "<|im_end|>\n<|im_start|>user\n",
    "chatml_smollm2": "<|im_end|>\n<|im_start|>user\n",
    "qwen3": "<|im_end|>\n<|im_start|>user\n",
    "llama3": "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n",
    "gemma": "<end_of_turn>\n<start_of_turn>user\n",
    "gemma3": "<end_of_turn>\n<start_of_turn>user\n",
    "mistral": "</s>[INST] ",
    "phi3": "<|end|>\n<|user|>\n",
    "gpt_oss": "<|end|><|start|>user<|message|>",
    "glm4": "<|user|>\n",
    "deepseek": "<｜end▁of▁sentence｜><｜User｜>",
}
# The marker that ends the generated user turn: the user end-of-turn, or where the family has none,
# the assistant header that would follow it.
USER_STOP = {
    "chatml_qwen25": "<|im_end|>",
    "chatml_smollm2": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "gemma": "<end_of_turn>",
    "gemma3": "<end_of_turn>",
    "mistral": "[/INST]",
    "phi3": "<|end|>",
    "gpt_oss": "<|end|>",
    "glm4": "<|assistant|>",
    "deepseek": "<｜Assistant｜>",
}
# How the ordinary assistant-turn prompt ends (the generation prompt).
ASSISTANT_PROMPT_END = {
    "chatml_qwen25": "<|im_start|>assistant\n",
    "chatml_smollm2": "<|im_start|>assistant\n",
    "qwen3": "<|im_start|>assistant\n<think>\n\n</think>\n\n",  # enable_thinking=False
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "gemma": "<start_of_turn>model\n",
    "gemma3": "<start_of_turn>model\n",
    "mistral": " [/INST]",
    "phi3": "<|assistant|>\n",
    "gpt_oss": "<|start|>assistant",
    "glm4": "<|assistant|>\n",
    "deepseek": "<｜Assistant｜>",
}
# The marker that ends a generated assistant turn. glm4 has none in its text format (a turn ends
# where the next role tag starts; its tokenizer lists <|user|> among the EOS ids), so it is absent.
ASSISTANT_STOP = {
    "chatml_qwen25": "<|im_end|>",
    "chatml_smollm2": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "gemma": "<end_of_turn>",
    "gemma3": "<end_of_turn>",
    "mistral": "</s>",
    "phi3": "<|end|>",
    "gpt_oss": "<|return|>",
    "deepseek": "<｜end▁of▁sentence｜>",
}


def cases(check: str, families: tuple[str, ...] | list[str]) -> list:
    """Parametrize over families, marking the known render.py bugs as strict xfails."""
    out = []
    for name in families:
        reason = KNOWN_BUGS.get((check, name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def conversation(name: str) -> list[dict[str, str]]:
    answer = THINK_BLOCK + ANSWER if name in THINKING else ANSWER
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUERY},
        {"role": "assistant", "content": answer},
    ]


def probe(name: str):
    return render_user_turn(load_family(name), conversation(name))


def test_every_family_has_a_fixture_and_expectations():
    assert set(WORKING) == set(TAIL) == set(USER_STOP) == set(ASSISTANT_PROMPT_END)
    for name, spec in FAMILIES.items():
        assert (TEMPLATES / spec["file"]).is_file(), name
        assert spec["system"] in ("supported", "merged_by_template", "unsupported"), name


# ---------------------------------------------------------------- goldens


@pytest.mark.parametrize("name", cases("golden_text", WORKING))
def test_golden_text(name):
    compare_or_update("golden_text", name, GOLDEN / f"{name}.txt", probe(name).text)


@pytest.mark.parametrize("name", cases("golden_stop", WORKING))
def test_golden_stop(name):
    actual = json.dumps(list(probe(name).stop), ensure_ascii=False, indent=1) + "\n"
    compare_or_update("golden_stop", name, GOLDEN / f"{name}.stop.json", actual)


# ------------------------------------------------- properties, independent of the goldens


@pytest.mark.parametrize("name", cases("tail", WORKING))
def test_prompt_ends_in_an_open_user_turn_after_the_closed_answer(name):
    text = probe(name).text
    assert text.endswith("The answer is 72." + TAIL[name])


@pytest.mark.parametrize("name", cases("user_stop", WORKING))
def test_stop_is_the_user_end_of_turn(name):
    assert probe(name).stop[0] == USER_STOP[name]


@pytest.mark.parametrize("name", WORKING)
def test_no_thinking_in_the_prompt(name):
    text = probe(name).text
    assert "<think>" not in text and "</think>" not in text
    assert THOUGHT not in text
    assert visible_text(conversation(name)[-1]["content"]) in text


@pytest.mark.parametrize("name", cases("system", WORKING))
def test_system_prompt_where_the_model_saw_it(name):
    prompt = probe(name)
    # gemma refuses a system message; mistral would put it into the opened user turn. userturn
    # merges it into the first user message for both, and says so.
    assert prompt.system_merged is (name in ("gemma", "mistral"))
    text = prompt.text
    assert text.count(SYSTEM) == 1
    # Before the query, never in the opened user turn.
    assert text.index(SYSTEM) < text.index(QUERY)
    if name in ("gemma", "gemma3"):
        first_turn = text.split("<start_of_turn>user\n", 1)[1].split("<end_of_turn>", 1)[0]
        assert first_turn == f"{SYSTEM}\n\n{QUERY}"


@pytest.mark.parametrize("name", ["gemma"])
def test_gemma_refuses_a_system_message_itself(name):
    with pytest.raises(TemplateError, match="System role not supported"):
        load_family(name).render(conversation(name))


@pytest.mark.parametrize("name", THINKING)
def test_thinking_template_itself_strips_history(name):
    # The template, not render.py, drops the reasoning; the probe must cope with the rewrite.
    rendered = load_family(name).render([*conversation(name), {"role": "user", "content": "Thanks!"}])
    assert THOUGHT not in rendered


def test_qwen3_enable_thinking_only_changes_the_generation_prompt():
    on, off = load_family("qwen3", enable_thinking=True), load_family("qwen3", enable_thinking=False)
    assert render_user_turn(on, conversation("qwen3")).text == probe("qwen3").text
    messages = conversation("qwen3")[:2]
    assert render_assistant_turn(on, messages).text.endswith("<|im_start|>assistant\n")
    assert render_assistant_turn(off, messages).text.endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


@pytest.mark.parametrize("name", WORKING)
def test_assistant_turn_ends_with_the_assistant_header(name):
    prompt = render_assistant_turn(load_family(name), conversation(name)[:2])
    assert prompt.text.endswith(ASSISTANT_PROMPT_END[name])
    assert prompt.system_merged is (name == "gemma")


@pytest.mark.parametrize("name", cases("assistant_stop", list(ASSISTANT_STOP)))
def test_assistant_turn_stop_is_the_assistant_end_of_turn(name):
    prompt = render_assistant_turn(load_family(name), conversation(name)[:2])
    assert prompt.stop[0] == ASSISTANT_STOP[name]


@pytest.mark.parametrize("name", cases("broken", BROKEN))
def test_broken_templates_raise_naming_the_model(name):
    with pytest.raises(TemplateError, match=f"fixture/{name}"):
        probe(name)


def test_header_written_after_every_user_message_is_not_part_of_the_stop():
    # Templates like Phi-3-medium write the assistant header after every user message. The
    # prompt is cut before it; the user turn must still end at the shared end-of-turn marker.
    prompt = probe("assistant_after_user")
    assert prompt.text.endswith("The answer is 72.<|im_end|>\n<|im_start|>user\n")
    assert prompt.stop == ("<|im_end|>", "<|im_start|>assistant")


# ---------------------------------------------------------------- BOS exactly once

SENTENCES = [
    "Natalia sold clips to 48 of her friends in April",
    "How many clips did Natalia sell altogether in April and May ?",
    "The answer is 72 .",
    "You are a careful math tutor . Answer step by step .",
]
SPECIAL = {
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "gemma": ["<bos>", "<start_of_turn>", "<end_of_turn>"],
}


def tiny_tokenizer(bos: str, specials: list[str]):
    """A real fast tokenizer, trained in-process, whose post-processor adds BOS like Llama/Gemma."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", *specials])
    tok.train_from_iterator(SENTENCES, trainer)
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, unk_token="[UNK]")


@pytest.mark.parametrize("name", ["llama3", "gemma"])
def test_bos_once(name):
    bos = FAMILIES[name]["bos_token"]
    tokenizer = tiny_tokenizer(bos, SPECIAL[name])
    bos_id = tokenizer.bos_token_id
    assert tokenizer("", add_special_tokens=True)["input_ids"] == [bos_id]  # it does add BOS

    for prompt in (probe(name), render_assistant_turn(load_family(name), conversation(name)[:2])):
        assert prompt.text.startswith(bos)
        ids = prompt_token_ids(tokenizer, prompt.text)
        assert ids[0] == bos_id and ids.count(bos_id) == 1
        # Text without BOS (a template that does not write it): the tokenizer's BOS, once.
        bare = prompt_token_ids(tokenizer, prompt.text[len(bos):])
        assert bare[0] == bos_id and bare.count(bos_id) == 1
        assert bare == ids


DEFAULT_SYSTEM = {
    "chatml_qwen25": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\n",
    "chatml_smollm2": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n",
    "llama3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>",
}


@pytest.mark.parametrize("name", list(DEFAULT_SYSTEM))
def test_default_system_prompt_without_a_system_message(name):
    # The template's own default system block must not confuse the derived markers.
    prompt = render_user_turn(load_family(name), conversation(name)[1:])
    assert prompt.text.startswith(DEFAULT_SYSTEM[name])
    assert prompt.text.count(DEFAULT_SYSTEM[name]) == 1
    assert prompt.text.endswith("The answer is 72." + TAIL[name])
    assert prompt.stop[0] == USER_STOP[name] and not prompt.system_merged


@pytest.mark.parametrize("answer", ["a", "t", "user", "assistant", "<", "|", "", "  "])
@pytest.mark.parametrize("name", ["chatml_smollm2", "llama3", "gpt_oss", "mistral", "glm4"])
def test_short_answers_that_also_occur_inside_the_markers(name, answer):
    # Found by the benchmark: the answer "a" was located inside "<|im_start|>", after the
    # closing marker, and the prompt was wrongly refused.
    messages = [{"role": "user", "content": QUERY}, {"role": "assistant", "content": answer}]
    prompt = render_user_turn(load_family(name), messages)
    assert prompt.text.endswith(TAIL[name])
