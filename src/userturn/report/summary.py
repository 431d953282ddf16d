"""The run's headline table: per model, dataset and temperature, the genuine follow-up rate with a
95% interval clustered by item, the label distribution, n, errors, and task accuracy."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from userturn.labels.calibration import human_label, is_human
from userturn.labels.offline_error import offline_error
from userturn.labels.sources import OFFLINE
from userturn.records import HUMAN, LABELS, Answer, Condition, Turn
from userturn.report.numbers import (
    LABEL_HEADERS,
    f1,
    interval_text,
    percent,
    rate_interval,
    temperature,
)
from userturn.stats.correction import Corrected, Observation, corrected_rate
from userturn.stats.rates import Rate, clustered_rate

NUMERIC = ("T", "items", "turns", "follow-up", "undecided", "invalid", "errors", "accuracy",
           "vs real turn")
CORRECTION = ("corrected", "human only", "human labels")


@dataclass(frozen=True)
class SummaryRow:
    model: str
    dataset: str
    temperature: float
    items: int
    turns: int
    follow_up: Rate  # over labelled and undecided turns; invalid and failed ones are beside it
    labels: dict[str, int] = field(default_factory=dict)
    undecided: int = 0  # no labeller decided (the rules leave hard cases to a judge)
    invalid: int = 0  # a judge failed or answered out of the label set
    errors: int = 0  # the generation itself failed
    accuracy: Rate | None = None
    answerer: str = "self"
    perturbation: str = "none"
    # Mean word-overlap F1 between the generated turns and the data's real next user turn, where
    # the data has one (None otherwise).
    similarity: float | None = None
    # The follow-up rate corrected for the labeller's errors with the human labels among the
    # row's turns (PPI++, userturn.stats.correction); None with the reason in ``correction_note``
    # when there are too few, and both None when no person labelled a turn of the row.
    corrected: Corrected | None = None
    correction_note: str | None = None
    human_labels: int = 0
    # The same rate from the human labels alone (PPI with the labeller's weight 0), shown beside
    # the corrected one: what the labeller's verdicts add is the difference in width.
    human_only: Corrected | None = None
    # Every counted turn was labelled by the rules or the classifier alone, and no person labelled
    # any: the rate carries the offline labeller's error on an unseen model (labels.offline_error).
    offline_only: bool = False

    def status_counts(self) -> dict[str, int]:
        """Turns per label and per status of the turns without one (undecided, invalid,
        failed): every turn of the row is counted once."""
        return {**self.labels, "undecided": self.undecided, "invalid": self.invalid,
                "failed": self.errors}


def summarize(turns: Sequence[Turn], answers: Sequence[Answer],
              inclusion: Mapping[str, float] | None = None) -> list[SummaryRow]:
    """One row per model, answerer, dataset, perturbation and temperature, from a run's turns
    (read with the label sources that should decide) and its answers (task accuracy).
    ``inclusion``: each human-labelled turn's inclusion probability in its calibration sample
    (:func:`~userturn.labels.calibration.inclusion_probabilities`); a turn missing from it counts
    as drawn by simple random sampling from the run's turns."""
    accuracy = _accuracy(answers)
    probability = _inclusion(turns, inclusion or {})
    groups: dict[Condition, list[Turn]] = defaultdict(list)
    for turn in turns:
        groups[Condition.of(turn)].append(turn)
    rows = []
    # In condition order, each condition's original context before its perturbations.
    for c, group in sorted(groups.items(), key=lambda kv: (
            kv[0].model, kv[0].answerer, kv[0].dataset, kv[0].perturbation != "none", kv[0])):
        status = Counter(t.status for t in group)
        rows.append(SummaryRow(
            model=c.model, dataset=c.dataset, temperature=c.temperature,
            items=len({t.item_id for t in group}), turns=len(group),
            follow_up=clustered_rate((t.item_id, t.follow_up) for t in group
                                     if t.counts_toward_rate),
            labels=dict(Counter(t.label for t in group if t.error is None and t.label)),
            undecided=status["undecided"], invalid=status["invalid"], errors=status["failed"],
            accuracy=accuracy.get((c.model if c.answerer == "self" else c.answerer, c.dataset)),
            answerer=c.answerer, perturbation=c.perturbation,
            similarity=_similarity(group) if c.model != HUMAN else None,
            offline_only=_offline_only(group),
            **_correction(group, probability),
        ))
    return rows


