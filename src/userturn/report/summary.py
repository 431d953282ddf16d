"""The run's headline table in the terminal: per condition, the genuine follow-up rate with a
95% interval clustered by item, the label distribution, n, errors, and task accuracy (the rows
are :func:`userturn.stats.summary.summarize`'s)."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from userturn.labels.offline_error import offline_error
from userturn.labels.sources import classifier_of, is_offline
from userturn.records import HUMAN, LABELS, Answer, is_human
from userturn.report.numbers import (
    LABEL_HEADERS,
    f1,
    interval_text,
    percent,
    rate_interval,
    temperature,
)
from userturn.stats.correction import Corrected
from userturn.stats.summary import SummaryRow

# The offline error card's figures for each shipped classifier's source (labels/offline_error.json).
SHIPPED_CARDS = {"classifier": "context", "classifier:form": "form"}
NUMERIC = ("T", "items", "turns", "follow-up", "undecided", "label errors", "errors", "accuracy",
           "vs real turn")
CORRECTION = ("corrected", "human only", "human labels")


def corrected_text(row: SummaryRow, c: Corrected | None = None) -> str:
    """The corrected rate (or ``c``, such as the human-only rate) as ``value [low-high]``."""
    c = row.corrected if c is None else c
    if c is None:
        return "-"
    return interval_text(c.value, c.low, c.high)


def print_summary(rows: list[SummaryRow], console: Console, *, sources: Sequence[str] = (),
                  assistant_failures: int = 0) -> None:
    # Answerer and perturbation columns appear only when the experiment varies them.
    extra = [name for name, values in (("answerer", {r.answerer for r in rows}),
                                       ("perturbation", {r.perturbation for r in rows}))
             if values - {"self", "none"}]
    table = Table(title="Genuine follow-up rate, 95% CI clustered by item")
    similar = any(row.similarity is not None for row in rows)
    humans = any(row.human_labels for row in rows)
    for name in ("model", *extra, "dataset", "T", "items", "turns", "follow-up",
                 *(CORRECTION if humans else []), "undecided",
                 "label errors", "errors", "accuracy", *(["vs real turn"] if similar else [])):
        table.add_column(name, justify="right" if name in NUMERIC + CORRECTION else "left")
    for row in rows:
        # escape: a variant's name (MODEL[user=...]) is not rich markup.
        table.add_row(Text(row.model), *(getattr(row, name) for name in extra), Text(row.dataset),
                      temperature(row.temperature), str(row.items), str(row.turns),
                      rate_interval(row.follow_up),
                      *([corrected_text(row), corrected_text(row, row.human_only),
                         str(row.human_labels)] if humans else []),
                      str(row.undecided), str(row.label_errors),
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
    notes += offline_notes(rows, sources)
    if assistant_failures:
        notes.append(f"{assistant_failures} assistant turn(s) failed; their items have no user "
                     "turns yet (re-run to retry)")
    for note in notes:
        console.print(note, style="dim", markup=False)


def offline_notes(rows: Sequence[SummaryRow], sources: Sequence[str]) -> list[str]:
    """What the rates rest on, where no person checked them: the offline labeller's measured
    error (for the shipped classifiers; another classifier's was never measured), and each
    judge that decides turns, with whether it was checked against people. Read with the run's
    label ``sources``."""
    unchecked = [row for row in rows if not row.human_labels]
    notes = []
    offline = [row for row in unchecked if any(is_offline(s) for s in row.deciding)]
    if offline:
        classifier = classifier_of(sources)
        mixed = not all(row.offline_only for row in offline)
        what = (f"offline labels{'' if mixed else ' only'} "
                f"({' and '.join(s for s in sources if is_offline(s))}"
                + (", where no judge decides" if mixed else "") + ")")
        card = SHIPPED_CARDS.get(classifier)
        error = offline_error(card) if card else None
        notes.append(error.note(what) if error is not None else (
            f"{what}: this classifier's error against people was never measured; correct the "
            "rates with human labels: userturn annotate RUN --calibration 100"))
    judged: dict[str, list[str]] = {}
    for row in unchecked:
        for source, count in row.deciding.items():
            if not is_offline(source) and not is_human(source):
                judged.setdefault(source, []).append(
                    f"{row.model} {row.dataset} T={temperature(row.temperature)}: {count} of "
                    f"{row.follow_up.n}")
    notes += [judge_note(judge, where) for judge, where in judged.items()]
    return notes


def judge_note(judge: str, where: Sequence[str]) -> str:
    """Which rates rest on ``judge``, and whether and how well it was checked against people
    (``userturn corpus check-judge``, whose result is kept by the judge's name)."""
    from userturn.labels.judge_check import load_check

    check = load_check(judge)
    said = f"{judge} decides turns of these rates ({'; '.join(where)})"
    if check is None:
        return (f"{said} and was not checked against people: how far its labels are from "
                f"people's on this task is unknown. Check it first: userturn corpus check-judge "
                f"--judge SPEC; or correct the rates with human labels: userturn annotate RUN "
                "--calibration 100")
    return f"{said}; it was {check.line()} (userturn corpus check-judge)"


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
