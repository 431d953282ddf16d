"""Training data: a held-out split of the evaluation dataset, and the conversations to train on.

The split keeps the probe's evaluation items out of training by construction: datasets load as a
stable prefix (``limit`` keeps the first N items), so the first ``eval_items`` items are exactly
the items ``userturn run --limit eval_items`` probes, and training draws from the items after
them (minus any whose query repeats an evaluation query). Both id lists go into the manifest.

Self-generated collaboration data is a probe run on the training items (resumable, stored like
any run): the model answers each item greedily, writes user turns under the user header at a
sampling temperature, and the offline cascade (the rules, then the learned classifier) labels
them. Rejection sampling keeps the turns labelled
``follow_up``; each becomes ``[query, answer, follow-up]``, optionally with the model's own next
answer, and the model's correct single-turn answers are mixed in to protect task accuracy. An
answer that was scored wrong stays in a conversation as context only (it carries no loss).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from userturn.backends import Backend
from userturn.chat.render import render_assistant_turn
from userturn.config import Experiment
from userturn.data import Dataset, load_dataset
from userturn.data.conversations import (
    CONVERSATION_FORMATS,
    CONVERSATION_KEYS,
    content_at,
    role_at,
)
from userturn.data.reading import RowError, check_file, read_rows
from userturn.errors import DatasetError
from userturn.probe.pipeline import Progress, run_experiment
from userturn.records import GenerationParams, Request
from userturn.store.turns import read_answers, read_turns
from userturn.train.masks import check_roles

Conversation = list[dict[str, Any]]  # messages; a message may carry "loss": False


@dataclass(frozen=True)
class Split:
    eval: Dataset  # the probe's held-out items: the dataset's first ``eval_items``
    train: Dataset  # the items after them, minus repeated queries
    dropped: tuple[str, ...] = ()  # candidates dropped: an eval query or template again


def split_dataset(spec: str, *, eval_items: int, train_items: int, seed: int) -> Split:
    """The first ``eval_items`` items for evaluation, the next ``train_items`` for training that
    neither repeat an evaluation query nor (GSM-Symbolic) instantiate an evaluation item's
    template. Up to four times ``train_items`` candidates are read to find them."""
    if eval_items < 1 or train_items < 1:
        raise DatasetError("eval_items and train_items must each be at least 1")
    loaded = load_dataset(spec, limit=eval_items + 4 * train_items, seed=seed)
    held, rest = loaded.items[:eval_items], loaded.items[eval_items:]
    queries = {item.query.strip() for item in held}
    templates = {item.metadata["template"] for item in held if "template" in item.metadata}

    def overlaps(item: Any) -> bool:
        return (item.query.strip() in queries
                or item.metadata.get("template", object()) in templates)

    train: list[Any] = []
    dropped: list[str] = []
    for item in rest:
        if len(train) == train_items:
            break
        (dropped.append(item.id) if overlaps(item) else train.append(item))
    if not train:
        raise DatasetError(f"{spec} has {len(loaded.items)} items: none is left for training "
                           f"after the {eval_items} evaluation items")
    return Split(replace(loaded, items=held), replace(loaded, items=tuple(train)), tuple(dropped))


@dataclass
class SelfGenStats:
    items: int = 0
    answers_correct: int = 0
    answers_scored: int = 0
    user_turns: int = 0
    labels: dict[str, int] = field(default_factory=dict)
    kept_follow_ups: int = 0
    single_turn: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def self_generated(backend: Backend, train: Dataset, exp: Experiment, *, next_answer: bool,
                   mix_correct: bool,
                   progress: Progress | None = None) -> tuple[list[Conversation], SelfGenStats]:
    """Collaboration conversations written by the model itself (see the module docstring):
    ``exp`` probes ``backend`` on ``train`` (its temperatures, samples, budgets and folder)."""
    store = run_experiment(exp, backends={backend.spec: backend}, progress=progress,
                           datasets=[train])
    items = {item.id: item for item in train.items}
    stats = SelfGenStats(items=len(items))
    answers = [a for a in read_answers(store) if a.error is None]
    stats.answers_scored = sum(a.correct is not None for a in answers)
    stats.answers_correct = sum(bool(a.correct) for a in answers)
    conversations: list[Conversation] = []
    for turn in read_turns(store):  # the run's own labels: rules, then the classifier
        if turn.error is not None or turn.probed != backend.spec:
            continue
        stats.user_turns += 1
        stats.labels[turn.status] = stats.labels.get(turn.status, 0) + 1
        if not turn.follow_up:
            continue
        item = items[turn.item_id]
        answer: dict[str, Any] = {"role": "assistant", "content": turn.answer}
        if turn.answer_correct is False:
            answer["loss"] = False
        conversations.append([*_plain(item.messages), answer,
                              {"role": "user", "content": turn.user_turn}])
    stats.kept_follow_ups = len(conversations)
    if next_answer and conversations:
        _add_next_answers(backend, conversations, exp.plan.max_tokens)
    if mix_correct:
        for a in answers:
            if a.correct:
                conversations.append([*_plain(items[a.item_id].messages),
                                      {"role": "assistant", "content": a.text}])
                stats.single_turn += 1
    store.close()
    return conversations, stats


def _plain(messages: Iterable[Mapping[str, str]]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _add_next_answers(backend: Backend, conversations: list[Conversation],
                      max_tokens: int) -> None:
    """The model's own greedy answer to its follow-up, appended to each conversation."""
    params = GenerationParams(0.0, 1.0, max_tokens)
    requests = []
    for conversation in conversations:
        prompt = render_assistant_turn(backend.template, _plain(conversation))
        requests.append(Request(prompt.text, params, prompt.stop, 0))
    for start in range(0, len(requests), backend.chunk_size):
        chunk = requests[start:start + backend.chunk_size]
        for offset, generation in enumerate(backend.complete(chunk)):
            if generation.error is None and generation.text.strip():
                conversations[start + offset].append(
                    {"role": "assistant", "content": generation.text})


