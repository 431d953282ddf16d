"""The continuation arm's chat side, on every chat-template fixture the tests hold.

The prompt is the conversation closed as the template closes a past turn, no header opened: it
must be exactly the opened arm's prompt up to where that one opens the user header. What the
model writes next is parsed with the template's own markers into the role it opened first. The
scripted continuations are written by the templates themselves where a template can write them
(a user turn after the answer is the template's render of a next user message), so a parse is
checked against the format, not against the markers it was derived from.
"""

from __future__ import annotations

import math

import pytest
from helpers import ANSWER, FAMILIES, PUBLISHED, QUERY, SYSTEM, THOUGHT, load_family, load_published

from userturn.chat.continuation import (
    CONTINUATION_ROLES,
    continuation_markers,
    next_role_options,
    next_role_probabilities,
    parse_continuation,
    render_continuation,
)
from userturn.chat.render import ChatTemplate, prompt_token_ids, render_user_turn
from userturn.errors import TemplateError

BROKEN = ("cannot_open_user", "assistant_after_user")  # refused by the opened arm as well
CASES = [*(f"fixture/{name}" for name in FAMILIES if name not in BROKEN),
         *(f"published/{name}" for name in PUBLISHED)]
FOLLOW_UP = "Why did you halve 48 in the first step?"

# What ends the continuation prompt after the answer's last words: the past assistant turn
# closed as the template closes one between turns (read off each template by eye).
CLOSE = {
    "fixture/chatml_qwen25": "<|im_end|>\n",
    "fixture/chatml_smollm2": "<|im_end|>\n",
    "fixture/qwen3": "<|im_end|>\n",
    "fixture/llama3": "<|eot_id|>",
    "fixture/gemma": "<end_of_turn>\n",
    "fixture/gemma3": "<end_of_turn>\n",
    "fixture/mistral": "</s>",
    "fixture/phi3": "<|end|>\n",
    "fixture/gpt_oss": "<|end|>",  # not <|return|>, which ends a finished conversation's answer
    "fixture/glm4": "",  # GLM closes no turn: it ends where the next role tag starts
    "fixture/deepseek": "<｜end▁of▁sentence｜>",
    "published/deepseek_v31": "<｜end▁of▁sentence｜>",
    "published/glm47_flash": "",
    "published/nemotron_nano_v2": "\n<SPECIAL_12>\n\n",
    "published/deepseek_r1_0528": "<｜end▁of▁sentence｜>",
    "published/mistral_nemo": "</s>",
    "published/llama4": "<|eot|>",
    "published/mistral_small3": "</s>",
    "published/ministral_reasoning": "</s>",
    "published/gemma4": "<turn|>\n",
    "published/glm45": "",
    "published/qwen3_coder": "<|im_end|>\n",
    "published/kimi_k2_thinking": "<|im_end|>",
    "published/minimax_m2": "[e~[\n",
    "published/seed_oss": "<seed:eos>",
    "published/apertus": "<|assistant_end|>",
    "published/lfm2": "<|im_end|>\n",
    "published/granite4": "<|end_of_text|>\n",
    "published/phi4_reasoning": "<|im_end|>",
    "published/command_a": "<|END_RESPONSE|><|END_OF_TURN_TOKEN|>",
    "published/exaone": "[|endofturn|]\n",
}


def load(case: str) -> ChatTemplate:
    kind, name = case.split("/")
    return load_family(name) if kind == "fixture" else load_published(name)


def conversation(system: bool = True) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": QUERY}, {"role": "assistant", "content": ANSWER}]
    return [{"role": "system", "content": SYSTEM}, *messages] if system else messages


def first_stop(text: str, stops: tuple[str, ...]) -> int:
    """Where an engine that stops at ``stops`` (and nowhere else) ends ``text``."""
    return min((text.find(s) for s in stops if s in text), default=len(text))


def user_turn_written_by_the_template(template: ChatTemplate, prompt: str) -> str:
    """The template's own next user turn after the closed answer, through the assistant header
    it opens after it: what a model that wrote the user turn in this format would write."""
    rendered = template.render([*conversation(system=False),
                                {"role": "user", "content": FOLLOW_UP}], True)
    assert rendered.startswith(prompt)
    return rendered[len(prompt):]


def test_every_fixture_has_its_expectations():
    assert set(CASES) == set(CLOSE)


