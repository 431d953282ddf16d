"""The labelling stages of a run: the offline labellers, then the judges where they are asked.

The offline stage reads the run's turns once and passes them along (the rules' verdicts go to the
classifier in memory), and all judges share one read; a later stage reads again, to see the labels
the earlier ones wrote. Each stage writes its labels back as it goes, and none generates, so any
of them can be run again on a finished run (``userturn label``; ``userturn judge``,
:func:`judge_folder`; people's labels from a file, :func:`import_human_labels`). The order in
which the sources then decide a turn comes from the labeller table (:mod:`.sources`) and is
recorded once, by :func:`record_sources`.
"""

from __future__ import annotations

import warnings
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from userturn.errors import TemplateError, UserturnError
from userturn.labels.cascade import Labelling, cascade, in_chunks
from userturn.labels.judge import Judge
from userturn.labels.majority import store_majority
from userturn.labels.sources import (
    DEFAULT_LABELLER,
    RULES,
    JudgeScope,
    OfflineLabeller,
    classifier_of,
    judge_sources,
    labeller_named,
    run_labeller,
)
from userturn.records import Case, Label, Labeller, Progress, StoredLabel, Turn, silent_progress
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns
from userturn.store.view import StoredRun, read_stored_run

if TYPE_CHECKING:
    from userturn.backends import Backend
    from userturn.labels.plan import JudgeSpec
    from userturn.store.sqlite import Tally


def label_turns(store: RunStore, labeller: Labeller = DEFAULT_LABELLER,
                backends: Mapping[str, Backend] | None = None, *,
                classifier_path: Path | None = None, progress: Progress | None = None,
                turns: Sequence[Turn] | None = None) -> int:
    """Label a run offline and record its label sources (`userturn label`, an lm-eval import):
    :func:`label_offline`, then the run's sources with the judges that already decide it kept.
    ``turns``: the run's turns as the caller read them (default: read here). Returns the labels
    added."""
    offline = labeller_named(labeller)
    count = label_offline(store, offline, backends, classifier_path=classifier_path,
                          progress=progress, turns=turns)
    # A judged run keeps the judge (or the judges' majority) that decides it.
    judges = judge_sources(store.label_sources())
    record_sources(store, offline, judges[:1], "undecided",
                   offline.classifier_source(classifier_path))
    return count


def label_offline(store: RunStore, offline: OfflineLabeller,
                  backends: Mapping[str, Backend] | None = None, *,
                  classifier_path: Path | None = None, progress: Progress | None = None,
                  turns: Sequence[Turn] | None = None) -> int:
    """The offline labels: the labeller's sources through the cascade (:func:`.cascade.cascade`:
    the rules on every user turn, the learned classifier on the turns the rules abstain on, or
    on every turn), each source on the turns it has not labelled at its version, under its own
    name. The run's turns (``turns``, as the caller read them, or read here) are passed from
    source to source, with what each stored. Never generates: re-labelling an old run changes
    its labels only. Returns the labels added."""
    headers = {spec: _assistant_header(b) for spec, b in (backends or {}).items()}
    # Every source is built first: a bad parameters file is one error before any labelling.
    steps = offline.build(classifier_path)
    # Only each turn's stored labels are read below, never its resolved label: any sources do.
    turns = [t for t in (read_turns(store, RULES) if turns is None else turns) if t.labellable]
    added = 0

    def label(step: int, wanted: list[int]) -> dict[int, str | None]:
        nonlocal added
        source = steps[step].labeller
        chosen = [turns[i] for i in wanted]
        verdicts = {t.key: lab.label for t in chosen for lab in t.labels
                    if lab.source == source.name and lab.version == source.version}
        added += label_with(store, [source], headers, progress, turns=chosen, stored=verdicts)
        return {i: verdicts.get(turns[i].key) for i in wanted}

    cascade(steps, len(turns), label)
    return added


def record_sources(store: RunStore, offline: OfflineLabeller, judges: Sequence[str],
                   scope: JudgeScope, classifier: str) -> list[str]:
    """Write the run's label sources, in the order :class:`.sources.OfflineLabeller` gives: the
    one place a run's sources are recorded, once per command, after its labelling stages.
    ``classifier``: the learned classifier's source. Where this changes the sources a stored
    run was read with, its rates may move: that is said (a warning), never done silently."""
    sources = offline.sources(judges, scope, classifier)
    meta = store.meta()  # a run labelled for the first time has no sources yet, only defaults
    before = meta.label_sources if "label_sources" in meta.model_fields_set else []
    store.update_meta(label_sources=sources, labeller=offline.name)
    if before and before != sources:
        stored = set(store.stored_label_sources())
        earlier = [source for source in before if source in stored]
        warnings.warn(f"{store.folder} was labelled by {', then '.join(before)}; it is now "
                      f"labelled by {', then '.join(sources)}, so its rates can move" + (
                          f" (the earlier labels stay stored: `userturn report {store.folder} "
                          f"--labels {','.join(earlier)}` shows them)" if earlier else ""),
                      stacklevel=2)
    return sources