def conversations_file(path: str | Path, *, limit: int | None = None) -> list[Conversation]:
    """Whole multi-turn conversations from a user file: ShareGPT (``conversations`` of
    ``from``/``value``), messages (``messages`` of ``role``/``content``) or preference rows
    (``prompt`` messages plus a ``chosen`` reply, message or message list). Leading system
    messages are kept; the rest must alternate user and assistant, starting with the user."""
    file = check_file(path, CONVERSATION_FORMATS, "conversation data")
    rows, _ = read_rows(file, allow_truncated=True)
    out: list[Conversation] = []
    for row in rows:
        where = f"{file.name} {row.unit} {row.number}"
        if row.error is not None or not isinstance(row.data, Mapping):
            raise DatasetError(f"{where}: {row.error or 'expected an object'}")
        try:
            messages = _row_messages(row.data)
            check_roles(messages)
        except ValueError as exc:
            raise DatasetError(f"{where}: {exc}") from None
        except RowError as exc:
            raise DatasetError(f"{where}: {exc.field}: {exc.reason}") from None
        except DatasetError as exc:
            raise DatasetError(f"{where}: {exc}") from None
        if len(messages) >= 2:
            out.append(messages)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise DatasetError(f"{file.name} holds no conversation with a user turn and an answer")
    return out


def _row_messages(data: Mapping[str, Any]) -> Conversation:
    key = next((k for k in CONVERSATION_KEYS if k in data), None)
    if key is not None:
        raw = data[key]
        if not isinstance(raw, list):
            raise DatasetError(f"{key}: expected a list of messages")
        return [{"role": role_at(raw, i, key), "content": content_at(raw, i, key)}
                for i in range(len(raw))]
    if "prompt" in data and "chosen" in data:
        prompt, chosen = data["prompt"], data["chosen"]
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if isinstance(chosen, str):
            chosen = [{"role": "assistant", "content": chosen}]
        elif isinstance(chosen, Mapping):
            chosen = [chosen]
        raw = [*prompt, *chosen]
        return [{"role": role_at(raw, i, "prompt"), "content": content_at(raw, i, "prompt")}
                for i in range(len(raw))]
    raise DatasetError(f"a row holds one of {', '.join(CONVERSATION_KEYS)}, or prompt and "
                       "chosen")


def write_conversations(path: Path, conversations: Sequence[Conversation]) -> str:
    """Write the training conversations as JSONL; return their sha256 (for the manifest)."""
    text = "".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in conversations)
    path.write_text(text, encoding="utf-8")
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
