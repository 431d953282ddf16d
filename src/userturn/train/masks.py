"""Which tokens of a rendered conversation carry the training loss.

We build the labels ourselves from the model's own chat template, for the same reason the probe
renders its own prompts: the loss must fall on exactly the turns the user chose, written exactly as
the template writes them. Each trained message's span starts where the template has just opened
that turn (the prompt the model would continue: :func:`render_assistant_turn` for an answer,
:func:`render_user_turn` for a user turn) and ends after the turn's end-of-turn marker, so the
model learns to write the turn and to stop. Headers, the system prompt and every untrained turn
are masked with -100.

``loss_on``: ``assistant`` (assistant turns), ``user`` (user turns that follow an assistant turn:
the opening query is the task, as in the probe, not a follow-up), or ``both``. A message with
``"loss": False`` is never trained (a wrong answer kept as context of a good follow-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from userturn.chat.render import (
    ChatTemplate,
    derive_markers,
    merge_system,
    prompt_token_ids,
    render_assistant_turn,
    render_user_turn,
    visible_text,
)
from userturn.chat.template_tokens import common_prefix
from userturn.errors import TemplateError

LossOn = Literal["assistant", "user", "both"]
LOSS_ON: tuple[str, ...] = ("assistant", "user", "both")
IGNORE = -100  # the label value transformers' loss skips


@dataclass(frozen=True)
class Example:
    """One training sequence: token ids, labels (-100 where masked) and the trained text spans."""

    input_ids: list[int]
    labels: list[int]
    text: str
    spans: tuple[tuple[int, int], ...]  # character spans of ``text`` that carry loss

    @property
    def trained_tokens(self) -> int:
        return sum(label != IGNORE for label in self.labels)


def trains(message: Mapping[str, Any], position: int, messages: Sequence[Mapping[str, Any]],
           loss_on: str) -> bool:
    """Whether this message carries loss under ``loss_on``."""
    if loss_on not in LOSS_ON:
        raise ValueError(f"loss_on must be one of {', '.join(LOSS_ON)}, got {loss_on!r}")
    if message.get("loss") is False:
        return False
    role = message["role"]
    if role == "assistant":
        return loss_on in ("assistant", "both")
    if role == "user":
        follows_answer = position > 0 and messages[position - 1]["role"] == "assistant"
        return follows_answer and loss_on in ("user", "both")
    return False


def loss_spans(template: ChatTemplate, messages: Sequence[Mapping[str, Any]],
               loss_on: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The rendered conversation and the character spans that carry loss."""
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    check_roles(plain)
    try:
        text = template.render(plain)
    except TemplateError:
        if plain[0]["role"] != "system":
            raise
        # A template without a system role: the system text goes into the first user message,
        # as the probe does. Positions shift by one.
        plain, messages = merge_system(plain), list(messages[1:])
        text = template.render(plain)
    markers = derive_markers(template)
    # In history an answer may end with the end-of-turn both roles share rather than with what
    # ends a generated answer (gpt-oss: <|end|> in history, <|return|> when generating).
    assistant_stops = (*markers.assistant_stop, markers.user_end.strip())
    spans = []
    for position, message in enumerate(messages):
        if not trains(message, position, messages, loss_on):
            continue
        if message["role"] == "assistant":
            opened = render_assistant_turn(template, plain[:position]).text
            stops: Sequence[str] = assistant_stops
        else:
            opened = render_user_turn(template, plain[:position]).text
            stops = markers.user_stop
        # The generation prompt may say more than history does (Qwen3's empty think block when
        # thinking is off): the turn starts where the two part.
        start = len(common_prefix(opened, text))
        before = text[:start]
        if any(visible_text(m["content"]).strip() not in before for m in plain[:position]):
            raise TemplateError(
                f"chat template of {template.model} renders message {position} differently "
                "once the conversation goes on (for example, it moves the system prompt into "
                "the last user message); its loss span cannot be located")
        spans.append((start, _turn_end(text, start, message["content"], stops,
                                       template.model, position)))
    return text, tuple(spans)


def _turn_end(text: str, start: int, content: str, stops: Sequence[str], model: str,
              position: int) -> int:
    """Just after the end-of-turn marker that follows the message's own text."""
    shown = visible_text(content) or content.strip()
    at = text.find(shown, start) if shown else start
    if at < 0:
        raise TemplateError(f"chat template of {model} rewrote message {position}; its loss "
                            "span cannot be located")
    after = at + len(shown)
    ends = [(text.find(stop, after), stop) for stop in dict.fromkeys(stops)
            if stop and text.find(stop, after) >= 0]
    if not ends:  # the conversation's last turn in a template that closes it with nothing
        return len(text.rstrip())
    found, stop = min(ends)
    return found + len(stop)


def check_roles(messages: Sequence[Mapping[str, str]]) -> None:
    roles = [m["role"] for m in messages if m["role"] != "system"]
    if not roles or roles[0] != "user":
        raise ValueError("a training conversation starts with a user message")
    for before, after in zip(roles, roles[1:]):
        if before == after:
            raise ValueError(f"a training conversation alternates user and assistant; "
                             f"found two {before} messages in a row")


def build_example(tokenizer: Any, template: ChatTemplate, messages: Sequence[Mapping[str, Any]],
                  loss_on: str, max_length: int | None = None) -> Example | None:
    """Token ids and labels of one conversation; None when no trained token survives truncation
    (the caller counts those) or nothing in it is trained."""
    text, spans = loss_spans(template, messages, loss_on)
    if not spans:
        return None
    ids, offsets = _tokens_with_offsets(tokenizer, text)
    # A token is trained when it overlaps a span: SentencePiece folds the space before a word
    # into the word's token, which then starts one character before the turn does.
    labels = [token if end_at > begin and any(begin < end and end_at > start
                                              for start, end in spans)
              else IGNORE for token, (begin, end_at) in zip(ids, offsets)]
    if max_length is not None:
        ids, labels = ids[:max_length], labels[:max_length]
    if all(label == IGNORE for label in labels):
        return None
    return Example(ids, labels, text, spans)


def _tokens_with_offsets(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids exactly as the probe tokenizes a prompt (BOS once), with character offsets."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]
    expected = prompt_token_ids(tokenizer, text)
    if expected[1:] == ids and len(expected) == len(ids) + 1:  # the probe adds BOS here too
        ids, offsets = expected, [(0, 0), *offsets]
    elif expected != ids:
        raise ValueError("the tokenizer splits the conversation differently with and without "
                         "offsets; cannot build labels")
    return ids, offsets
