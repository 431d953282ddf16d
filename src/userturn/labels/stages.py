"""The labelling stages of a run: the offline labellers, then the judges where they are asked.

Each stage reads the run's turns from the store and writes labels back; none generates, so any of
them can be run again on a finished run (``userturn label``, ``userturn judge``). The order in which
the sources then decide a turn comes from :func:`.sources.source_order`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

from userturn.errors import TemplateError, UserturnError
from userturn.labels.classifier import LearnedClassifier, in_chunks
from userturn.labels.judge import Judge
from userturn.labels.majority import store_majority
from userturn.labels.rules import RulesClassifier
from userturn.labels.sources import (
    CLASSIFIER,
    RULES,
    JudgeScope,
    checked_labeller,
    judge_sources,
    source_order,
)
from userturn.records import Case, Label, Labeller, Progress, silent_progress
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import StoredLabel, Turn, read_turns

if TYPE_CHECKING:
    from userturn.backends import Backend



class Classifier(Protocol):
    """An offline labeller: a name and version to store its labels under, and one label a case."""

    name: str
    version: str

    def classify(self, case: Case) -> Label: ...


def label_turns(store: RunStore, labeller: Labeller = "cascade",
                backends: Mapping[str, Backend] | None = None, *,
                classifier_path: Path | None = None, progress: Progress | None = None) -> int:
    """The offline labels: the rules on every user turn, and the learned classifier on the turns
    the rules abstain on (cascade) or on every turn (classifier), each for the turns it has not
    labelled at its version. The cascade resolves a turn to the rules' label where they decide
    and to the classifier's elsewhere. Never generates: re-labelling an old run changes its
    labels only. Returns the labels added."""
    labeller = checked_labeller(labeller)
    headers = {spec: _assistant_header(b) for spec, b in (backends or {}).items()}
    # The classifier's parameters are loaded first: a bad file is one error before any labelling.
    learned = None if labeller == "rules" else (
        LearnedClassifier(path=classifier_path) if classifier_path else LearnedClassifier())
    count = label_with(store, [RulesClassifier()], headers, progress)
    if learned is not None:
        # In the cascade the classifier decides only where the rules abstain, so it labels those
        # turns alone: each costs a reading in context. `--labeller classifier` labels the rest.
        count += label_with(store, [learned], headers, progress,
                            only=None if labeller == "classifier" else _rules_undecided)
    # A judged run keeps the judge (or the judges' majority) that decides it.
    judges = judge_sources(store.label_sources())
    store.update_meta(label_sources=source_order(labeller, judges[:1]), labeller=labeller)
    return count


def label_with(store: RunStore, labellers: Sequence[Classifier],
               headers: Mapping[str, str] | None = None, progress: Progress | None = None,
               only: Callable[[Turn], bool] | None = None) -> int:
    """Label every generated user turn that each of ``labellers`` has not labelled at its
    version, each under its own source; a turn is shown as :meth:`Turn.case` makes it, with its
    model's assistant header from ``headers`` (model spec -> header). ``only``: the turns (read
    with the rules' labels) that need these labellers. Returns the labels added."""
    turns = [t for t in read_turns(store, RULES)
             if t.error is None and (only is None or only(t))]
    count = 0
    for source in labellers:
        done = store.labelled_keys(source.name, source.version)
        # Turns after one answer side by side: a labeller that reads them in context reads
        # them together (see `prepare`).
        todo = sorted((t for t in turns if t.key not in done), key=lambda t: (t.query, t.answer))
        advance = (progress or silent_progress)(f"label · {source.name}", len(todo))
        cases = [t.case((headers or {}).get(t.model, "")) for t in todo]
        for chunk, labels in in_chunks(source, cases):  # each chunk stored as it is labelled
            store.put_labels([LabelRow(t.key, source.version, label)
                              for t, label in zip(todo[chunk], labels)])
            advance(len(labels))
        count += len(todo)
    return count


def judge_with_all(store: RunStore, judges: Sequence[Judge], scope: JudgeScope,
                   progress: Progress | None = None, threshold: float = 0.7) -> int:
    """Label with each judge (each under its own source); with two or more, their majority
    becomes a source of its own that decides in the judges' place (:mod:`.majority`).
    Returns the turns sent, over all judges."""
    sent = sum(judge_turns(store, judge, scope, progress, threshold=threshold)
               for judge in judges)
    if len(judges) > 1:
        store_majority(store, [judge.name for judge in judges], scope)
    return sent


def judge_turns(store: RunStore, judge: Judge, scope: JudgeScope,
                progress: Progress | None = None, chunk: int = 1,
                threshold: float = 0.7) -> int:
    """Label the run's user turns with an LLM judge: those the rules left undecided, those the
    cascade labelled with a classifier probability below ``threshold`` (``uncertain``), or all.

    Cached by judge name (which carries the rubric version) and generation key: turns this judge
    already labelled successfully are not sent again; a failed verdict (an error label) is
    retried by the next call. Verdicts are paid for: each is committed as it arrives (``chunk``
    at a time; a commit costs far less than a request), and whatever was received when
    interrupted (Ctrl-C, SIGTERM) is committed before the interrupt goes on. Returns the number
    of turns sent; the outcome (sent, failed, first error) is counted in ``store.tally``. The
    judge then decides the run's turns in the place :func:`.sources.source_order` gives it.
    """
    done = store.labelled_keys(judge.name, judge.version)
    candidates = [t for t in read_turns(store, judge.name) if t.error is None
                  and t.key not in done]
    turns = [t for t in candidates if _judge_wanted(t, scope, threshold)]
    undecided = [t for t in candidates if _rules_undecided(t)]
    if scope == "uncertain" and undecided and not any(
            _stored(t, CLASSIFIER) for t in undecided):
        raise UserturnError("judge scope 'uncertain' needs the classifier's labels: run "
                            "`userturn label RUN` first (or use --scope undecided)")
    advance = (progress or silent_progress)(f"judge {judge.name}", len(turns))
    received: list[LabelRow] = []
    verdicts = judge.classify_as_done([turn.case() for turn in turns])
    try:
        for index, label in verdicts:
            received.append(LabelRow(turns[index].key, judge.version, label))
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
    labeller = store.meta().offline_labeller
    store.update_meta(label_sources=source_order(labeller, [judge.name], scope))
    return len(turns)


def _stored(turn: Turn, source: str) -> StoredLabel | None:
    return next((lab for lab in turn.labels if lab.source == source), None)


def _rules_undecided(turn: Turn) -> bool:
    rules = _stored(turn, RULES)
    return rules is None or rules.label is None


def _judge_wanted(turn: Turn, scope: str, threshold: float) -> bool:
    """Whether the judge is asked about this turn, by scope."""
    if scope == "all":
        return True
    if not _rules_undecided(turn):
        return False  # the rules' clear cases stand
    if scope == "undecided":
        return True
    learned = _stored(turn, CLASSIFIER)
    return learned is not None and (learned.probability or 0.0) < threshold


def _assistant_header(backend: Backend) -> str:
    from userturn.chat.render import derive_markers

    try:
        return derive_markers(backend.template).assistant_header.strip()
    except TemplateError:
        return ""
