"""The run's tables in the terminal, as ``userturn run``, ``report``, ``judge`` and ``label``
print them."""

from __future__ import annotations

from rich.console import Console

from userturn.probe.user_variants import print_variant_comparisons, variant_comparisons
from userturn.report.summary import assistant_errors, print_instruction_accuracy, print_summary
from userturn.report.view import RunView


def print_run(view: RunView, console: Console) -> None:
    """The summary and label tables, the user-turn variants against native, instruction
    accuracy, who labelled the turns, where the run's time went, and a line on a run that is
    not finished or skipped rows."""
    print_summary(view.summary(), console, assistant_failures=assistant_errors(view.answers))
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