def label_with(store: RunStore, labellers: Sequence[Labelling],
               headers: Mapping[str, str] | None = None, progress: Progress | None = None, *,
               turns: Sequence[Turn] | None = None,
               stored: dict[str, str | None] | None = None) -> int:
    """Label every generated user turn (or ``turns``, as read by the caller) that each of
    ``labellers`` has not labelled at its version, each under its own source; a turn is shown as
    :meth:`Turn.case` makes it, with its model's assistant header from ``headers`` (model spec
    -> header). ``stored``: key -> label, filled with each new label (the next stage reads it instead of
    the store). Returns the labels added."""
    if turns is None:
        turns = [t for t in read_turns(store, RULES) if t.labellable]
    count = 0
    for source in labellers:
        done = store.labelled_keys(source.name, source.version)
        # Turns after one answer side by side: a labeller that reads them in context reads
        # them together (see `prepare`).
        todo = sorted((t for t in turns if t.key not in done), key=lambda t: (t.query, t.answer))
        advance = (progress or silent_progress)(f"label · {source.name}", len(todo))
        cases = [t.case((headers or {}).get(t.probed, "")) for t in todo]
        for chunk, labels in in_chunks(source, cases):  # each chunk stored as it is labelled
            store.put_labels([LabelRow(t.key, source.version, label)
                              for t, label in zip(todo[chunk], labels)])
            if stored is not None:
                stored.update((t.key, label.label) for t, label in zip(todo[chunk], labels))
            advance(len(labels))
        count += len(todo)
    return count


def label_cases(labeller: Labeller, cases: Sequence[Case], classifier: Path | None = None,
                progress: Progress | None = None) -> list[Label]:
    """Label ``cases`` the way a run's offline labeller would (``classifier``: the learned
    classifier's parameters; default the shipped ones): each case gets the label of the first of
    its sources that decided it. The turns after one answer are read in context together
    (:func:`.cascade.in_chunks`)."""
    source = labeller_named(labeller).case_labeller(classifier)
    order = sorted(range(len(cases)), key=lambda i: (cases[i].query, cases[i].answer))
    labels: dict[int, Label] = {}
    advance = (progress or silent_progress)(f"label · {labeller}", len(cases))
    for chunk, chunk_labels in in_chunks(source, [cases[i] for i in order]):
        labels.update(zip(order[chunk], chunk_labels))
        advance(len(chunk_labels))
    return [labels[i] for i in range(len(cases))]


def judge_with_all(store: RunStore, judges: Sequence[Judge], scope: JudgeScope,
                   progress: Progress | None = None, threshold: float = 0.7, *,
                   record: bool = True, classifier: str | None = None,
                   turns: Sequence[Turn] | None = None,
                   offline: OfflineLabeller | None = None) -> int:
    """Label with each judge (each under its own source); with two or more, their majority
    becomes a source of its own that decides in the judges' place (:mod:`.majority`). The run's
    turns (``turns``, as the caller read them with the labels stored so far, or read here) are
    shared by all judges, and the majority re-reads only the labels; the run's sources are
    recorded once, after them (unless ``record`` is False: the caller records them).
    ``classifier``: the run's learned classifier's source (default: the one its recorded sources
    name); ``offline``: the run's labeller (default: the one it recorded). Returns the turns
    sent, over all judges."""
    turns = read_turns(store) if turns is None else turns
    classifier = classifier or classifier_of(store.label_sources())
    offline = offline or run_labeller(store.meta())
    sent = sum(judge_turns(store, judge, scope, progress, threshold=threshold, turns=turns,
                           classifier=classifier, offline=offline)
               for judge in judges)
    names = [judge.name for judge in judges]
    if len(judges) > 1:
        store_majority(store, names, turns)
    # A judge none of whose verdicts ever succeeded decides nothing: the run's sources (and its
    # rates) stay as they were, and nothing says they changed.
    if record and any(store.labelled_keys(judge.name, judge.version) for judge in judges):
        record_sources(store, offline, names, scope, classifier)
    return sent


