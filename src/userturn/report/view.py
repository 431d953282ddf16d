"""A run read once: everything the terminal tables, the HTML report and the Python API show.

``read_run`` is the read path of every reader of a finished (or running) run: it reads the run
once (``userturn.store.view.read_stored_run``: metadata, label sources, turns, answers, where
it stands), works out the human labels' inclusion probabilities from the turns read, and returns
them as one :class:`RunView`; a command that has read the run already (to label it first) makes
its view with :func:`view_of`. What is shown is then computed from the view, never read again.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from userturn.labels.calibration import inclusion_probabilities
from userturn.labels.sources import is_offline
from userturn.report.compute import Report, build_report
from userturn.stats.summary import SummaryRow, summarize
from userturn.store.database import RunStore
from userturn.store.turns import check_label_sources
from userturn.store.view import Labels, StoredRun, read_stored_run


@dataclass(frozen=True)
class RunView(StoredRun):
    """One run as its readers see it, read with one choice of label sources: the stored run
    (``folder``, ``meta``, ``sources``, ``turns``, ``answers``, ``state``) and what the
    corrected rates need of it."""

    inclusion: Mapping[str, float]
    """Human-labelled turn key -> its inclusion probability (for the corrected rate)."""

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


def view_of(run: StoredRun) -> RunView:
    """The view of a run already read: nothing is read again."""
    return RunView(run.folder, run.meta, run.sources, run.turns, run.answers, run.state,
                   inclusion_probabilities(run.meta, run.turns))


def read_run(store: RunStore, labels: Labels = None) -> RunView:
    """Read the run in ``store`` once; ``labels`` names the label sources in priority order
    (None or empty: the run's own)."""
    return view_of(read_stored_run(store, labels))


def read_folder(folder: Path, labels: Sequence[str] | None = None) -> RunView:
    """The run in ``folder`` read once, to read only (nothing written into the folder).
    ``labels`` (``--labels``) must name sources the run holds; None: the run's own."""
    with closing(RunStore.read(folder)) as store:
        check_label_sources(store, labels)
        return read_run(store, labels)
