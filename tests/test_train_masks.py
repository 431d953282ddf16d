"""Training labels: exactly the chosen turns carry loss, written as the template writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from userturn.chat.render import ChatTemplate
from userturn.errors import TemplateError
from userturn.train.masks import IGNORE, build_example, loss_spans

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
FAMILIES = json.loads((TEMPLATES / "families.json").read_text(encoding="utf-8"))

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "2+3 = 5."},
    {"role": "user", "content": "And 2+4?"},
    {"role": "assistant", "content": "That is 6."},
]
# How each family closes a user turn and an answer in history; what it writes between the
# assistant header of the generation prompt and the answer's text (gpt-oss: the channel).
USER_END = {"chatml_qwen25": "<|im_end|>", "chatml_smollm2": "<|im_end|>", "qwen3": "<|im_end|>",
            "llama3": "<|eot_id|>", "gemma": "<end_of_turn>", "gemma3": "<end_of_turn>",
            "phi3": "<|end|>", "gpt_oss": "<|end|>", "glm4": "<|assistant|>",
            "deepseek": "<｜Assistant｜>"}
ANSWER_END = {**USER_END, "glm4": "<|user|>", "deepseek": "<｜end▁of▁sentence｜>"}
LAST_ANSWER_END = {**ANSWER_END, "gpt_oss": "<|return|>", "glm4": ""}
ANSWER_OPEN = {"gpt_oss": "<|channel|>final<|message|>"}


def template(name: str) -> ChatTemplate:
    spec = FAMILIES[name]
    return ChatTemplate((TEMPLATES / spec["file"]).read_text(encoding="utf-8"), name,
                        spec.get("bos_token"), spec.get("eos_token"), spec.get("variables", {}))


@pytest.mark.parametrize("family", sorted(USER_END))
def test_spans_are_the_turns_with_their_end_markers(family: str) -> None:
    text, spans = loss_spans(template(family), CONVERSATION, "both")
    opened = ANSWER_OPEN.get(family, "")
    assert [text[s:e] for s, e in spans] == [
        f"{opened}2+3 = 5.{ANSWER_END[family]}",
        f"And 2+4?{USER_END[family]}",
        f"{opened}That is 6.{LAST_ANSWER_END[family]}",
    ]


@pytest.mark.parametrize("loss_on, expected", [
    ("assistant", ["2+3 = 5.<|im_end|>", "That is 6.<|im_end|>"]),
    # The opening query is the task, not a follow-up: only user turns after an answer train.
    ("user", ["And 2+4?<|im_end|>"]),
    ("both", ["2+3 = 5.<|im_end|>", "And 2+4?<|im_end|>", "That is 6.<|im_end|>"]),
])
def test_loss_on_chooses_the_roles(loss_on: str, expected: list[str]) -> None:
    text, spans = loss_spans(template("chatml_smollm2"), CONVERSATION, loss_on)
    assert [text[s:e] for s, e in spans] == expected


def test_a_message_marked_without_loss_is_context_only() -> None:
    messages = [dict(m) for m in CONVERSATION]
    messages[2]["loss"] = False  # a wrong answer kept as the context of a good follow-up
    text, spans = loss_spans(template("chatml_smollm2"), messages, "both")
    assert [text[s:e] for s, e in spans] == ["And 2+4?<|im_end|>", "That is 6.<|im_end|>"]


def test_labels_unmask_exactly_the_spans_on_a_real_tokenizer(tiny_backend) -> None:
    tokenizer, chat = tiny_backend.tokenizer, tiny_backend.template
    example = build_example(tokenizer, chat, CONVERSATION, "user")
    assert example is not None
    assert len(example.labels) == len(example.input_ids)
    runs, current = [], []
    for token, label in zip(example.input_ids, example.labels):
        if label == IGNORE:
            if current:
                runs.append(current)
            current = []
        else:
            assert label == token
            current.append(token)
    runs += [current] if current else []
    decoded = [tokenizer.decode(run, skip_special_tokens=False) for run in runs]
    assert decoded == [example.text[s:e] for s, e in example.spans] == ["And 2+4?<|im_end|>"]
    # Everything else, the system prompt and the headers included, is masked.
    assert example.trained_tokens == len(tokenizer("And 2+4?<|im_end|>",
                                                   add_special_tokens=False)["input_ids"])


def test_truncation_that_leaves_no_trained_token_drops_the_example(tiny_backend) -> None:
    example = build_example(tiny_backend.tokenizer, tiny_backend.template, CONVERSATION, "user",
                            max_length=8)
    assert example is None


def test_bad_conversations_get_clear_errors() -> None:
    chat = template("chatml_smollm2")
    with pytest.raises(ValueError, match="two user messages in a row"):
        loss_spans(chat, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                   "both")
    with pytest.raises(ValueError, match="starts with a user message"):
        loss_spans(chat, [{"role": "assistant", "content": "a"}], "both")
    with pytest.raises(ValueError, match="loss_on must be one of"):
        loss_spans(chat, CONVERSATION, "everything")
    # [INST] templates move the system prompt into the LAST user message: the first answer's
    # prompt is then not a prefix of the conversation, and the span cannot be trusted.
    with pytest.raises(TemplateError, match="moves the system prompt"):
        loss_spans(template("mistral"), CONVERSATION, "both")
    assert loss_spans(template("mistral"), CONVERSATION[1:], "both")[1]