@pytest.mark.parametrize("case", CASES)
def test_the_prompt_is_the_opened_arm_s_prompt_up_to_its_user_header(case):
    template = load(case)
    prompt = render_continuation(template, conversation())
    opened = render_user_turn(template, conversation())
    assert opened.text == prompt.text + prompt.markers.user_header
    assert prompt.text.endswith("The answer is 72." + CLOSE[case])
    assert prompt.markers.user_header == prompt.markers.user_header.lstrip()
    assert (prompt.template_hash, prompt.system) == (opened.template_hash, opened.system)


# Where the prompt is not the template's render of the finished conversation (no generation
# prompt): the template writes a conversation's LAST answer otherwise than a past one, and the
# prompt is the past one, as the opened arm's context has it. (the prompt's end, the render's end)
FINISHED_OTHERWISE = {
    "fixture/phi3": ("", "<|endoftext|>"),  # EOS after a finished conversation
    "fixture/gpt_oss": ("<|end|>", "<|return|>"),  # a final answer returns, a past one ends
    # The last answer after the last query keeps a (here empty) thinking block.
    "fixture/qwen3": (ANSWER + "<|im_end|>\n", "<think>\n\n</think>\n\n" + ANSWER + "<|im_end|>\n"),
    "published/nemotron_nano_v2": (ANSWER + "\n<SPECIAL_12>\n\n",
                                   "<think>\n\n" + ANSWER + "\n<SPECIAL_12>\n\n"),
    "published/apertus": ("<|assistant_end|>", ""),  # the last answer is left open
}


@pytest.mark.parametrize("case", CASES)
def test_the_prompt_is_the_plain_render_unless_a_last_answer_is_written_otherwise(case):
    template = load(case)
    prompt = render_continuation(template, conversation(system=False)).text
    plain = template.render(conversation(system=False))
    shared = template.lexer.common_prefix(prompt, plain)
    assert (prompt[len(shared):], plain[len(shared):]) == FINISHED_OTHERWISE.get(case, ("", ""))


@pytest.mark.parametrize("case", CASES)
def test_a_continuation_that_writes_a_user_turn_parses_to_user_with_its_text(case):
    template = load(case)
    prompt = render_continuation(template, conversation(system=False))
    text = user_turn_written_by_the_template(template, prompt.text)
    parsed = parse_continuation(prompt.markers, text)
    assert (parsed.role, parsed.user_turn, parsed.closed) == ("user", FOLLOW_UP, True)
    assert text[parsed.content_at:parsed.end_at].strip() == FOLLOW_UP
    assert text[parsed.header_at:parsed.content_at].strip() == prompt.markers.user_header.strip()
    # The engine, stopping at the prompt's stops only, ends exactly where the user turn closes.
    assert first_stop(text, prompt.stop) == parsed.end_at


@pytest.mark.parametrize("case", CASES)
def test_a_continuation_that_opens_an_assistant_turn_parses_to_assistant(case):
    template = load(case)
    prompt = render_continuation(template, conversation(system=False))
    asked = conversation(system=False)[:1]
    # The template's own generation prompt; [INST]-style templates write none (the assistant
    # speaks right after [/INST]): there the derived header stands for it.
    with_prompt = template.render(asked, True)
    shared = template.lexer.common_prefix(with_prompt, template.render(asked))
    text = (with_prompt[len(shared):] or prompt.markers.assistant_header) + "Let me check."
    parsed = parse_continuation(prompt.markers, text)
    assert (parsed.role, parsed.user_turn, parsed.header_at) == ("assistant", None, 0)
    # No end written yet: the turn runs to the end of the text (the token budget).
    assert (parsed.end_at, parsed.closed) == (len(text), False)


@pytest.mark.parametrize("case", CASES)
def test_an_end_of_sequence_parses_to_none(case):
    template = load(case)
    prompt = render_continuation(template, conversation())
    eos = template.eos_token
    for text in (eos, "\n" + eos, eos + "<|im_start|>user\nMore?", "", "  \n"):
        parsed = parse_continuation(prompt.markers, text)
        assert (parsed.role, parsed.user_turn) == ("none", None), repr(text)
        assert parsed.closed == (eos in text)
        assert parsed.end_at == first_stop(text, prompt.stop)


@pytest.mark.parametrize("case", CASES)
def test_words_outside_any_turn_parse_to_text(case):
    template = load(case)
    prompt = render_continuation(template, conversation(system=False))
    words = "User: and what about June?"
    parsed = parse_continuation(prompt.markers, "\n" + words + template.eos_token)
    assert (parsed.role, parsed.content_at, parsed.end_at) == ("text", 1, 1 + len(words))
    # Words first, then a user turn: the model did not hand the turn over by a header.
    user = user_turn_written_by_the_template(template, prompt.text)
    parsed = parse_continuation(prompt.markers, "Hope this helps." + user)
    assert (parsed.role, parsed.user_turn, parsed.end_at) == ("text", None, len("Hope this helps."))


