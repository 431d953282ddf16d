"""A run as its readers see it: typed :class:`Turn` and :class:`Answer` values, read once.

``read_turns(store, labels=...)`` is the one read path for generated user turns: every reader
(summary, report, compare, agreement, annotate, export, training, the judge stage) takes the list
it returns. The SQL stays in the store; this module resolves labels and decides, in one place,
whether a turn counts toward a rate (:attr:`Turn.status`). :data:`COLUMNS` is the one column list
of a user turn, used by the export, the report's ``user_turns`` table and the sample browser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from userturn.records import Case, Item, Message
from userturn.store.database import RunStore

STATUSES = ("undecided", "invalid", "failed")  # what a turn without a label is instead
COLUMNS = ("model", "answerer", "dataset", "perturbation", "temperature", "sample_index",
           "item_id", "context", "query", "answer", "answer_correct", "user_turn",
           "raw_user_turn", "thinking", "finish_reason", "error", "label", "label_source",
           "rationale", "label_error", "status", "prompt", "key")


@dataclass(frozen=True)
class StoredLabel:
    """One source's label of a turn as stored (``label`` None: undecided, or invalid with
    ``error``)."""

    source: str
    version: str
    label: str | None
    rationale: str | None
    error: str | None
    probability: float | None = None
    """How sure the source is (the learned classifier's calibrated probability), else None."""

    def record(self, key: str) -> dict[str, Any]:
        return {"key": key, "source": self.source, "version": self.version, "label": self.label,
                "rationale": self.rationale, "error": self.error,
                "probability": self.probability}


@dataclass(frozen=True)
class Turn:
    """One generated user turn of a run, with its context and its labels."""

    model: str
    """The probed model that wrote the turn (``human``: the data's real next user turn)."""
    answerer: str
    """Who wrote the assistant answer: ``self``, ``reference``, ``data`` or a model spec."""
    dataset: str
    perturbation: str
    """The perturbation applied to the answer, ``none`` for the original context."""
    temperature: float
    """Sampling temperature of the user turn; 0 is greedy."""
    sample_index: int
    item_id: str
    context: str
    """Id of the conversation the turn was generated in (item, answerer and perturbation)."""
    key: str
    """The generation's key in the run store."""
    query: str
    """The last user message of the item's conversation."""
    answer: str
    """The assistant answer the turn follows, as shown to the model (perturbed or not)."""
    answer_correct: bool | None
    """Task score of the assistant answer (None: not scored)."""
    user_turn: str
    """The visible text of the generated user turn."""
    raw_user_turn: str
    """The generated text with special tokens (and any thinking) kept."""
    thinking: str | None
    """A reasoning model's thinking, split off the turn (None: no thinking)."""
    finish_reason: str
    error: str | None
    """Why the generation failed (None: it did not)."""
    prompt: str
    """The exact prompt the model continued."""
    label: str | None
    """The resolved label: the first label among the chosen sources (None: none decided)."""
    label_source: str | None
    """Which source gave :attr:`label`."""
    rationale: str | None
    label_error: str | None
    """With no label: the first source's error (a judge's invalid verdict), else None."""
    messages: tuple[Message, ...] = ()
    """The item's conversation up to the answer."""
    next_user_turn: str | None = None
    """The data's real next user turn, where the dataset has one."""
    labels: tuple[StoredLabel, ...] = field(default=())
    """Every stored label of the turn, from every source, by source name."""

    @property
    def status(self) -> str:
        """The label, or why there is none: ``undecided`` (no source decided), ``invalid`` (a
        judge failed or answered out of the label set) or ``failed`` (the generation failed)."""
        if self.error is not None:
            return "failed"
        return self.label or ("invalid" if self.label_error else "undecided")

    @property
    def counts_toward_rate(self) -> bool:
        """Whether the turn is in the denominator of a follow-up rate: every generated turn a
        labeller could look at. An undecided turn has not been judged a follow-up (a rate is a
        lower bound until a judge labels it); invalid verdicts and failed generations are out."""
        return self.status not in ("invalid", "failed")

    @property
    def probability(self) -> float | None:
        """The probability the deciding source gave :attr:`label` (the classifier gives one)."""
        return next((lab.probability for lab in self.labels if lab.source == self.label_source),
                    None)

    @property
    def follow_up(self) -> bool:
        return self.label == "follow_up"

    def case(self, assistant_header: str = "") -> Case:
        """What a classifier sees. Where thinking was split off, the raw text (which still holds
        it) is replaced by the visible text: classifiers label the visible turn only."""
        raw = self.raw_user_turn if self.thinking is None else self.user_turn
        return Case(self.query, self.answer, self.user_turn, raw, assistant_header,
                    self.thinking or "")

    def record(self) -> dict[str, Any]:
        """The turn as one flat row of :data:`COLUMNS`."""
        return {name: getattr(self, name) for name in COLUMNS}

    def conversation(self, system: str | None = None) -> list[dict[str, str]]:
        """The whole conversation the turn was generated in, then the generated turn: the
        run's system prompt (``system``, where the item has none of its own), the item's
        messages up to the query, the assistant answer as shown, and the user turn. One
        meaning in every export (the Inspect log's messages, the dataset's ``messages``)."""
        opening = [{"role": "system", "content": system}] if system and not any(
            m["role"] == "system" for m in self.messages) else []
        return [*opening, *({"role": m["role"], "content": m["content"]} for m in self.messages),
                {"role": "assistant", "content": self.answer},
                {"role": "user", "content": self.user_turn}]

    def source_values(self, source: str) -> tuple[str | None, float | None]:
        """What ``source`` said of the turn: its label (``undecided`` where it abstained,
        ``invalid`` where it failed) and probability; (None, None) where it did not label it."""
        lab = next((lab for lab in self.labels if lab.source == source), None)
        if lab is None:
            return None, None
        return lab.label or ("invalid" if lab.error else "undecided"), lab.probability


def source_column(source: str) -> str:
    """The flat column of a label source: ``label_rules``, ``label_judge_x_r1`` (characters
    other than letters and digits as ``_``, so a column reads as one word in pandas and SQL)."""
    return "label_" + re.sub(r"[^A-Za-z0-9]+", "_", source).strip("_")


def flat_columns(sources: Sequence[str]) -> list[str]:
    """:data:`COLUMNS`, then every source's label and probability (``probability_SOURCE``)."""
    return [*COLUMNS, *[name for source in sources for name in (
        source_column(source), "probability" + source_column(source)[len("label"):])]]


def flat_records(turns: Sequence[Turn]) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and rows of a flat export (CSV, JSON Lines, Parquet, a DataFrame): one row
    per turn with :data:`COLUMNS` and the label of every source that labelled a turn of the
    run (empty where that source did not label the turn), as the Hugging Face export's
    ``labels`` keeps them."""
    sources = list(dict.fromkeys(lab.source for turn in turns for lab in turn.labels))
    columns = flat_columns(sources)
    rows = []
    for turn in turns:
        row = turn.record()
        for source in sources:
            label, probability = turn.source_values(source)
            column = source_column(source)
            row[column], row["probability" + column[len("label"):]] = label, probability
        rows.append(row)
    return columns, rows


@dataclass(frozen=True)
class Answer:
    """One assistant answer of a run (the turn the probe's user turns follow) with its score."""

    model: str
    dataset: str
    item_id: str
    key: str
    text: str
    thinking: str | None
    error: str | None
    finish_reason: str
    correct: bool | None
    extracted: str | None
    reference: str | None
    scorer: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    """Further metrics of the score, e.g. IFEval's loose and instruction-level accuracy."""


def label_sources(store: RunStore, labels: str | Sequence[str] | None = None) -> list[str]:
    """The label sources in priority order: ``labels`` as given, or the run's own."""
    if labels is None:
        return store.label_sources()
    return [labels] if isinstance(labels, str) else list(labels)


def read_turns(store: RunStore, labels: str | Sequence[str] | None = None) -> list[Turn]:
    """Every planned user turn of the run, in the store's order.

    ``labels`` names the label sources in priority order (default: the run's own); a turn takes
    the first non-empty label, and ``label_error`` keeps the first error (e.g. a judge's invalid
    verdict) when none of them labelled it.
    """
    sources = label_sources(store, labels)
    stored: dict[str, list[StoredLabel]] = {}
    for found in store.label_rows():
        stored.setdefault(found.key, []).append(StoredLabel(
            found.source, found.version, found.label, found.rationale, found.error,
            found.probability))
    items: dict[str, dict[str, Item]] = {}
    turns = []
    for row in store.user_turn_rows():
        if row.dataset not in items:
            items[row.dataset] = store.items(row.dataset)
        item = items[row.dataset].get(row.item_id)
        messages = item.messages if item is not None else ()
        own = tuple(stored.get(row.key, ()))
        turns.append(Turn(
            model=row.model, answerer=row.answerer, dataset=row.dataset,
            perturbation=row.perturbation, temperature=row.temperature,
            sample_index=row.sample_index, item_id=row.item_id, context=row.context,
            key=row.key, query=_query(messages), answer=row.answer or "",
            answer_correct=row.correct, user_turn=row.text, raw_user_turn=row.raw_text,
            thinking=row.thinking, finish_reason=row.finish_reason, error=row.error,
            prompt=row.prompt, messages=messages,
            next_user_turn=item.next_user_turn if item is not None else None,
            labels=own, **_resolve(own, sources)))
    return turns


def _query(messages: Sequence[Message]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else ""


def _resolve(labels: Sequence[StoredLabel], sources: Sequence[str]) -> dict[str, str | None]:
    by_source = {label.source: label for label in labels}
    error = None
    for source in sources:
        found = by_source.get(source)
        if found is None:
            continue
        if found.label is not None:
            return {"label": found.label, "label_source": source, "rationale": found.rationale,
                    "label_error": None}
        error = error or found.error
    return {"label": None, "label_source": None, "rationale": None, "label_error": error}


def read_answers(store: RunStore) -> list[Answer]:
    """Every planned assistant answer with its task score, by model, dataset and item."""
    return [Answer(row.model, row.dataset, row.item_id, row.key, row.text, row.thinking,
                   row.error, row.finish_reason, row.correct, row.extracted, row.reference,
                   row.scorer, row.details)
            for row in store.answer_rows()]