def _offline_only(group: Sequence[Turn]) -> bool:
    counted = [t for t in group if t.counts_toward_rate]
    return bool(counted) and all((t.label_source is None or t.label_source in OFFLINE)
                                 and human_label(t)[0] is None for t in counted)


def _inclusion(turns: Sequence[Turn], given: Mapping[str, float]) -> dict[str, float]:
    eligible = [t for t in turns if t.counts_toward_rate]
    labelled = [t.key for t in eligible if human_label(t)[0] is not None]
    fallback = len(labelled) / len(eligible) if eligible else 1.0
    return {key: given.get(key, fallback) for key in labelled}


def _correction(group: Sequence[Turn], inclusion: Mapping[str, float]) -> dict[str, Any]:
    """The corrected rate of a row's turns, or why there is none."""
    counted = [t for t in group if t.counts_toward_rate]
    humans = sum(1 for t in counted if human_label(t)[0] is not None)
    if not humans:
        return {}
    if any(is_human(t.label_source) for t in counted):
        return {"human_labels": humans,
                "correction_note": "the rate is read with human labels, nothing to correct"}
    observations = [Observation(t.item_id, t.follow_up, human_label(t)[0],
                                inclusion.get(t.key, 1.0)) for t in counted]
    result = corrected_rate(observations)
    if isinstance(result, str):
        return {"human_labels": humans, "correction_note": result}
    alone = corrected_rate(observations, lam=0.0)
    return {"human_labels": humans, "corrected": result,
            "human_only": alone if isinstance(alone, Corrected) else None}


def corrected_text(row: SummaryRow, c: Corrected | None = None) -> str:
    """The corrected rate (or ``c``, such as the human-only rate) as ``value [low-high]``."""
    c = row.corrected if c is None else c
    if c is None:
        return "-"
    return interval_text(c.value, c.low, c.high)


def _similarity(turns: Sequence[Turn]) -> float | None:
    scores = [word_f1(t.user_turn, t.next_user_turn) for t in turns
              if t.error is None and t.next_user_turn]
    return sum(scores) / len(scores) if scores else None


def word_f1(generated: str, reference: str) -> float:
    """Bag-of-words F1 (as in SQuAD): how much of the real turn's wording the model's turn has."""
    a, b = Counter(generated.lower().split()), Counter(reference.lower().split())
    common = sum((a & b).values())
    if not common:
        return 0.0
    precision, recall = common / sum(a.values()), common / sum(b.values())
    return 2 * precision * recall / (precision + recall)


def _accuracy(answers: Sequence[Answer]) -> dict[tuple[str, str], Rate]:
    scored: dict[tuple[str, str], list[tuple[str, bool]]] = defaultdict(list)
    for answer in answers:
        if answer.correct is not None:
            scored[(answer.model, answer.dataset)].append((answer.item_id, answer.correct))
    return {key: clustered_rate(pairs) for key, pairs in scored.items()}


def assistant_errors(answers: Sequence[Answer]) -> int:
    return sum(1 for answer in answers if answer.error is not None)


