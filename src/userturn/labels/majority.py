"""Several judges on one run: their majority as a label source (``judges:majority``).

Each judge's labels stay under its own source (``judge:MODEL@rubric``), so ``userturn
agreement`` compares them with each other and with people. The majority label of a turn is the
label more than half of the judges gave; a turn without one (two judges that disagree, invalid
verdicts) gets no majority label, with the split as its error, and so stays undecided rather than
being decided by whichever judge happens to be listed first.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from userturn.labels.sources import MAJORITY
from userturn.records import Label, Turn
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import read_labels, read_turns, with_labels


def majority_label(verdicts: dict[str, str | None], judges: Sequence[str]) -> Label:
    counts = Counter(label for label in verdicts.values() if label is not None)
    top = counts.most_common(1)
    if top and top[0][1] * 2 > len(judges):
        return Label(top[0][0], source=MAJORITY,  # type: ignore[arg-type]
                     rationale=f"{top[0][1]} of {len(judges)} judges")
    split = ", ".join(f"{name}: {verdicts.get(name)}" for name in judges)
    return Label(None, source=MAJORITY, error=f"no majority ({split})")


def store_majority(store: RunStore, judges: Sequence[str],
                   turns: Sequence[Turn] | None = None) -> int:
    """Store the majority of ``judges`` for every turn at least one of them labelled, as a
    source of its own (``judges:majority``), which the run's sources then put where a single
    judge would stand (:class:`.sources.OfflineLabeller`). ``turns``: the run's turns as read
    before the judges, whose labels are read again (the judges' verdicts); default: all read."""
    version = "+".join(judges)
    rows = []
    read = read_turns(store, list(judges)) if turns is None else with_labels(
        turns, read_labels(store), list(judges))
    for turn in read:
        verdicts = {lab.source: lab.label for lab in turn.labels if lab.source in judges}
        if verdicts:
            rows.append(LabelRow(turn.key, version, majority_label(verdicts, judges)))
    store.put_labels(rows)
    return len(rows)
