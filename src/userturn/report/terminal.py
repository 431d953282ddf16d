"""The run's tables in the terminal, as ``userturn run``, ``report``, ``judge`` and ``label``
print them."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from userturn.probe.perturb import unapplied
from userturn.report.compute import planned_perturbations
from userturn.report.summary import print_instruction_accuracy, print_summary
from userturn.report.view import RunView
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