def print_summary(rows: list[SummaryRow], console: Console, *, assistant_failures: int = 0) -> None:
    # Answerer and perturbation columns appear only when the experiment varies them.
    extra = [name for name, values in (("answerer", {r.answerer for r in rows}),
                                       ("perturbation", {r.perturbation for r in rows}))
             if values - {"self", "none"}]
    table = Table(title="Genuine follow-up rate, 95% CI clustered by item")
    similar = any(row.similarity is not None for row in rows)
    humans = any(row.human_labels for row in rows)
    for name in ("model", *extra, "dataset", "T", "items", "turns", "follow-up",
                 *(CORRECTION if humans else []), "undecided",
                 "invalid", "errors", "accuracy", *(["vs real turn"] if similar else [])):
        table.add_column(name, justify="right" if name in NUMERIC + CORRECTION else "left")
    for row in rows:
        # escape: a variant's name (MODEL[user=...]) is not rich markup.
        table.add_row(Text(row.model), *(getattr(row, name) for name in extra), Text(row.dataset),
                      temperature(row.temperature), str(row.items), str(row.turns),
                      rate_interval(row.follow_up),
                      *([corrected_text(row), corrected_text(row, row.human_only),
                         str(row.human_labels)] if humans else []),
                      str(row.undecided), str(row.invalid),
                      str(row.errors), rate_interval(row.accuracy),
                      *([f1(row.similarity)] if similar else []))
    console.print(table)
    labels = Table(title="Labels of the generated user turns (counts)")
    for name in ("model", *extra, "dataset", "T", *LABEL_HEADERS.values(), "undecided"):
        labels.add_column(name, justify="left" if name in ("model", "dataset", *extra) else "right")
    for row in rows:
        labels.add_row(Text(row.model), *(getattr(row, name) for name in extra), Text(row.dataset),
                       temperature(row.temperature),
                       *(str(row.labels.get(label, 0)) for label in LABELS), str(row.undecided))
    console.print(labels)
    notes = ["follow-up: share of user turns labelled follow_up; accuracy: task score of the "
             "greedy assistant answer"]
    if any(row.undecided for row in rows):
        notes.append("undecided: turns the rules leave to an LLM judge; they count as not "
                     "follow-up, so the rate is a lower bound until judged (userturn judge RUN "
                     "--judge SPEC)")
    if any(row.model == HUMAN for row in rows):
        notes.append("human: the data's real next user turns, labelled the same way (the "
                     "reference the models' rates are read against); vs real turn: word-overlap "
                     "F1 of the generated turns with the real one")
    if humans:
        notes.append("corrected: the follow-up rate corrected for the labeller's errors with the "
                     "human labels (PPI++, clustered by item; docs/statistics.md); human only: "
                     "the rate of the human labels alone; human labels: the turns of the row a "
                     "person labelled")
        notes += [f"{row.model} {row.dataset} T={temperature(row.temperature)}: correction not "
                  f"shown: {row.correction_note}" for row in rows if row.correction_note]
    notes += offline_notes(rows)
    if assistant_failures:
        notes.append(f"{assistant_failures} assistant turn(s) failed; their items have no user "
                     "turns yet (re-run to retry)")
    for note in notes:
        console.print(note, style="dim", markup=False)


def offline_notes(rows: Sequence[SummaryRow]) -> list[str]:
    """The offline labeller's measured error, where some rate rests on offline labels alone."""
    error = offline_error() if any(row.offline_only for row in rows) else None
    return [error.note()] if error is not None else []


def print_instruction_accuracy(answers: Sequence[Answer], console: Console) -> None:
    """IFEval/IFBench runs: the four accuracies the benchmarks define, per model and dataset."""
    from userturn.data.instructions import aggregate
    from userturn.records import Score

    groups: dict[tuple[str, str], list[Score]] = defaultdict(list)
    for answer in answers:
        if answer.scorer in ("ifeval", "ifbench"):
            groups[(answer.model, answer.dataset)].append(
                Score(bool(answer.correct), None, None, answer.details))
    if not groups:
        return
    table = Table(title="Instruction following of the greedy answers (as IFEval defines it)")
    for name in ("model", "dataset", "prompt strict", "prompt loose", "instruction strict",
                 "instruction loose", "prompts", "undecided prompts"):
        table.add_column(name, justify="left" if name in ("model", "dataset") else "right")
    for (model, dataset), scores in sorted(groups.items()):
        result = aggregate(scores)
        table.add_row(Text(model), Text(dataset), *(percent(result[k], 1, "-") for k in (
            "prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")),
            str(result["n_prompts"]), str(result["n_undecided_prompts"]))
    console.print(table)
    console.print("undecided prompts have an instruction that cannot be verified offline "
                  "(docs/datasets.md); they are left out of the prompt-level accuracies here and "
                  "count as not followed in the accuracy column above", style="dim")
