"""A run as its readers see it: the run's :class:`~userturn.records.Turn` and
:class:`~userturn.records.Answer` values, read once.

``read_turns(store, labels=...)`` is the one read path for generated user turns: every reader
(summary, report, compare, agreement, annotate, export, training, the judge stage) takes the list
it returns. The SQL stays in the store; this module resolves which stored label decides a turn.
The values themselves live in :mod:`userturn.records`, so the statistics over them (``stats/``)
need not import the store. The flat export's columns (:func:`flat_records`) are written here.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Mapping, Sequence, TypedDict

from userturn.errors import ConfigError
from userturn.records import COLUMNS, DEFAULT_ARM, Answer, Item, Message, StoredLabel, Turn
from userturn.store.database import RunStore
from userturn.store.rows import UserTurnRow


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


def label_sources(store: RunStore, labels: str | Sequence[str] | None = None) -> list[str]:
    """The label sources in priority order: ``labels`` as given, or the run's own."""
    if labels is None:
        return store.label_sources()
    return [labels] if isinstance(labels, str) else list(labels)


def check_label_sources(store: RunStore, labels: Sequence[str] | None,
                        flag: str = "--labels") -> None:
    """``labels`` (as the user named them, with ``flag``) are sources the run holds: a typo
    would show every turn undecided (or leave nothing to compare). None: the run's own."""
    if labels is None:
        return
    stored = store.stored_label_sources()
    if not labels:  # `--labels ''` or `,,,`: not "the run's own sources", which is no flag
        raise ConfigError(f"{flag} names no label source; give one or more of: "
                          f"{', '.join(stored) or 'none'} (or leave {flag} out)")
    unknown = [name for name in labels if name not in stored]
    if unknown:
        raise ConfigError(f"{flag}: no labels from {', '.join(unknown)} in {store.folder}; "
                          f"it holds: {', '.join(stored) or 'none'}")


def read_turns(store: RunStore, labels: str | Sequence[str] | None = None) -> list[Turn]:
    """Every planned user turn of the run, in the store's order, with every label stored for it.

    ``labels`` names the label sources in priority order (default: the run's own); a turn takes
    the first non-empty label, and ``label_error`` keeps the first failed verdict ranked above
    it (a failed verdict never stands in for a label). The same turns resolved with other
    sources, or with labels written since, are :func:`with_sources` and :func:`with_labels`:
    neither reads the store again.
    """
    sources = label_sources(store, labels)
    stored = read_labels(store)
    items: dict[str, dict[str, Item]] = {}
    turns = []
    for row in store.user_turn_rows():
        if row.dataset not in items:
            items[row.dataset] = store.items(row.dataset)
        item = items[row.dataset].get(row.item_id)
        messages = item.messages if item is not None else ()
        own = stored.get(row.key, ())
        continuation = row.arm != DEFAULT_ARM
        turns.append(Turn(
            model=row.model, answerer=row.answerer, dataset=row.dataset,
            perturbation=row.perturbation, temperature=row.temperature,
            sample_index=row.sample_index, item_id=row.item_id, context=row.context,
            key=row.key, query=_query(messages), answer=row.answer or "",
            answer_correct=row.correct,
            # A continuation's user turn is the part it wrote as the user (chat.continuation);
            # its whole text, whoever it had speak, is the raw text.
            user_turn=(row.user_turn or "") if continuation else row.text,
            raw_user_turn=row.raw_text,
            thinking=row.thinking, finish_reason=row.finish_reason, error=row.error,
            prompt=row.prompt, messages=messages,
            next_user_turn=item.next_user_turn if item is not None else None,
            labels=own, **_resolve(own, sources), arm=row.arm,
            next_role=row.next_role if continuation else None,
            boundary=row.boundary if continuation else None,
            role_probabilities=_role_probabilities(row) if continuation else None,
            user_variant=row.user_variant, enable_thinking=row.enable_thinking))
    return turns


def read_labels(store: RunStore) -> dict[str, tuple[StoredLabel, ...]]:
    """Every stored label, by turn key, each turn's in source order (as :func:`read_turns` gives
    them): what a labelling stage changes, read without the turns."""
    stored: dict[str, list[StoredLabel]] = {}
    for found in store.label_rows():
        stored.setdefault(found.key, []).append(StoredLabel(
            found.source, found.version, found.label, found.rationale, found.error,
            found.probability))
    return {key: tuple(labels) for key, labels in stored.items()}


def with_sources(turns: Sequence[Turn], sources: Sequence[str]) -> list[Turn]:
    """``turns`` with each label resolved among ``sources`` instead, from the labels they hold:
    :func:`read_turns` with those sources, without reading again."""
    return [replace(turn, **_resolve(turn.labels, sources)) for turn in turns]


def with_labels(turns: Sequence[Turn], labels: Mapping[str, Sequence[StoredLabel]],
                sources: Sequence[str]) -> list[Turn]:
    """``turns`` holding ``labels`` (key -> every stored label, :func:`read_labels`) resolved
    among ``sources``: the turns a labelling stage changed, without reading the turns again."""
    return [replace(turn, labels=tuple(labels.get(turn.key, ())),
                    **_resolve(labels.get(turn.key, ()), sources)) for turn in turns]


def _role_probabilities(row: UserTurnRow) -> dict[str, float] | None:
    """The continuation's next-role probabilities, ``other`` the rest of the mass (None: the
    backend scored none)."""
    if row.p_user is None or row.p_assistant is None or row.p_end is None:
        return None
    known = {"user": row.p_user, "assistant": row.p_assistant, "end": row.p_end}
    return {**known, "other": max(0.0, 1.0 - sum(known.values()))}


def _query(messages: Sequence[Message]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else ""


class _Resolved(TypedDict):
    """The fields of :class:`Turn` a choice of label sources decides."""

    label: str | None
    label_source: str | None
    rationale: str | None
    label_error: str | None


def _resolve(labels: Sequence[StoredLabel], sources: Sequence[str]) -> _Resolved:
    """The first label among ``sources``, in order. A source whose verdict failed (an error: a
    judge request that failed, a reply outside the label set) decides nothing: the turn keeps
    the next source's label, and the failure is kept beside it as ``label_error``."""
    by_source = {label.source: label for label in labels}
    error = None
    for source in sources:
        found = by_source.get(source)
        if found is None:
            continue
        if found.label is not None:
            return {"label": found.label, "label_source": source, "rationale": found.rationale,
                    "label_error": error}
        error = error or found.error
    return {"label": None, "label_source": None, "rationale": None, "label_error": error}


def read_answers(store: RunStore) -> list[Answer]:
    """Every planned assistant answer with its task score, by model, dataset and item."""
    return store.answer_rows()
