"""The run's headline table in the terminal: per condition, the genuine follow-up rate with a
95% interval clustered by item, the label distribution, n, errors, and task accuracy (the rows
are :func:`userturn.stats.summary.summarize`'s)."""

from __future__ import annotations

from collections import defaultdict
from contextlib import closing
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from userturn.labels.offline_error import CARDS, PLAN_HINT, offline_error
from userturn.labels.sources import classifier_of, is_offline
from userturn.records import HUMAN, LABELS, RULES_SOURCE, Answer, is_human, probed_name
from userturn.report import columns
from userturn.report.numbers import LABEL_HEADERS, percent, temperature
from userturn.stats.correction import MIN_HUMAN_LABELS
from userturn.stats.planning import LabellerError, Planned, PlanRow
from userturn.stats.summary import SummaryRow

# The offline error card's figures for each shipped classifier's source (labels/offline_error.json).
SHIPPED_CARDS = {source: card for source, card in CARDS.items() if source != RULES_SOURCE}


def correction_hint(rows: Sequence[SummaryRow]) -> str:
    """How to correct the rates with human labels, with a sample size that can succeed: the
    fewest labels that give every row that can have one a corrected rate, and the plan for an
    interval of a chosen width."""
    open_rows = [r for r in rows if r.labels_to_correct]
    need = sum(r.labels_to_correct or 0 for r in open_rows)
    short = sum(1 for r in rows if r.labels_to_correct is None and not r.read_by_people)
    hint = ("userturn annotate RUN --plan --half-width 0.05 sizes the human sample for the "
            "interval you need")
    if need:
        hint += (f"; at least {need} labels ({MIN_HUMAN_LABELS} in each of {len(open_rows)} "
                 f"row(s)) give every row that can have one a corrected rate: userturn annotate "
                 f"RUN --annotator NAME --calibration {need}")
    if short:
        hint += (f"; {short} row(s) have fewer than {MIN_HUMAN_LABELS} turns: no corrected rate "
                 "can be had for them")
    return hint


