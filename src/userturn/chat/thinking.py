"""Reasoning models: splitting a generated turn into its thinking and its visible text.

Done once, centrally, on the raw text every backend returns (backends stay unaware of thinking).
The formats among the templates we claim:

- ``think``: ``<think>...</think>`` before the visible text (Qwen3, DeepSeek-R1, and models that
  emit it under a plain template). The opening tag may sit in the PROMPT (templates that open the
  block in the generation prompt): then the generation starts inside the thinking. A block that is
  never closed means the thinking ran out of tokens: nothing visible was written.
- ``channel`` (Gemma 4): the same shape with ``<|channel>thought\n...<channel|>``; ``seed``
  (Seed-OSS): ``<seed:think>...</seed:think>``. A ``<think>`` tag is plain text to these
  templates, so each is split on its own tags only.
- ``harmony`` (gpt-oss): messages on channels, ``<|channel|>analysis<|message|>...<|end|>`` then
  ``<|start|>assistant<|channel|>final<|message|>...``. The final channel, or a message without a
  channel (a user message), is visible; every other channel (analysis, commentary) is thinking.
  Servers that skip special tokens return ``analysis...assistantfinal...``; that fused form is
  recognised too, because no one writes "assistantfinal" by hand.
"""

from __future__ import annotations

import re
from typing import Literal

ThinkingFormat = Literal["think", "harmony", "channel", "seed"]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
# The tag pair of each block format: (opening, closing, the label an opening carries first).
TAGS: dict[str, tuple[str, str, str]] = {
    "think": (_THINK_OPEN, _THINK_CLOSE, ""),
    "channel": ("<|channel>", "<channel|>", "thought"),
    "seed": ("<seed:think>", "</seed:think>", ""),
}
_HARMONY_START = "<|start|>"
_HARMONY_ENDS = re.compile(r"<\|(?:end|return|call)\|>")
_HARMONY_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_FUSED = re.compile(r"\s*analysis(.*?)assistantfinal(.*)", re.DOTALL)


def thinking_format(template_source: str) -> ThinkingFormat:
    """The thinking format of a chat template, read from its source."""
    if "<|channel|>" in template_source:
        return "harmony"
    if "<|channel>" in template_source:
        return "channel"
    if "<seed:think>" in template_source or "<seed:bos>" in template_source:
        return "seed"
    return "think"


def prompt_opens_thinking(prompt: str, fmt: ThinkingFormat = "think") -> bool:
    """The generation prompt ends inside an opened thinking block of ``fmt``."""
    if fmt == "harmony":
        return False
    opening, _, label = TAGS[fmt]
    tail = prompt.rstrip()
    return tail.endswith(opening) or bool(label) and tail.endswith(opening + label)


def split_thinking(text: str, fmt: ThinkingFormat, *, opened: bool = False
                   ) -> tuple[str | None, str]:
    """``(thinking, visible)`` of a generated turn (stop marker already removed).

    ``thinking`` is None when the turn has no thinking at all, and "" for an empty block (the
    model thought nothing, which is not the same as a model that does not think). ``opened``: the
    prompt ended inside a ``<think>`` block. Both parts are stripped.
    """
    if fmt == "harmony":
        return _split_harmony(text)
    return _split_block(text, opened, *TAGS[fmt])


def _split_block(text: str, opened: bool, opening: str, closing: str,
                 label: str) -> tuple[str | None, str]:
    if opened and opening not in text.split(closing, 1)[0]:
        text = opening + text  # the block was opened by the prompt
    block = re.compile(re.escape(opening) + "(.*?)" + re.escape(closing), re.DOTALL)
    thoughts = [m.group(1) for m in block.finditer(text)]
    rest = block.sub("", text)
    if closing in rest:  # opened in a prompt we were not told about: all before is thinking
        before, rest = rest.split(closing, 1)
        thoughts.insert(0, before)
    if opening in rest:  # never closed: the thinking ran out of tokens
        rest, unclosed = rest.split(opening, 1)
        thoughts.append(unclosed)
    if not thoughts:
        return None, text.strip()
    # A channel opening names itself first ("<|channel>thought\n..."): not part of the thought.
    thoughts = [t.strip()[len(label):] if label and t.strip().startswith(label) else t
                for t in thoughts]
    return "\n\n".join(t.strip() for t in thoughts if t.strip()), rest.strip()


def _split_harmony(text: str) -> tuple[str | None, str]:
    if "<|" not in text:
        fused = _FUSED.fullmatch(text)
        if fused:
            return fused.group(1).strip(), fused.group(2).strip()
        return None, text.strip()
    thoughts: list[str] = []
    visible: list[str] = []
    # The first piece continues the header the prompt opened (a user message's body, or after
    # "<|start|>assistant" a channel header); each later piece is one "<|start|>ROLE..." message.
    for index, piece in enumerate(text.split(_HARMONY_START)):
        if "<|message|>" in piece:
            header, _, body = piece.partition("<|message|>")
        elif index == 0 and not _HARMONY_CHANNEL.search(piece):
            header, body = "", piece
        else:  # a header whose message never started: cut off by the token budget
            header, body = piece, ""
        body = _HARMONY_ENDS.sub("", body).strip()
        channel = _HARMONY_CHANNEL.search(header)
        if channel and channel.group(1) != "final":
            thoughts.append(body)
        elif body:
            visible.append(body)
    if not thoughts:
        return None, "\n\n".join(visible)
    return "\n\n".join(t for t in thoughts if t), "\n\n".join(visible)


def thinking_block(fmt: ThinkingFormat, thinking: str) -> tuple[str, str]:
    """How a kept thinking is written before the visible answer in history: ``(before, marker)``
    where ``marker`` is what must directly precede the answer in the render (harmony: the final
    channel's header, which the thinking message is put in front of)."""
    if fmt == "harmony":
        final = "<|channel|>final<|message|>"
        return (f"<|channel|>analysis<|message|>{thinking}<|end|><|start|>assistant{final}",
                final)
    if fmt == "channel":
        return f"<|channel>thought\n{thinking}<channel|>", ""
    if fmt == "seed":
        return f"<seed:think>{thinking}</seed:think>", ""
    return f"<think>\n{thinking}\n</think>\n\n", ""
