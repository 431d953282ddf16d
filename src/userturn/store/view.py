"""A stored run read once: its metadata, the label sources chosen, its user turns (each with every
label stored for it), its answers and where it stands.

Every command reads a run through :func:`read_stored_run`, once, and hands the value along: the
labelling stages take its turns, the report (``userturn.report.view.RunView``) and compare add
what they compute from it. What a command changes afterwards is read again alone:
:meth:`StoredRun.relabelled` re-reads the labels and the metadata a labelling stage wrote, not
the turns; :meth:`StoredRun.with_sources` resolves the turns with other sources, reading nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from userturn.records import Answer, Turn
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta
from userturn.store.runstate import RunState, run_state
from userturn.store.turns import read_answers, read_labels, read_turns, with_labels, with_sources

Labels = str | Sequence[str] | None


@dataclass(frozen=True)
class StoredRun:
    """One run as stored, read with one choice of label sources."""

    folder: Path
    meta: RunMeta
    sources: list[str]
    """The label sources the turns were resolved with, in priority order."""
    turns: list[Turn]
    answers: list[Answer]
    state: RunState

    def with_sources(self, labels: Labels = None) -> StoredRun:
        """The same run with its turns resolved among ``labels`` (None or empty: the run's own),
        from the labels they hold: nothing is read."""
        sources = chosen_sources(self.meta, labels)
        return replace(self, sources=sources, turns=with_sources(self.turns, sources))

    def relabelled(self, store: RunStore, labels: Labels = None) -> StoredRun:
        """The run after a labelling stage wrote to ``store``: its labels and metadata (the
        sources it recorded) read again, the turns, answers and state kept. ``labels``: the
        sources to resolve with, as in :func:`read_stored_run`."""
        meta = store.meta()
        sources = chosen_sources(meta, labels)
        return replace(self, meta=meta, sources=sources,
                       turns=with_labels(self.turns, read_labels(store), sources))


def chosen_sources(meta: RunMeta, labels: Labels) -> list[str]:
    """The label sources in priority order: ``labels`` as given, or (None or empty) the run's."""
    if not labels:
        return list(meta.label_sources)
    return [labels] if isinstance(labels, str) else list(labels)


def read_stored_run(store: RunStore, labels: Labels = None) -> StoredRun:
    """The run in ``store``, read once; ``labels`` names the label sources in priority order
    (None or empty: the run's own)."""
    meta = store.meta()
    sources = chosen_sources(meta, labels)
    return StoredRun(store.folder, meta, sources, read_turns(store, sources), read_answers(store),
                     run_state(store))
