"""Controlled perturbations of the assistant turn.

Each perturbed context is paired with the unperturbed context of the same item (same answer
before the change), so its effect is a paired difference. Every perturbation has an expected
direction: a model that reads the conversation should react to the change in the user turn it
writes. The report shows whether it moved that way.

| spec | what changes | expected follow-up rate vs original |
|---|---|---|
| `truncate[:F]` | the last fraction F (default 0.5) of the answer's words is cut | up: ask for the rest |
| `append_question[:generic]` | "Does that make sense? ..." is appended | up: answer it |
| `append_question:specific` | a question about the answer's own result is appended | up: answer it |
| `wrong_answer` | the final number is changed (datasets with a numeric answer) | up: dispute it |
| `swap` | another item's answer replaces this one's | up: point out the mismatch |
| `empty` | the answer is empty | up: ask where the answer is |
| `refusal` | the answer is a refusal | up: push back or rephrase |
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from userturn.errors import ConfigError
from userturn.records import Turn

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
GENERIC_QUESTION = "Does that make sense, or would you like me to explain any step in more detail?"
REFUSAL = "I'm sorry, but I can't help with that request."
EXPECTED = {"truncate": "up", "append_question": "up", "wrong_answer": "up", "swap": "up",
            "empty": "up", "refusal": "up"}


@dataclass(frozen=True)
class Perturbation:
    """A parsed perturbation spec such as ``truncate:0.3``."""

    name: str
    param: str | None = None

    @property
    def spec(self) -> str:
        return self.name if self.param is None else f"{self.name}:{self.param}"

    @property
    def expected(self) -> str:
        return EXPECTED[self.name]

    def apply(self, answer: str, item_id: str, others: Mapping[str, str]) -> str | None:
        """The perturbed answer, or None where this perturbation does not apply to the item."""
        return _APPLY[self.name](self, answer, item_id, others)


def parse_perturbation(spec: str) -> Perturbation:
    name, _, param = spec.strip().partition(":")
    if name not in _APPLY:
        known = ", ".join(sorted(_APPLY))
        raise ConfigError(f"unknown perturbation {spec!r}; known: {known}")
    perturbation = Perturbation(name, param or None)
    _VALIDATE.get(name, lambda p: None)(perturbation)
    return perturbation


def _check_truncate(p: Perturbation) -> None:
    try:
        fraction = float(p.param or 0.5)
    except ValueError:
        raise ConfigError(f"truncate takes a fraction, e.g. truncate:0.3 (got {p.param!r})") from None
    if not 0 < fraction < 1:
        raise ConfigError(f"truncate fraction must be between 0 and 1 (got {fraction})")


def _check_question(p: Perturbation) -> None:
    if p.param not in (None, "generic", "specific"):
        raise ConfigError(f"append_question takes generic or specific (got {p.param!r})")


def _truncate(p: Perturbation, answer: str, item_id: str, others: Mapping[str, str]) -> str | None:
    words = answer.split(" ")
    keep = int(len(words) * (1 - float(p.param or 0.5)))
    return " ".join(words[:keep]) if 0 < keep < len(words) else None


def _append_question(p: Perturbation, answer: str, item_id: str,
                     others: Mapping[str, str]) -> str | None:
    if p.param != "specific":
        return f"{answer.rstrip()}\n\n{GENERIC_QUESTION}"
    numbers = NUMBER.findall(answer)
    if not numbers:
        return None
    return (f"{answer.rstrip()}\n\nDo you want me to walk you through how I got "
            f"{numbers[-1]}, or check it another way?")


def _wrong_answer(p: Perturbation, answer: str, item_id: str,
                  others: Mapping[str, str]) -> str | None:
    matches = list(NUMBER.finditer(answer))
    if not matches:
        return None
    final = matches[-1].group()
    wrong = _changed_number(final, item_id)
    # Every occurrence of the final number changes, so the answer stays self-consistent.
    return re.sub(rf"(?<![\d.]){re.escape(final)}(?![\d])", wrong, answer)


def _changed_number(number: str, item_id: str) -> str:
    value = float(number.replace(",", ""))
    shift = 1 + int(hashlib.sha256(item_id.encode()).hexdigest(), 16) % 9  # 1..9, per item
    changed = value + shift
    return f"{changed:g}" if "." in number else str(int(changed))


def _swap(p: Perturbation, answer: str, item_id: str, others: Mapping[str, str]) -> str | None:
    """The answer of the next item (in id order, cyclically): a real answer to another query."""
    ids = sorted(others)
    if len(ids) < 2 or item_id not in others:
        return None
    return others[ids[(ids.index(item_id) + 1) % len(ids)]]


def _empty(p: Perturbation, answer: str, item_id: str, others: Mapping[str, str]) -> str:
    return ""


def _refusal(p: Perturbation, answer: str, item_id: str, others: Mapping[str, str]) -> str:
    return REFUSAL


_APPLY: dict[str, Callable[..., str | None]] = {
    "truncate": _truncate, "append_question": _append_question, "wrong_answer": _wrong_answer,
    "swap": _swap, "empty": _empty, "refusal": _refusal,
}
_VALIDATE: dict[str, Callable[[Perturbation], None]] = {
    "truncate": _check_truncate, "append_question": _check_question,
}


# Why a perturbation leaves an item out (it returns None for it), in a reader's words.
WHY_NOT = {"truncate": "the answer is too short to cut",
           "append_question": "the answer has no number to ask about",
           "wrong_answer": "the answer has no number to change",
           "swap": "there is no other item's answer to swap in"}


@dataclass(frozen=True)
class Unapplied:
    """A perturbation that could not change some answers of a condition: those items have no
    perturbed turns and drop out of its paired comparison."""

    model: str
    answerer: str
    dataset: str
    perturbation: str
    items: int  # the items it could not apply to
    of: int  # the items with original turns

    def line(self, where: str) -> str:
        """How many, of which condition (``where``), and why, as the report says it."""
        why = WHY_NOT.get(self.perturbation.partition(":")[0], "it does not apply")
        return (f"{self.perturbation} could not change {self.items} of {self.of} answers of "
                f"{where} ({why}): those items have no {self.perturbation} turns and are left "
                "out of its comparison")


def unapplied(turns: Sequence[Turn], perturbations: Sequence[Perturbation]) -> list[Unapplied]:
    """Where each perturbation could not apply, found as the run found it: applied again to the
    original answers the turns followed (a swap among the same answers)."""
    originals: dict[tuple[str, str, str], dict[str, str]] = {}
    for turn in turns:
        if turn.perturbation == "none":
            originals.setdefault((turn.probed, turn.answerer, turn.dataset), {})[turn.item_id] = \
                turn.answer
    found = []
    for (model, answerer, dataset), answers in sorted(originals.items()):
        for perturbation in perturbations:
            missing = sum(perturbation.apply(answer, item, answers) is None
                          for item, answer in answers.items())
            if missing:
                found.append(Unapplied(model, answerer, dataset, perturbation.spec, missing,
                                       len(answers)))
    return found


def parse_perturbations(specs: Sequence[str]) -> list[Perturbation]:
    parsed = [parse_perturbation(spec) for spec in specs if spec.strip() != "none"]
    seen = [p.spec for p in parsed]
    if len(seen) != len(set(seen)):
        raise ConfigError(f"perturbations listed twice: {seen}")
    return parsed
