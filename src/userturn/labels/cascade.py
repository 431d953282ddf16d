"""The cascade, written once: offline labellers in order, each on the turns it reads.

A labeller of the table (:mod:`.sources`) brings its offline sources in the order they decide a
turn; each labels every turn (``all``) or only the turns that no source before it decided
(``undecided``: the learned classifier after the rules, where each turn it reads costs a
reading in context). :func:`cascade` is that walk, and both ways of labelling go through it:
a stored run (:func:`.stages.label_offline`, each source's labels stored under its own name) and
cases one by one or in a file (:class:`Cascade`: ``userturn classify``, the API, the Inspect
scorer, the RL reward), where a case's label is the first that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Mapping, Protocol, Sequence

from userturn.records import Case, Label

Reads = Literal["all", "undecided"]
"""Which turns an offline source labels: every one, or those no source before it decided."""


class Labelling(Protocol):
    """An offline source: a name and version to store its labels under, and one label a case
    (a source that reads turns together has ``prepare(cases)`` too; :func:`labels_of`)."""

    name: str
    version: str

    def classify(self, case: Case) -> Label: ...


@dataclass(frozen=True)
class Step:
    """One source of a cascade, built, the turns it reads, and whether its labels decide (a
    source that does not is labelled for what else reads it: the rules of a ``classifier``
    run tell its judge which turns they leave undecided)."""

    labeller: Labelling
    reads: Reads
    decides: bool = True


def cascade(steps: Sequence[Step], count: int,
            label: Callable[[int, list[int]], Mapping[int, str | None]]) -> list[int]:
    """Walk ``count`` cases through ``steps``, in order: step ``s`` labels the cases it reads
    by ``label(s, indexes)``, which returns each one's label name (None: undecided), however it
    got it (labelled now, or stored earlier). Returns, per case, the step that decides it: the
    first deciding step that gave it a label, else the last deciding step that read it."""
    deciders = [step for step in steps if step.decides]
    if not deciders or deciders[0].reads != "all":
        raise ValueError("a cascade's first deciding step reads every case")
    deciding = [0] * count
    decided = [False] * count
    for index, step in enumerate(steps):
        wanted = list(range(count)) if step.reads == "all" else [
            i for i in range(count) if not decided[i]]
        labels = label(index, wanted)
        for case in wanted if step.decides else ():
            if not decided[case]:
                deciding[case], decided[case] = index, labels.get(case) is not None
    return deciding


class Cascade:
    """Cases labelled by several sources in order (:func:`cascade`): each case gets the label of
    the first source that decided it, and every label says which source gave it. The table's
    ``cascade`` is the rules, then the learned classifier where they abstain
    (``labeller_named("cascade").case_labeller()``)."""

    name = "cascade"

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = tuple(steps)
        cascade(self.steps, 0, lambda step, wanted: {})  # checked now
        self.version = "+".join(step.labeller.version for step in self.steps)

    def classify_all(self, cases: Sequence[Case]) -> list[Label]:
        """Each case's label; every source reads its cases together (``prepare``)."""
        labels: list[dict[int, Label]] = [{} for _ in self.steps]

        def label(step: int, wanted: list[int]) -> dict[int, str | None]:
            labels[step] = dict(zip(wanted, labels_of(self.steps[step].labeller,
                                                      [cases[i] for i in wanted])))
            return {index: found.label for index, found in labels[step].items()}

        deciding = cascade(self.steps, len(cases), label)
        return [labels[step][index] for index, step in enumerate(deciding)]

    def classify(self, case: Case) -> Label:
        return self.classify_all([case])[0]


def labels_of(source: Labelling, cases: Sequence[Case]) -> list[Label]:
    """``source``'s labels of ``cases``: a cascade walks them together, a source that reads
    turns in context reads them ahead, together (``prepare``), then labels each."""
    if isinstance(source, Cascade):
        return source.classify_all(cases)
    prepare = getattr(source, "prepare", None)
    if prepare is not None and cases:
        prepare(cases)
    return [source.classify(case) for case in cases]


CHUNK = 64  # turns read ahead together (a run's turns after one answer sit side by side)


def in_chunks(source: Labelling, cases: Sequence[Case]) -> Iterator[tuple[slice, list[Label]]]:
    """``source``'s labels of ``cases``, CHUNK at a time (which slice of ``cases``, its labels),
    so that a caller can store or count each chunk as it comes; give the cases with the turns
    after one answer side by side (a source that reads them in context reads them together)."""
    for start in range(0, len(cases), CHUNK):
        chunk = slice(start, start + CHUNK)
        yield chunk, labels_of(source, cases[chunk])