# The system header where the template has a system turn of its own; templates that refuse a
# system message (Gemma) or write it into a user turn (Gemma 3, Mistral) or bare (DeepSeek) have
# none, and a system turn they open is not told from text.
SYSTEM_HEADER = {
    "fixture/chatml_qwen25": "<|im_start|>system\n",
    "fixture/chatml_smollm2": "<|im_start|>system\n",
    "fixture/qwen3": "<|im_start|>system\n",
    "fixture/llama3": "<|start_header_id|>system<|end_header_id|>\n\n",
    "fixture/phi3": "<|system|>\n",
    "fixture/gpt_oss": "<|start|>system<|message|>",
    "fixture/glm4": "<|system|>\n",
    "published/glm47_flash": "<|system|>",
    "published/nemotron_nano_v2": "<SPECIAL_10>System\n",
    "published/llama4": "<|header_start|>system<|header_end|>\n\n",
    "published/mistral_small3": "[SYSTEM_PROMPT]",
    "published/ministral_reasoning": "[SYSTEM_PROMPT]",
    "published/gemma4": "<|turn>system\n",
    "published/glm45": "<|system|>\n",
    "published/qwen3_coder": "<|im_start|>system\n",
    "published/kimi_k2_thinking": "<|im_system|>system<|im_middle|>",
    "published/minimax_m2": "]~b]system\n",
    "published/seed_oss": "<seed:bos>system\n",
    "published/apertus": "<|system_start|>",
    "published/lfm2": "<|im_start|>system\n",
    "published/granite4": "<|start_of_role|>system<|end_of_role|>",
    "published/phi4_reasoning": "<|im_start|>system<|im_sep|>",
    "published/command_a": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>",
    "published/exaone": "[|system|]",
}


@pytest.mark.parametrize("case", CASES)
def test_a_system_turn_parses_to_system_where_the_template_has_one(case):
    markers = render_continuation(load(case), conversation()).markers
    assert markers.system_header == SYSTEM_HEADER.get(case, "")
    if not markers.system_header:
        return
    text = markers.system_header + "From now on, answer in French." + markers.stop[0]
    parsed = parse_continuation(markers, text)
    assert (parsed.role, parsed.header_at, parsed.user_turn) == ("system", 0, None)
    assert text[parsed.content_at:parsed.end_at].strip() == "From now on, answer in French."


@pytest.mark.parametrize("case", ["fixture/chatml_qwen25", "fixture/llama3", "published/llama4",
                                  "published/qwen3_coder", "published/kimi_k2_thinking"])
def test_an_end_of_turn_that_is_also_the_end_of_sequence_ends_the_turn_the_model_opens(case):
    # <|im_end|> / <|eot_id|> close every turn and are the end of sequence: the prompt already
    # ends with one, so the first the model writes closes its own turn, or, before any header,
    # says it has nothing to add. The engine stops at it as a stop string, never before.
    template = load(case)
    prompt = render_continuation(template, conversation(system=False))
    eos = template.eos_token
    assert prompt.text.rstrip().endswith(eos) and eos in prompt.stop
    text = user_turn_written_by_the_template(template, prompt.text)
    parsed = parse_continuation(prompt.markers, text)
    assert text.startswith(eos, parsed.end_at) and parsed.user_turn == FOLLOW_UP
    assert parse_continuation(prompt.markers, eos + text).role == "none"


def test_an_engine_end_that_opens_the_user_turn_is_no_stop():
    # GLM's generation config lists <|user|> among its end-of-sequence ids: stopping there would
    # end every continuation at the user turn it is meant to show.
    template = load("fixture/glm4")
    ends = ("<|user|>", "<|observation|>")
    prompt = render_continuation(template, conversation(), ends=ends)
    assert "<|user|>" not in prompt.stop and "<|observation|>" in prompt.stop
    assert prompt.text.endswith("The answer is 72.")  # GLM closes no turn
    text = "<|user|>\n" + FOLLOW_UP + "<|assistant|>\nIt is half."
    parsed = parse_continuation(prompt.markers, text)
    assert (parsed.role, parsed.user_turn) == ("user", FOLLOW_UP)
    assert parse_continuation(prompt.markers, "<|observation|>").role == "none"
    # The answer going on is words before any header.
    assert parse_continuation(prompt.markers, " So 72 in all.<|user|>\nOk").role == "text"