def print_summary(rows: list[SummaryRow], console: Console, *, sources: Sequence[str] = (),
                  assistant_failures: int = 0) -> None:
    shown = columns.terminal_columns(rows)
    table = Table(title="Genuine follow-up rate, 95% CI clustered by item")
    for column in shown:
        table.add_column(column.header, justify="right" if column.format.numeric else "left")
    for row in rows:
        table.add_row(*(column.text(row) for column in shown))
    console.print(table)
    keys = columns.terminal_columns(rows, conditions=True)
    labels = Table(title="Labels of the generated user turns (counts)")
    for column in keys:
        labels.add_column(column.header, justify="right" if column.format.numeric else "left")
    # A continuation that had another role speak has no label: counted beside the labels.
    other_role = ["no user turn"] if any(row.no_user_turn for row in rows) else []
    for name in (*LABEL_HEADERS.values(), "undecided", *other_role):
        labels.add_column(name, justify="right")
    for row in rows:
        labels.add_row(*(column.text(row) for column in keys),
                       *(str(row.labels.get(label, 0)) for label in LABELS), str(row.undecided),
                       *([str(row.no_user_turn)] if other_role else []))
    console.print(labels)
    humans = any(row.human_labels for row in rows)
    notes = ["follow-up: share of user turns labelled follow_up; accuracy: task score of the "
             "greedy assistant answer"]
    if other_role or any(row.arm != "opened" for row in rows):
        notes.append("arm continuation: the model went on after the assistant's closed turn "
                     "(no USER header opened); its follow-up rate is over every continuation, "
                     "a continuation that had another role speak (no user turn) counting as no "
                     "follow-up: the unforced rate")
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
                     "human labels (PPI++, clustered by item; docs/statistics.md), where a row "
                     f"has {MIN_HUMAN_LABELS} or more; raw follow-up: the labeller's rate; human "
                     "labels: the turns of the row a person labelled; human only: the rate of "
                     "the human labels alone")
        if any(row.labels_to_correct for row in rows):
            notes.append(correction_hint(rows))
        notes += [f"{row.probed} {row.dataset} T={temperature(row.temperature)}: correction not "
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
        notes.append(error.note(what, correction_hint(rows)) if error is not None else (
            f"{what}: this classifier's error against people was never measured; correct the "
            f"rates with human labels: {correction_hint(rows)}"))
    judged: dict[str, list[str]] = {}
    for row in unchecked:
        for source, count in row.deciding.items():
            if not is_offline(source) and not is_human(source):
                judged.setdefault(source, []).append(
                    f"{row.probed} {row.dataset} T={temperature(row.temperature)}: {count} of "
                    f"{row.follow_up.n}")
    notes += [judge_note(judge, where, correction_hint(rows)) for judge, where in judged.items()]
    return notes


def judge_note(judge: str, where: Sequence[str], fix: str = PLAN_HINT) -> str:
    """Which rates rest on ``judge``, and whether and how well it was checked against people
    (``userturn corpus check-judge``, whose result is kept by the judge's name); ``fix``: how
    to correct them with human labels (a size that can succeed, or the plan)."""
    from userturn.labels.judge_check import load_check

    check = load_check(judge)
    said = f"{judge} decides turns of these rates ({'; '.join(where)})"
    if check is None:
        return (f"{said} and was not checked against people: how far its labels are from "
                f"people's on this task is unknown. Check it first: userturn corpus check-judge "
                f"--judge SPEC; or correct the rates with human labels: {fix}")
    return f"{said}; it was {check.line()} (userturn corpus check-judge)"


def print_instruction_accuracy(answers: Sequence[Answer], console: Console) -> None:
    """IFEval/IFBench runs: the four accuracies the benchmarks define, per model and dataset."""
    from userturn.data.instructions import aggregate
    from userturn.records import Score

    groups: dict[tuple[str, str], list[Score]] = defaultdict(list)
    for answer in answers:
        if answer.scorer in ("ifeval", "ifbench"):
            groups[(probed_name(answer.model, enable_thinking=answer.enable_thinking),
                    answer.dataset)].append(
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


def print_plan(folder: Path, half_width: float, console: Console) -> None:
    """``userturn annotate RUN --plan``: per condition, the human labels that give its
    corrected rate an interval of ``half_width``, and the sample that gets them (reads the run
    only: nothing is written, no lock is taken)."""
    from userturn.labels.calibration import sample_plan
    from userturn.store.database import RunStore

    with closing(RunStore.read(folder)) as store:
        rows = sample_plan(store, half_width)
    table = Table(title=f"Human labels for a corrected rate of +-{100 * half_width:g} points "
                        "(95% CI), per condition")
    extra = [name for name, values in (("answerer", {r.condition.answerer for r in rows}),
                                       ("perturbation", {r.condition.perturbation for r in rows}))
             if values - {"self", "none"}]
    for name in ("model", *extra, "dataset", "T", "turns", "items", "labeller says",
                 "people, expected", "labelled", "planned", "more", "+- expected"):
        table.add_column(name, justify="left" if name in ("model", "dataset", *extra) else "right")
    for row in rows:
        c, d, planned = row.condition, row.design, row.planned
        table.add_row(Text(c.probed), *(getattr(c, name) for name in extra), Text(c.dataset),
                      temperature(c.temperature), str(d.turns), str(d.items),
                      percent(d.predicted / d.turns), percent(d.rate), str(d.given),
                      *_planned_cells(planned))
    console.print(table)
    for line in plan_notes(rows, half_width, str(folder)):
        console.print(line, style="dim", markup=False, soft_wrap=True)


def _planned_cells(planned: Planned) -> list[str]:
    if planned.status == "too_few_turns":
        return ["-", "-", "no corrected rate"]
    if planned.status == "read_by_people":
        return ["-", "-", "read by people"]
    width = f"{100 * planned.half_width:.1f} pts"
    return [str(planned.labels), str(planned.more),
            width + (" (best)" if planned.status == "unreachable" else "")]


def plan_notes(rows: Sequence[PlanRow], half_width: float, run: str) -> list[str]:
    """What the plan rests on, the conditions it cannot promise, and the command that draws it."""
    more = sum(row.planned.more for row in rows)
    notes = ["labeller says: the run's follow-up rate; people, expected: the rate people are "
             "expected to give, from the labeller's measured error; labelled: turns people "
             "labelled already (they count toward the plan); +- expected: the half-width the "
             "planned labels are expected to give"]
    errors = {e.source: e for row in rows for e in row.errors}
    notes += [f"labeller's error: {e.source}: people say follow-up on {q(e, 0)} of its "
              f"follow-ups and {q(e, 1)} of its other turns there"
              + ("" if e.checked else " (never measured for this labeller)")
              for e in errors.values()]
    for status, text in (
            ("unreachable", f"cannot reach +-{100 * half_width:g} points even with every turn "
                            "labelled: planned at all of their turns (+- expected: the best)"),
            ("too_few_turns", f"have fewer than {MIN_HUMAN_LABELS} turns: a corrected rate needs "
                              f"{MIN_HUMAN_LABELS} human labels in its own row, so none can be "
                              "promised (more items or samples would give them one)")):
        count = sum(1 for row in rows if row.planned.status == status)
        if count:
            notes.append(f"{count} condition(s) {text}")
    if more:
        notes.append(f"in all {more} more human labels: userturn annotate {run} --annotator NAME "
                     f"--calibration {more} (shared between the conditions as planned, the "
                     "widest interval first)")
    elif any(row.planned.status in ("ok", "unreachable") for row in rows):
        notes.append("the labels given already meet the plan")
    return notes


def q(error: LabellerError, column: int) -> str:
    """P(a person says follow-up | the labeller says follow-up (0) or not (1)) on its table."""
    (a, b), (c, d) = error.confusion
    hits, total = ((a, a + c), (b, b + d))[column]
    return percent(hits / total) if total else "-"
