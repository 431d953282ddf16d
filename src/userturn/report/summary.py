"""The run's headline table: per model, dataset and temperature, the genuine follow-up rate with a
95% interval bootstrapped over items, the label distribution, n, errors, and task accuracy."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from ..records import HUMAN, LABELS
from ..stats import Rate, clustered_rate
from ..store import RunStore

NUMERIC = ("T", "items", "turns", "follow-up", "undecided", "invalid", "errors", "accuracy",
           "vs real turn")
LABEL_HEADERS = {"follow_up": "follow-up", "generic": "generic", "new_query": "new",
                 "restatement": "restate", "assistant_drift": "drift", "meta": "meta",
                 "empty": "empty"}


@dataclass(frozen=True)
class Row:
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


def counts_toward_rate(turn: Mapping[str, Any]) -> bool:
    """Whether a user turn is in the denominator of a follow-up rate: every generated turn a
    labeller could look at. An undecided turn has not been judged a follow-up (so a rate is a
    lower bound until a judge labels it); failed generations and invalid verdicts are out."""
    return turn["error"] is None and (turn["label"] is not None or not turn["label_error"])


def summarize(store: RunStore, labels: Sequence[str] | None = None) -> list[Row]:
    """One row per model, answerer, dataset, perturbation and temperature; ``labels``: label
    sources in priority order (default: the run's own)."""
    turns = store.user_turns(labels)
    accuracy = _accuracy(store)
    real = _real_next_turns(store, {t["dataset"] for t in turns})
    groups: dict[tuple[str, str, str, str, float], list[dict[str, Any]]] = defaultdict(list)
    for turn in turns:
        groups[(turn["model"], turn["answerer"], turn["dataset"], turn["perturbation"],
                turn["temperature"])].append(turn)
    rows = []
    for (model, answerer, dataset, perturbation, temperature), group in sorted(
            groups.items(), key=lambda kv: (*kv[0][:3], kv[0][3] != "none", *kv[0][3:])):
        ok = [t for t in group if t["error"] is None]
        labelled = [t for t in ok if t["label"] is not None]
        counted = [t for t in group if counts_toward_rate(t)]
        rows.append(Row(
            model=model, dataset=dataset, temperature=temperature,
            items=len({t["item_id"] for t in group}), turns=len(group),
            follow_up=clustered_rate((t["item_id"], t["label"] == "follow_up") for t in counted),
            labels=dict(Counter(t["label"] for t in labelled)),
            undecided=sum(1 for t in ok if t["label"] is None and not t["label_error"]),
            invalid=sum(1 for t in ok if t["label"] is None and t["label_error"]),
            errors=len(group) - len(ok),
            accuracy=accuracy.get((model if answerer == "self" else answerer, dataset)),
            answerer=answerer, perturbation=perturbation,
            similarity=_similarity(ok, real) if model != HUMAN else None,
        ))
    return rows


def _real_next_turns(store: RunStore, datasets: set[str]) -> dict[tuple[str, str], str]:
    return {(dataset, item_id): record["metadata"]["next_user_turn"]
            for dataset in datasets for item_id, record in store.items(dataset).items()
            if record.get("metadata", {}).get("next_user_turn")}


def _similarity(turns: Sequence[dict[str, Any]], real: Mapping[tuple[str, str], str]
                ) -> float | None:
    scores = [word_f1(t["text"], real[(t["dataset"], t["item_id"])]) for t in turns
              if (t["dataset"], t["item_id"]) in real]
    return sum(scores) / len(scores) if scores else None


def word_f1(generated: str, reference: str) -> float:
    """Bag-of-words F1 (as in SQuAD): how much of the real turn's wording the model's turn has."""
    a, b = Counter(generated.lower().split()), Counter(reference.lower().split())
    common = sum((a & b).values())
    if not common:
        return 0.0
    precision, recall = common / sum(a.values()), common / sum(b.values())
    return 2 * precision * recall / (precision + recall)


def _accuracy(store: RunStore) -> dict[tuple[str, str], Rate]:
    scored: dict[tuple[str, str], list[tuple[str, bool]]] = defaultdict(list)
    for turn in store.assistant_turns():
        if turn["correct"] is not None:
            scored[(turn["model"], turn["dataset"])].append((turn["item_id"], bool(turn["correct"])))
    return {key: clustered_rate(pairs) for key, pairs in scored.items()}


def assistant_errors(store: RunStore) -> int:
    return sum(1 for turn in store.assistant_turns() if turn["error"] is not None)


def _pct(rate: Rate | None) -> str:
    if rate is None or rate.n == 0:
        return "-"
    return f"{100 * rate.value:.0f}% [{100 * rate.low:.0f}-{100 * rate.high:.0f}]"


def print_summary(rows: list[Row], console: Console, *, assistant_failures: int = 0) -> None:
    # Answerer and perturbation columns appear only when the experiment varies them.
    extra = [name for name, values in (("answerer", {r.answerer for r in rows}),
                                       ("perturbation", {r.perturbation for r in rows}))
             if values - {"self", "none"}]
    table = Table(title="Genuine follow-up rate, 95% CI bootstrapped over items")
    similar = any(row.similarity is not None for row in rows)
    for name in ("model", *extra, "dataset", "T", "items", "turns", "follow-up", "undecided",
                 "invalid", "errors", "accuracy", *(["vs real turn"] if similar else [])):
        table.add_column(name, justify="right" if name in NUMERIC else "left")
    for row in rows:
        table.add_row(row.model, *(getattr(row, name) for name in extra), row.dataset,
                      _temperature(row.temperature), str(row.items), str(row.turns),
                      _pct(row.follow_up), str(row.undecided), str(row.invalid),
                      str(row.errors), _pct(row.accuracy),
                      *([_f1(row.similarity)] if similar else []))
    console.print(table)
    labels = Table(title="Labels of the generated user turns (counts)")
    for name in ("model", *extra, "dataset", "T", *LABEL_HEADERS.values(), "undecided"):
        labels.add_column(name, justify="left" if name in ("model", "dataset", *extra) else "right")
    for row in rows:
        labels.add_row(row.model, *(getattr(row, name) for name in extra), row.dataset,
                       _temperature(row.temperature),
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
    if assistant_failures:
        notes.append(f"{assistant_failures} assistant turn(s) failed; their items have no user "
                     "turns yet (re-run to retry)")
    for note in notes:
        console.print(f"[dim]{note}[/dim]")


def _f1(value: float | None) -> str:
    return "-" if value is None else f"F1 {value:.2f}"


def _temperature(value: float) -> str:
    return "greedy" if value <= 0 else f"{value:g}"


def print_instruction_accuracy(store: RunStore, console: Console) -> None:
    """IFEval/IFBench runs: the four accuracies the benchmarks define, per model and dataset."""
    import json

    from ..data.instructions import aggregate
    from ..records import Score

    groups: dict[tuple[str, str], list[Score]] = defaultdict(list)
    rows = store.db.execute(
        "SELECT p.model, p.dataset, s.correct, s.details FROM scores s JOIN plan p "
        "ON p.key = s.key WHERE s.scorer IN ('ifeval', 'ifbench')")
    for row in rows:
        groups[(row["model"], row["dataset"])].append(
            Score(bool(row["correct"]), None, None, json.loads(row["details"])))
    if not groups:
        return
    table = Table(title="Instruction following of the greedy answers (as IFEval defines it)")
    for name in ("model", "dataset", "prompt strict", "prompt loose", "instruction strict",
                 "instruction loose", "prompts", "undecided prompts"):
        table.add_column(name, justify="left" if name in ("model", "dataset") else "right")
    for (model, dataset), scores in sorted(groups.items()):
        result = aggregate(scores)
        table.add_row(model, dataset, *(_share(result[k]) for k in (
            "prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")),
            str(result["n_prompts"]), str(result["n_undecided_prompts"]))
    console.print(table)
    console.print("[dim]undecided prompts have an instruction that cannot be verified offline "
                  "(docs/datasets.md); they are left out of the prompt-level accuracies here and "
                  "count as not followed in the accuracy column above[/dim]")


def _share(value: float | int | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