def test_nemotron_s_user_turn_ends_at_the_token_that_opens_the_user_header():
    # A Nemotron user turn ends at <SPECIAL_11>, which opens the user header too: the
    # continuation stops at the assistant header instead, and the turn is cut as the probe cuts.
    prompt = render_continuation(load("published/nemotron_nano_v2"), conversation())
    assert "<SPECIAL_11>" not in prompt.stop and "<SPECIAL_11>Assistant" in prompt.stop
    assert "<SPECIAL_11>" in prompt.markers.user_stop
    text = f"<SPECIAL_11>User\n{FOLLOW_UP}\n<SPECIAL_11>Assistant\n"
    parsed = parse_continuation(prompt.markers, text)
    assert (parsed.role, parsed.user_turn) == ("user", FOLLOW_UP)
    assert first_stop(text, prompt.stop) == parsed.end_at
    # A second user header before the assistant's: the engine runs on, the turn is cut there.
    text = f"<SPECIAL_11>User\n{FOLLOW_UP}\n<SPECIAL_11>User\nAnd June?\n<SPECIAL_11>Assistant"
    parsed = parse_continuation(prompt.markers, text)
    assert (parsed.role, parsed.user_turn) == ("user", FOLLOW_UP)
    assert parsed.end_at == text.index("<SPECIAL_11>", parsed.content_at) < first_stop(
        text, prompt.stop)


def test_a_format_of_plain_role_names_has_them_as_headers():
    # No special token at all: the layout before "User:" closes the answer, the name opens a turn.
    source = ("{% for m in messages %}{{ '\\n\\n' + m['role'] | capitalize + ': ' + m['content'] }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '\\n\\nAssistant: ' }}{% endif %}")
    prompt = render_continuation(ChatTemplate(source, "plain"), conversation(system=False))
    assert prompt.text.endswith("The answer is 72.\n\n")
    assert prompt.markers.user_header == "User: "
    text = "User: Why halve it?\n\nAssistant: Because"
    parsed = parse_continuation(prompt.markers, text)
    assert (parsed.role, parsed.user_turn, parsed.content_at) == ("user", "Why halve it?", 6)


def test_a_user_turn_cut_by_the_budget_is_kept_and_said_open():
    markers = render_continuation(load("fixture/chatml_qwen25"), conversation()).markers
    parsed = parse_continuation(markers, "<|im_start|>user\nWhy did you")
    assert (parsed.role, parsed.user_turn, parsed.closed) == ("user", "Why did you", False)
    # A header cut off midway is no header.
    assert parse_continuation(markers, "<|im_st").role == "text"


def test_a_new_conversation_s_bos_says_nothing_unless_it_opens_a_header():
    mistral = render_continuation(load("fixture/mistral"), conversation()).markers
    parsed = parse_continuation(mistral, f"<s>[INST] {FOLLOW_UP} [/INST]")
    assert (parsed.role, parsed.header_at, parsed.user_turn) == ("user", 3, FOLLOW_UP)
    assert parse_continuation(mistral, "<s>").role == "none"
    # SmolLM2's BOS is <|im_start|>, the start of every header: it is no BOS to skip there.
    smollm2 = render_continuation(load("fixture/chatml_smollm2"), conversation()).markers
    assert smollm2.bos == "" and parse_continuation(smollm2, "<|im_start|>").role == "text"


def test_a_user_turn_s_thinking_is_split_off_as_the_probe_splits_it():
    markers = render_continuation(load("fixture/qwen3"), conversation()).markers
    text = f"<|im_start|>user\n<think>\nAsk about the halving.\n</think>\n\n{FOLLOW_UP}<|im_end|>"
    parsed = parse_continuation(markers, text)
    assert (parsed.user_turn, parsed.thinking) == (FOLLOW_UP, "Ask about the halving.")


def test_kept_thinking_is_in_the_continuation_prompt_as_in_the_opened_one():
    template = load("fixture/qwen3")
    prompt = render_continuation(template, conversation(), thinking=THOUGHT)
    assert THOUGHT in prompt.text
    assert render_user_turn(template, conversation(), thinking=THOUGHT).text == (
        prompt.text + prompt.markers.user_header)


def test_every_role_is_one_a_parse_can_give():
    assert CONTINUATION_ROLES == ("user", "assistant", "system", "text", "none")


@pytest.mark.parametrize("case", CASES)
def test_next_role_options_are_the_headers_the_parse_reads(case):
    template = load(case)
    prompt = render_continuation(template, conversation())
    options = dict(next_role_options(prompt.markers))
    assert set(options) == {"user", "assistant", "end"}
    # The user option is what the opened arm writes after the same prompt.
    assert render_user_turn(template, conversation()).text.startswith(prompt.text + options["user"])
    assert options["end"] == template.eos_token
    parsed = {name: parse_continuation(prompt.markers, option).role
              for name, option in options.items()}
    assert parsed == {"user": "user", "assistant": "assistant", "end": "none"}