def judge_turns(store: RunStore, judge: Judge, scope: JudgeScope,
                progress: Progress | None = None, chunk: int = 1,
                threshold: float = 0.7, turns: Sequence[Turn] | None = None,
                classifier: str | None = None, offline: OfflineLabeller | None = None) -> int:
    """Label the run's user turns (``turns``, as read by the caller, or all) with an LLM judge:
    those the rules left undecided (``offline``'s sources that decide before the judges, which
    default to the run's recorded labeller's), those the cascade labelled with a classifier
    probability below ``threshold`` (``uncertain``), or all.

    Cached by judge name (which carries the rubric version) and generation key: turns this judge
    already labelled successfully are not sent again; a failed verdict (an error label) is
    retried by the next call. Verdicts are paid for: each is committed as it arrives (``chunk``
    at a time; a commit costs far less than a request), and whatever was received when
    interrupted (Ctrl-C, SIGTERM) is committed before the interrupt goes on. Returns the number
    of turns sent; the outcome (sent, failed, first error) is counted in ``store.tally``. Where
    the judge then decides is the run's sources' business (:func:`record_sources`).
    """
    done = store.labelled_keys(judge.name, judge.version)
    candidates = [t for t in (read_turns(store) if turns is None else turns)
                  if t.labellable and t.key not in done]
    classifier = classifier or classifier_of(store.label_sources())
    # The sources whose clear cases stand before the judge (the rules): the run's labeller's.
    screens = (offline or run_labeller(store.meta())).screens()
    wanted = [t for t in candidates if _judge_wanted(t, scope, threshold, classifier, screens)]
    undecided = [t for t in candidates if _undecided(t, screens)]
    if scope == "uncertain" and undecided and not any(
            _stored(t, classifier) for t in undecided):
        raise UserturnError("judge scope 'uncertain' needs the classifier's labels: run "
                            "`userturn label RUN` first (or use --scope undecided)")
    advance = (progress or silent_progress)(f"judge {judge.name}", len(wanted))
    received: list[LabelRow] = []
    verdicts = judge.classify_as_done([turn.case() for turn in wanted])
    try:
        for index, label in verdicts:
            received.append(LabelRow(wanted[index].key, judge.version, label))
            store.tally.count("judge", label.error)
            if len(received) >= chunk:
                # An interrupt inside this commit rolls it back: ``received`` still holds the
                # verdicts and the ``finally`` stores them (storing one twice replaces it).
                store.put_labels(received)
                advance(len(received))
                received = []
    finally:
        verdicts.close()  # cancels what was not sent (Ctrl-C, SIGTERM)
        store.put_labels(received)  # every verdict received is kept
    return len(wanted)


def _stored(turn: Turn, source: str) -> StoredLabel | None:
    return next((lab for lab in turn.labels if lab.source == source), None)


def _undecided(turn: Turn, screens: Sequence[str]) -> bool:
    """Whether none of ``screens`` (the rules, in the shipped labellers) decided the turn."""
    return all(found is None or found.label is None
               for found in (_stored(turn, source) for source in screens))


def _judge_wanted(turn: Turn, scope: str, threshold: float, classifier: str,
                  screens: Sequence[str]) -> bool:
    """Whether the judge is asked about this turn, by scope (``classifier``: the run's learned
    classifier's source, whose probability ``uncertain`` reads; ``screens``: the sources whose
    clear cases stand)."""
    if scope == "all":
        return True
    if not _undecided(turn, screens):
        return False  # the rules' clear cases stand
    if scope == "undecided":
        return True
    learned = _stored(turn, classifier)
    return learned is not None and (learned.probability or 0.0) < threshold


def _assistant_header(backend: Backend) -> str:
    from userturn.chat.render import derive_markers

    try:
        return derive_markers(backend.template).assistant_header.strip()
    except TemplateError:
        return ""


@dataclass(frozen=True)
class Judged:
    """What ``userturn judge`` did to a run: the turns sent to its judges (over all of them),
    the tally of their requests (failed verdicts among them) and the run as it stands after them
    (read once, its labels and metadata read again after the judges: what the report shows)."""

    sent: int
    tally: Tally
    run: StoredRun

    @property
    def failed(self) -> int:
        return self.tally.failed.get("judge", 0)


def judge_folder(folder: Path, judges: Sequence[Judge], spec: JudgeSpec,
                 progress: Progress | None = None) -> Judged:
    """Judge the stored run in ``folder`` with ``judges`` (built from ``spec``, which gives the
    scope and threshold), under the folder's lock: the store is checked before the lock is
    taken, so a refusal writes nothing. Generates nothing."""
    with RunStore.writing(folder, "judge") as store:
        run = read_stored_run(store)
        sent = judge_with_all(store, judges, spec.judge_scope, progress,
                              threshold=spec.judge_threshold, turns=run.turns)
        return Judged(sent, store.tally, run.relabelled(store))


def import_human_labels(folder: Path, file: Path, annotator: str) -> int:
    """Store the ``key,label`` rows of ``file`` (``userturn annotate --import``) as
    ``human:ANNOTATOR`` labels of the run in ``folder``: every row is checked against the run,
    read only, before the lock is taken and the first label written. Returns how many."""
    from userturn.labels.annotate import NAME_PATTERN, AnnotationError
    from userturn.labels.calibration import imported_labels

    if not NAME_PATTERN.fullmatch(annotator):
        raise AnnotationError(f"annotator name {annotator!r}: use letters, digits, _ . -")
    with closing(RunStore.read(folder)) as reader:  # every row checked, nothing written
        labels = imported_labels(reader, file, annotator)
    with RunStore.writing(folder, "annotate") as store:
        store.put_labels(labels)
    return len(labels)
