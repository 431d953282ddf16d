"""A run read once: everything the terminal tables, the HTML report and the Python API show.

``read_run`` is the read path of every reader of a finished (or running) run: it takes the label
sources, reads the turns and answers with them, works out the human labels' inclusion
probabilities and where the run stands, and returns them as one :class:`RunView`. What is shown
is then computed from the view, never read again.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from userturn.labels.calibration import inclusion_probabilities
from userturn.labels.sources import is_offline
from userturn.records import Answer, Turn
from userturn.report.compute import Report, build_report
from userturn.stats.summary import SummaryRow, summarize
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta
from userturn.store.runstate import RunState, run_state
from userturn.store.turns import check_label_sources, label_sources, read_answers, read_turns


@dataclass(frozen=True)
class RunView:
    """One run as its readers see it, read with one choice of label sources."""

    folder: Path
    meta: RunMeta
    sources: list[str]
    """The label sources the turns were resolved with, in priority order."""
    turns: list[Turn]
    answers: list[Answer]
    inclusion: Mapping[str, float]
    """Human-labelled turn key -> its inclusion probability (for the corrected rate)."""
    state: RunState

    def summary(self) -> list[SummaryRow]:
        """The rows of the summary table: one per condition."""
        return summarize(self.turns, self.answers, self.inclusion,
                         offline=[source for source in self.sources if is_offline(source)])

    def report(self) -> Report:
        """Every number of the HTML report."""
        return build_report(self.turns, self.answers, folder=self.folder, meta=self.meta,
                            sources=self.sources, inclusion=self.inclusion, state=self.state)

    def labelled_by(self) -> dict[str, int]:
        """How many generated user turns each source decided (``nobody (undecided)``: none)."""
        counts: dict[str, int] = {}
        for turn in self.turns:
            if turn.labellable:
                source = turn.label_source or "nobody (undecided)"
                counts[source] = counts.get(source, 0) + 1
        return counts


def read_run(store: RunStore, labels: str | Sequence[str] | None = None) -> RunView:
    """Read the run in ``store`` once; ``labels`` names the label sources in priority order
    (None or empty: the run's own)."""
    sources = label_sources(store, labels or None)
    turns = read_turns(store, sources)
    return RunView(store.folder, store.meta(), sources, turns, read_answers(store),
                   inclusion_probabilities(store, turns), run_state(store))


def read_folder(folder: Path, labels: Sequence[str] | None = None) -> RunView:
    """The run in ``folder`` read once, to read only (nothing written into the folder).
    ``labels`` (``--labels``) must name sources the run holds; None: the run's own."""
    with closing(RunStore.read(folder)) as store:
        check_label_sources(store, labels)
        return read_run(store, labels)