def test_next_role_options_that_overlap_are_refused():
    template = load("fixture/glm4")
    options = next_role_options(continuation_markers(template, ("<|observation|>",)))
    # The template's end and the engine's, each an option of its own.
    assert [option for role, option in options if role == "end"] == [template.eos_token,
                                                                       "<|observation|>"]
    with pytest.raises(TemplateError, match=r"options assistant \('<\|assistant\|>'\) and end"):
        next_role_options(continuation_markers(template, ("<|assistant|>!",)))


def test_a_start_token_that_is_also_an_end_is_read_as_an_end():
    # Qwen2.5's GGUF names <|endoftext|> its BOS, and the engine ends a generation at it as at
    # <|im_end|> (its generation config lists both). A model that writes it after the answer
    # has stopped: the continuation is none, not the text the engine would read on into.
    qwen = load("fixture/chatml_qwen25")
    template = ChatTemplate(qwen.source, qwen.model, "<|endoftext|>", "<|im_end|>")
    ends = ("<|im_end|>", "<|endoftext|>")
    prompt = render_continuation(template, conversation(), ends=ends)
    assert prompt.markers.bos == "" and "<|endoftext|>" in prompt.stop
    after = "<|endoftext|>Human: and then?<|im_start|>user\nWhy?<|im_end|>"
    assert parse_continuation(prompt.markers, after).role == "none"
    assert parse_continuation(prompt.markers, "\n<|endoftext|>").role == "none"
    opened = "<|im_start|>user\n" + FOLLOW_UP + "<|endoftext|>"
    parsed = parse_continuation(prompt.markers, opened)
    assert (parsed.role, parsed.user_turn, parsed.closed) == ("user", FOLLOW_UP, True)
    # P(end) is the sum over every end: here the model's mass sits on <|endoftext|>.
    options = next_role_options(prompt.markers)
    assert [option for role, option in options if role == "end"] == list(ends)
    roles = [role for role, _ in options]
    probabilities = next_role_probabilities(
        roles, [math.log(p) for p in (0.0001, 0.0002, 0.0003, 0.9990)])
    assert probabilities["end"] == pytest.approx(0.9993)
    assert probabilities["other"] == pytest.approx(0.0004)
    # A BOS that is no end is still read as nothing said (a model starting a new conversation).
    plain = ChatTemplate(qwen.source, qwen.model, "<s>", "<|im_end|>")
    markers = render_continuation(plain, conversation()).markers
    assert markers.bos == "<s>"
    assert parse_continuation(markers, "<s><|im_start|>user\nWhy?<|im_end|>").role == "user"


def test_next_role_probabilities_leave_the_rest_to_other():
    names = ["user", "assistant", "end"]
    probabilities = next_role_probabilities(names, [math.log(0.5), math.log(0.25), math.log(0.05)])
    assert probabilities == pytest.approx({"user": 0.5, "assistant": 0.25, "end": 0.05,
                                           "other": 0.2})
    # Rounding never makes ``other`` negative; a missing option counts as zero.
    assert next_role_probabilities(["user"], [0.0])["other"] == 0.0
    assert next_role_probabilities(["user"], [math.log(0.9)])["assistant"] == 0.0
    with pytest.raises(ValueError, match="do not match the options"):
        next_role_probabilities(names, [0.0])
    with pytest.raises(ValueError, match="do not match the options"):
        next_role_probabilities(["tool"], [0.0])


def test_the_probe_s_conversation_must_end_in_an_answer():
    with pytest.raises(TemplateError, match="ending in an assistant message"):
        render_continuation(load("fixture/chatml_qwen25"), conversation()[:2])


def test_the_tiny_model_scores_the_tokens_it_would_read(tiny_backend):
    # score_options encodes the prompt and each option apart: they must be the tokens of the
    # prompt followed by that option, or the probability is of a text the model never sees.
    tokenizer, template = tiny_backend.tokenizer, tiny_backend.template
    prompt = render_continuation(template, conversation())
    assert prompt.text.endswith("The answer is 72.<|im_end|>\n")
    assert tokenizer.eos_token in prompt.stop  # <|im_end|> ends the turn and the sequence
    for _, option in next_role_options(prompt.markers):
        alone = tokenizer(option, add_special_tokens=False)["input_ids"]
        assert prompt_token_ids(tokenizer, prompt.text) + alone == prompt_token_ids(
            tokenizer, prompt.text + option), option
