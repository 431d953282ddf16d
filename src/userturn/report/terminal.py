"""The run's tables in the terminal, as ``userturn run``, ``report``, ``judge`` and ``label``
print them."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from userturn.probe.perturb import unapplied
from userturn.report.compute import planned_perturbations
from userturn.report.numbers import difference, percent, rate_interval, temperature
from userturn.report.summary import print_instruction_accuracy, print_summary
from userturn.report.view import RunView
from userturn.stats.arms import ROLE_OPTIONS, ArmRow, arm_rows
from userturn.stats.summary import assistant_errors
from userturn.stats.variants import VariantComparison, variant_comparisons


def print_run(view: RunView, console: Console) -> None:
    """The summary and label tables, the user-turn variants against native, instruction
    accuracy, who labelled the turns, where the run's time went, and a line on a run that is
    not finished or skipped rows."""
    print_summary(view.summary(), console, sources=view.sources,
                  assistant_failures=assistant_errors(view.answers))
    for left_out in unapplied(view.turns, planned_perturbations(view.meta)):
        where = " · ".join([left_out.model, left_out.dataset] + (
            [] if left_out.answerer == "self" else [f"answers: {left_out.answerer}"]))
        console.print(left_out.line(where), style="yellow", markup=False, soft_wrap=True)
    print_variant_comparisons(variant_comparisons(view.turns), console)
    print_arms(arm_rows(view.turns), console)
    print_instruction_accuracy(view.answers, console)
    counts = ", ".join(f"{source} {n}" for source, n in view.labelled_by().items())
    console.print(f"labels from: {', then '.join(view.sources)} (user turns labelled by "
                  f"{counts or 'nobody yet'})", style="dim", markup=False)
    if view.meta.stages:
        console.print("time by stage: " + "; ".join(s.line() for s in view.meta.stages),
                      style="dim", markup=False, highlight=False, soft_wrap=True)
    for line in (view.state.skipped_line(), view.state.line()):
        if line:
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def print_variant_comparisons(comparisons: Sequence[VariantComparison], console: Console) -> None:
    """Each user-turn variant's follow-up rate against native's, paired over items."""
    if not comparisons:
        return
    table = Table(title="User-turn variants vs native: follow-up rate, paired over items")
    for name in ("model", "variant", "dataset", "answerer", "perturbation", "T", "items",
                 "native", "variant rate", "difference [95% CI]"):
        table.add_column(name)
    for c in comparisons:
        d = c.follow_up
        difference = "-" if d.delta != d.delta else \
            f"{100 * d.delta:+.1f} pts [{100 * d.low:+.1f}, {100 * d.high:+.1f}]"
        table.add_row(Text(c.native), Text(c.variant), Text(c.dataset), c.answerer, c.perturbation,
                      "greedy" if c.temperature <= 0 else f"{c.temperature:g}", str(d.items),
                      f"{100 * d.a.value:.1f}%", f"{100 * d.b.value:.1f}%", difference)
    console.print(table)


def print_arms(rows: Sequence[ArmRow], console: Console) -> None:
    """The continuation arm beside the opened one: who the model has speak next, and how often
    what it writes as the user is a follow-up when it is not handed the user's seat."""
    if not rows:
        return
    table = Table(title="Who speaks next: the continuation arm (no USER header opened) beside "
                  "the opened arm, 95% CI clustered by item")
    # The answerer and perturbation only where the run varies them, as in the rate table.
    keys = [(name, read) for name, read in (("answerer", lambda c: c.answerer),
                                            ("perturbation", lambda c: c.perturbation))
            if len({read(r.condition) for r in rows}) > 1]
    for name in ("model", *(name for name, _ in keys), "dataset", "T", "n", "opens user",
                 "unforced follow-up", "of user turns", "opened arm", "unforced - opened",
                 "P(u/a/end/other)"):
        table.add_column(name, justify="left" if name in ("model", "dataset") else "right")
    for row in rows:
        c = row.condition
        probabilities = "-" if row.next_role is None else " / ".join(
            percent(row.next_role[role]) for role in ROLE_OPTIONS)
        table.add_row(Text(c.probed), *(Text(read(c)) for _, read in keys), Text(c.dataset),
                      temperature(c.temperature), str(row.continuations),
                      rate_interval(row.opens_user), rate_interval(row.unforced),
                      rate_interval(row.written), rate_interval(row.opened),
                      "-" if row.difference is None else difference(row.difference),
                      probabilities)
    console.print(table)
    firsts = "; ".join(f"{r.condition.probed} T={temperature(r.condition.temperature)}: " + ", ".join(
        f"{role} {n}" for role, n in r.roles.items()) for r in rows)
    console.print(f"what the continuations opened first: {firsts}", style="dim", markup=False,
                  highlight=False, soft_wrap=True)
    console.print("unforced follow-up: over every continuation (one that had another role speak "
                  "is no follow-up); of user turns: over those written; P(u/a/end/other): the "
                  "mean probability that the next tokens are the user header, the assistant "
                  "header, the end of sequence, or anything else", style="dim", markup=False,
                  highlight=False, soft_wrap=True)
