"""Reasoning models, without a model: splitting thinking from generated text (``<think>`` blocks
and gpt-oss harmony channels), and the exact prompts for Qwen3 with thinking on and off and for
gpt-oss, with the answer's thinking dropped (as the template does) or kept.

Goldens follow test_render_golden.py: tests/golden/<family>.<variant>.txt, regenerated with
``UPDATE_GOLDEN=1`` and read by eye before committing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ANSWER, GOLDEN, QUERY, SYSTEM, THOUGHT, compare_or_update, load_family

from userturn.chat.render import render_assistant_turn, render_user_turn
from userturn.chat.thinking import prompt_opens_thinking, split_thinking, thinking_format
from userturn.errors import TemplateError

# What gpt-oss writes after "<|start|>assistant" (the generation prompt), up to its stop marker.
HARMONY_ANSWER = (
    "<|channel|>analysis<|message|>We need total clips: April 48, May half of that = 24. "
    "Sum 72.<|end|><|start|>assistant<|channel|>final<|message|>In May she sold 24 clips, so "
    "72 in total.\nThe answer is 72."
)


# ------------------------------------------------------------------ <think> blocks


@pytest.mark.parametrize("text, expected", [
    ("<think>\nThey may ask why 24.\n</think>\n\nWhy did you halve 48?",
     ("They may ask why 24.", "Why did you halve 48?")),
    # an empty block: the model thought nothing, which is not "no thinking at all"
    ("<think>\n\n</think>\n\nThanks!", ("", "Thanks!")),
    # the thinking ran out of tokens before </think>: nothing visible was written
    ("<think>\nThe user wants me to write a follow-up. Let me consider what they",
     ("The user wants me to write a follow-up. Let me consider what they", "")),
    # the opening tag was in the prompt and nobody said so: all before </think> is thinking
    ("Half of 48 is 24.\n</think>\n\nThe answer is 72.", ("Half of 48 is 24.", "The answer is 72.")),
    ("Why did you halve 48?", (None, "Why did you halve 48?")),
    ("  Thanks!\n", (None, "Thanks!")),
])
def test_think_blocks(text, expected):
    assert split_thinking(text, "think") == expected


def test_think_block_opened_by_the_prompt():
    # Templates that write "<think>\n" into the generation prompt: the turn starts inside it.
    assert split_thinking("Half of 48 is 24.\n</think>\n\n72", "think", opened=True) == \
        ("Half of 48 is 24.", "72")
    # Ran out of tokens inside the block: no tags in the text at all, still thinking only.
    assert split_thinking("Half of 48 is 24, and", "think", opened=True) == \
        ("Half of 48 is 24, and", "")
    assert split_thinking("Half of 48 is 24, and", "think") == (None, "Half of 48 is 24, and")


@pytest.mark.parametrize("prompt, opened", [
    ("<|im_start|>assistant\n<think>\n", True),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # Qwen3 with thinking off
    ("<|im_start|>assistant\n", False),
    ("<|im_start|>user\n", False),
])
def test_prompt_opens_thinking(prompt, opened):
    assert prompt_opens_thinking(prompt) is opened


# ------------------------------------------------------------------ gpt-oss harmony


def test_harmony_assistant_answer_analysis_then_final():
    thinking, visible = split_thinking(HARMONY_ANSWER, "harmony")
    assert thinking == "We need total clips: April 48, May half of that = 24. Sum 72."
    assert visible == "In May she sold 24 clips, so 72 in total.\nThe answer is 72."


@pytest.mark.parametrize("text, expected", [
    # A user turn: the prompt opened "<|start|>user<|message|>", the model writes the body.
    ("Why did you divide 48 by 2?", (None, "Why did you divide 48 by 2?")),
    ("Why did you divide 48 by 2?<|end|>", (None, "Why did you divide 48 by 2?")),
    # ... or, in the user's seat, it reasons on the analysis channel and stops at <|end|>.
    ("<|channel|>analysis<|message|>The user likely wants to check the May number.<|end|>",
     ("The user likely wants to check the May number.", "")),
    # analysis, then a final message: only the final text is the user turn
    ("<|channel|>analysis<|message|>Ask about May.<|end|><|start|>user<|channel|>final"
     "<|message|>Why is May 24?", ("Ask about May.", "Why is May 24?")),
    # commentary (tool preambles) is not the final visible text either
    ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final"
     "<|message|>72.", ("Checking.", "72.")),
    # the analysis ran out of tokens: thinking only
    ("<|channel|>analysis<|message|>We need to compute the sum of", ("We need to compute the sum of", "")),
    # the final header was written but its message never started
    ("<|channel|>analysis<|message|>Sum is 72.<|end|><|start|>assistant<|channel|>final",
     ("Sum is 72.", "")),
    # a final message with no analysis: headers stripped, no thinking
    ("<|channel|>final<|message|>The answer is 72.", (None, "The answer is 72.")),
    # a server that skips special tokens fuses the channel names into the text
    ("analysisWe need the sum. 48+24=72.assistantfinalThe answer is 72.",
     ("We need the sum. 48+24=72.", "The answer is 72.")),
    ("analysis of step two, please?", (None, "analysis of step two, please?")),
])
def test_harmony_turns(text, expected):
    assert split_thinking(text, "harmony") == expected


def test_format_is_read_from_the_template():
    assert thinking_format(load_family("gpt_oss").source) == "harmony"
    assert thinking_format(load_family("qwen3").source) == "think"
    assert thinking_format(load_family("chatml_smollm2").source) == "think"  # models may still think


PUBLISHED = Path(__file__).parent / "fixtures" / "templates" / "published"


@pytest.mark.parametrize("name, fmt", [("gemma4", "channel"), ("seed_oss", "seed"),
                                       ("deepseek_v31", "think"), ("glm47_flash", "think")])
def test_published_templates_name_their_own_thinking_tags(name, fmt):
    assert thinking_format((PUBLISHED / f"{name}.jinja").read_text()) == fmt


@pytest.mark.parametrize("text, fmt, expected", [
    # Gemma 4: a thought channel names itself first; <think> means nothing to it
    ("<|channel>thought\nThey may ask why 24.<channel|>Why did you halve 48?", "channel",
     ("They may ask why 24.", "Why did you halve 48?")),
    ("<think>x</think>Why?", "channel", (None, "<think>x</think>Why?")),
    ("<|channel>thought\nStill thinking about", "channel", ("Still thinking about", "")),
    # Seed-OSS
    ("<seed:think>Half of 48 is 24.</seed:think>The answer is 72.", "seed",
     ("Half of 48 is 24.", "The answer is 72.")),
    ("<think>x</think>Why?", "seed", (None, "<think>x</think>Why?")),
])
def test_channel_and_seed_blocks(text, fmt, expected):
    assert split_thinking(text, fmt) == expected


def test_a_gemma4_prompt_that_opens_the_thought_channel():
    # Gemma 4's generation prompt with thinking off writes an empty channel (closed): not open.
    assert not prompt_opens_thinking("<|turn>model\n<|channel>thought\n<channel|>", "channel")
    assert prompt_opens_thinking("<|turn>model\n<|channel>thought", "channel")
    assert split_thinking("\nHalf of 48.<channel|>72.", "channel", opened=True) == (
        "Half of 48.", "72.")


# ------------------------------------------------------------------ gpt-oss stop markers


def test_gpt_oss_markers():
    template = load_family("gpt_oss")
    probe = render_user_turn(template, messages())
    # The harmony user message ends with <|end|>; an assistant header after it means drift.
    assert probe.stop == ("<|end|>", "<|start|>assistant")
    assert probe.text.endswith("The answer is 72.<|end|><|start|>user<|message|>")
    answer = render_assistant_turn(template, messages()[:2])
    # The answer ends with <|return|> when generated; <|end|> closes its ANALYSIS message and must
    # not stop it, while history closes the final message with <|end|> (the golden above).
    assert answer.stop == ("<|return|>",) and answer.text.endswith("<|start|>assistant")


# ------------------------------------------------------------------ goldens


def messages(answer: str = ANSWER) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUERY},
            {"role": "assistant", "content": answer}]


GOLDEN_PROMPTS = {
    # Qwen3: enable_thinking changes the answer prompt, not the user-turn prompt after it.
    "qwen3.thinking_on": lambda: render_user_turn(load_family("qwen3", enable_thinking=True),
                                                  messages()).text,
    "qwen3.thinking_off": lambda: render_user_turn(load_family("qwen3", enable_thinking=False),
                                                   messages()).text,
    "qwen3.assistant.thinking_on": lambda: render_assistant_turn(
        load_family("qwen3", enable_thinking=True), messages()[:2]).text,
    "qwen3.assistant.thinking_off": lambda: render_assistant_turn(
        load_family("qwen3", enable_thinking=False), messages()[:2]).text,
    # The policy keep: the answer's thinking before it, in the model's own format.
    "qwen3.keep": lambda: render_user_turn(load_family("qwen3", enable_thinking=True), messages(),
                                           thinking=THOUGHT).text,
    "gpt_oss.keep": lambda: render_user_turn(load_family("gpt_oss"), messages(), thinking=THOUGHT).text,
    "gpt_oss.assistant": lambda: render_assistant_turn(load_family("gpt_oss"), messages()[:2]).text,
}


@pytest.mark.parametrize("name", list(GOLDEN_PROMPTS))
def test_golden_reasoning_prompts(name):
    compare_or_update("golden_text", name, GOLDEN / f"{name}.txt", GOLDEN_PROMPTS[name]())


def test_qwen3_user_turn_prompt_is_the_same_with_thinking_on_and_off():
    assert GOLDEN_PROMPTS["qwen3.thinking_on"]() == GOLDEN_PROMPTS["qwen3.thinking_off"]()
    assert GOLDEN_PROMPTS["qwen3.assistant.thinking_on"]() != \
        GOLDEN_PROMPTS["qwen3.assistant.thinking_off"]()


@pytest.mark.parametrize("name, header, block, final", [
    ("qwen3", "<|im_start|>assistant\n", f"<think>\n{THOUGHT}\n</think>\n\n", ""),
    # harmony: an analysis message, then the final message the answer was already in
    ("gpt_oss", "<|start|>assistant",
     f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant",
     "<|channel|>final<|message|>"),
    ("llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n",
     f"<think>\n{THOUGHT}\n</think>\n\n", ""),
])
def test_keep_puts_the_thinking_before_the_answer(name, header, block, final):
    kept = render_user_turn(load_family(name), messages(), thinking=THOUGHT)
    dropped = render_user_turn(load_family(name), messages())
    assert THOUGHT not in dropped.text
    assert f"{header}{block}{final}In May" in kept.text
    # Only the thinking is added: without it, the prompt is the dropped one.
    assert kept.text.replace(block, "", 1) == dropped.text and kept.stop == dropped.stop


def test_keep_replaces_a_think_block_left_in_the_answer():
    # An answer that still carries its block is shown once, with the given thinking.
    kept = render_user_turn(load_family("qwen3"), messages(f"<think>\nAn older thought.\n</think>\n\n{ANSWER}"),
                            thinking=THOUGHT)
    assert "older" not in kept.text and kept.text.count("<think>") == 1


def test_keep_refuses_a_template_that_puts_the_answer_elsewhere():
    # A harmony template whose history is not on the final channel: where the analysis message
    # goes is unclear, so a clear error naming the model rather than a guess.
    template = load_family("gpt_oss")
    other = template.__class__(
        source=template.source.replace("<|channel|>final<|message|>", "<|channel|>answer<|message|>"),
        model="fixture/other_channel", bos_token=template.bos_token,
        eos_token=template.eos_token, variables=template.variables)
    assert "<|channel|>answer<|message|>In May" in render_user_turn(other, messages()).text
    with pytest.raises(TemplateError, match="fixture/other_channel: cannot keep the thinking"):
        render_user_turn(other, messages(), thinking=THOUGHT)


def test_template_variables_change_the_template_hash():
    # enable_thinking changes the render, so a stored generation must not be served across it.
    on, off = load_family("qwen3", enable_thinking=True), load_family("qwen3", enable_thinking=False)
    assert on.hash != off.hash
    plain = load_family("chatml_smollm2")
    assert plain.hash == plain.__class__(plain.source, "other").hash  # no variables: source only
