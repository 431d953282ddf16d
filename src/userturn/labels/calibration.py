"""The human-labelled calibration sample behind corrected rates (:mod:`userturn.stats.correction`).

- :func:`sample_plan`: ``userturn annotate RUN --plan --half-width H``: per condition, how many
  human labels give its corrected rate an interval of half-width ``H``, from the run's own
  predicted rates and the labeller's measured error (:func:`labeller_errors`; the math is
  :mod:`userturn.stats.planning`). Labels already given count toward it.
- :func:`calibration_sample`: ``userturn annotate RUN --calibration N``: ``N`` labels shared
  between the conditions so the widest expected interval is as narrow as it can be
  (:func:`~userturn.stats.planning.allocate`), then drawn at random within each condition,
  stratified by the labeller's predicted label (follow-up or not), half of a condition's labels
  on its predicted follow-ups so the rare ones are seen. Turns a person labelled already are
  not drawn again: they count as part of the sample, and each turn's inclusion probability
  (labelled turns / turns of its condition's stratum, those labelled before included) is stored
  with the sample, so the correction weights it back. The keys are ordered so that every
  condition reaches the labels a corrected rate needs first.
- :func:`inclusion_probabilities`: the inclusion probability of every human-labelled turn, from
  the stored samples: a calibration sample's own, for the turns it lists as labelled (a sample
  labelled in part is weighted by the share of each stratum labelled so far); an older
  stratified annotation sample's recomputed from its strata; labels imported or made without a
  sample are taken as a simple random sample of the run's turns (the only assumption possible
  without a design).
- :func:`imported_labels`: ``userturn annotate RUN --import FILE --annotator NAME``: ``key,label``
  rows from a CSV or JSONL file made elsewhere, every row checked before any is stored.

The labeller is whatever non-human source the run reads (rules, a classifier, a judge, or a
cascade of them): the turns' resolved label, so any label source works the same way.
"""

from __future__ import annotations

import csv
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from userturn.data.rows import json_lines, suffixes_of
from userturn.errors import UserturnError
from userturn.labels.offline_error import CARDS, offline_confusion, offline_gap
from userturn.labels.sources import classifier_of, is_classifier, is_offline
from userturn.records import HUMAN_PREFIX, LABELS, Condition, Label, Turn, human_label, is_human
from userturn.stats.correction import MIN_HUMAN_LABELS
from userturn.stats.planning import (
    Confusion,
    ErrorOf,
    LabellerError,
    PlanRow,
    allocate,
    condition_order,
    design_of,
    plan_run,
    split,
)
from userturn.store.database import RunStore
from userturn.store.meta import AnnotationSample, RunMeta
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns, with_sources

PREDICTED = ("follow_up", "other")  # the calibration strata
# Human labels come as JSON Lines (a .json file too, one object a line) or else as CSV.
JSONL_SUFFIXES = (*suffixes_of(("jsonl",)), ".json")


class CalibrationError(UserturnError):
    """A calibration sample or a label import that cannot be made as asked."""


def _stratum(turn: Turn) -> str:
    return PREDICTED[0] if turn.follow_up else PREDICTED[1]


# -- the labeller's error and the plan ----------------------------------------------------------
def labeller_errors(sources: Sequence[str]) -> ErrorOf:
    """The measured error of each label source of a run with ``sources``, as the plan reads it:
    the offline error card's pooled confusion table for the rules and the classifier (the
    shipped cascade's where the run has a classifier, the rules' alone where it has none) and
    for undecided turns; a judge's ``userturn corpus check-judge`` result. A source never
    measured (a judge not checked, the judges' majority, a classifier of the user's) is planned
    with the offline labeller's error and marked unchecked."""
    classifier = classifier_of(sources) if any(map(is_classifier, sources)) else None
    card = CARDS.get(classifier or "rules", "context")
    offline = LabellerError(offline_confusion(card) or _FALLBACK,
                            f"the offline error card ({card})",
                            checked=classifier is None or classifier in CARDS,
                            gap=offline_gap(card))

    def error_of(source: str | None) -> LabellerError:
        if source is None or is_offline(source) or is_human(source):
            return offline
        checked = _judge_confusion(source)
        if checked is None:
            return LabellerError(offline.confusion, f"{source}: not checked against people; "
                                 f"{offline.source} stands in", checked=False, gap=offline.gap)
        # A judge check has no per-condition rates: the offline labeller's spread stands in.
        return LabellerError(checked, f"userturn corpus check-judge ({source})", gap=offline.gap)

    return error_of


# Where the card cannot be read: kappa about 0.4 at a rate of 20% (the card's SmolLM2 fold).
_FALLBACK: Confusion = ((129, 110), (193, 1453))


@lru_cache(maxsize=16)
def _judge_confusion(source: str) -> Confusion | None:
    """A judge's follow-up confusion table from its stored check, None where it has none."""
    from userturn.labels.judge_check import load_check  # the check-judge command's store

    check = load_check(source)
    if check is None:
        return None
    (a, b), (c, d) = check.overall.follow_up_confusion
    return (int(a), int(b)), (int(c), int(d))


def sample_plan(store: RunStore, half_width: float, level: float = 0.95) -> list[PlanRow]:
    """Per condition of the run in ``store``, the human labels that give its corrected rate an
    interval of ``half_width`` (reads only)."""
    return plan_run(read_turns(store), labeller_errors(store.label_sources()), half_width, level)


# -- the calibration sample ---------------------------------------------------------------------
def calibration_sample(turns: Sequence[Turn], size: int, seed: int = 0,
                       sources: Sequence[str] | None = None
                       ) -> tuple[list[str], dict[str, float]]:
    """Up to ``size`` new turn keys, shared between conditions as :func:`allocate` says and
    stratified by the predicted label within each, and the inclusion probability of every turn
    of the sample: the new ones and, in the conditions it draws from, the turns people labelled
    before. Only turns that count toward a rate can be drawn. ``sources``: the run's label
    sources (default: those that decided the turns)."""
    if size < 1:
        raise CalibrationError(f"calibration sample size must be at least 1, got {size}")
    groups = _by_condition(turns)
    if not groups:
        raise CalibrationError("the run has no labelled or undecided user turns to sample")
    if sources is None:
        sources = sorted({t.label_source for t in turns if t.label_source})
    error_of = labeller_errors(sources)
    conditions = sorted(groups, key=condition_order)
    shares = allocate([design_of(groups[c], error_of)[0] for c in conditions], size)
    rng = random.Random(seed)
    drawn: list[list[str]] = []
    inclusion: dict[str, float] = {}
    for condition, share in zip(conditions, shares):
        keys = _draw(groups[condition], share, rng, inclusion) if share else []
        drawn.append(keys)
    return _ordered(drawn, [_given(groups[c]) for c in conditions]), inclusion


def _by_condition(turns: Sequence[Turn]) -> dict[Condition, list[Turn]]:
    groups: dict[Condition, list[Turn]] = defaultdict(list)
    for turn in turns:
        if turn.counts_toward_rate:
            groups[Condition.of(turn)].append(turn)
    return groups


def _given(turns: Sequence[Turn]) -> int:
    return sum(1 for t in turns if human_label(t)[0] is not None)


def _draw(turns: Sequence[Turn], share: int, rng: random.Random,
          inclusion: dict[str, float]) -> list[str]:
    """``share`` new keys of one condition, half on its predicted follow-ups, shuffled; every
    turn of the condition's sample (new and labelled before) gets its stratum's labelled share
    as inclusion probability."""
    strata: dict[str, list[str]] = {name: [] for name in PREDICTED}
    known: dict[str, list[str]] = {name: [] for name in PREDICTED}
    for turn in turns:
        (known if human_label(turn)[0] is not None else strata)[_stratum(turn)].append(turn.key)
    take = split((len(strata[PREDICTED[0]]), len(strata[PREDICTED[1]])), share)
    chosen: list[str] = []
    for name, count in zip(PREDICTED, take):
        pool = sorted(strata[name])  # the store's row order must not matter
        picked = rng.sample(pool, count)
        if pool or known[name]:
            share_labelled = (count + len(known[name])) / (len(pool) + len(known[name]))
            inclusion.update(dict.fromkeys(picked + known[name], share_labelled))
        chosen += picked
    rng.shuffle(chosen)
    return chosen


def _ordered(drawn: Sequence[Sequence[str]], given: Sequence[int]) -> list[str]:
    """The keys in the order the page shows them: first the labels each condition still needs
    for a corrected rate, taking the conditions in turn, then the rest in turn; within a
    condition the drawn order (random), so any prefix is a random part of each stratum."""
    first = [list(keys[:max(0, MIN_HUMAN_LABELS - done)]) for keys, done in zip(drawn, given)]
    rest = [list(keys[len(head):]) for keys, head in zip(drawn, first)]
    order: list[str] = []
    for phase in (first, rest):
        while any(phase):
            for keys in phase:
                if keys:
                    order.append(keys.pop(0))
    return order


# -- the page's progress toward the plan -------------------------------------------------------
@dataclass(frozen=True)
class ConditionPlan:
    """One condition of a sample: its keys, and the turns of it other people labelled."""

    condition: Condition
    keys: frozenset[str]
    others: int


def condition_plans(turns: Sequence[Turn], keys: Sequence[str],
                    source: str) -> list[ConditionPlan]:
    """The conditions the sample ``keys`` draws from and those that could have a corrected rate
    (as many turns as it needs labels), in the run's order, with how many of their turns a
    person other than ``source`` labelled (they count toward a corrected rate too)."""
    wanted = set(keys)
    sampled: dict[Condition, set[str]] = {}
    others: dict[Condition, int] = {}
    sizes = Counter(Condition.of(t) for t in turns if t.counts_toward_rate)
    for turn in turns:
        if not turn.counts_toward_rate:
            continue
        condition = Condition.of(turn)
        if turn.key in wanted or sizes[condition] >= MIN_HUMAN_LABELS:
            sampled.setdefault(condition, set())
        if turn.key in wanted:
            sampled[condition].add(turn.key)
        if any(lab.source != source and lab.label is not None and is_human(lab.source)
               for lab in turn.labels):
            others[condition] = others.get(condition, 0) + 1
    return [ConditionPlan(c, frozenset(sampled[c]), others.get(c, 0))
            for c in sorted(sampled, key=condition_order)]


def progress_of(plans: Sequence[ConditionPlan], mine: set[str]) -> dict[str, Any]:
    """Per condition the labels made and planned (others' included) against the minimum of a
    corrected rate, and how many more until every condition that can reach it does."""
    rows = [{"done": p.others + len(p.keys & mine), "planned": p.others + len(p.keys),
             "needed": MIN_HUMAN_LABELS} for p in plans]
    reachable = [r for r in rows if r["planned"] >= MIN_HUMAN_LABELS]
    return {"to_correction": sum(max(0, MIN_HUMAN_LABELS - r["done"]) for r in reachable),
            "conditions": rows, "short": len(rows) - len(reachable)}


def inclusion_probabilities(meta: RunMeta, turns: Sequence[Turn]) -> dict[str, float]:
    """``key -> inclusion probability`` of the turns labelled by the first human source that
    labelled them (the human label the correction uses, see :func:`human_label`); a turn a
    calibration sample lists (its own, or one labelled before it was drawn) takes the latest
    such sample's probability, as labelled so far. ``turns``: every turn of the run, as read
    (each with all its stored labels), so nothing is read again; ``meta``: its metadata."""
    by_source: dict[str, set[str]] = {}
    for turn in turns:
        source = human_label(turn)[1]
        if source is not None:
            by_source.setdefault(source, set()).add(turn.key)
    eligible = [t for t in turns if t.counts_toward_rate]
    out: dict[str, float] = {}
    for source, keys in by_source.items():
        sample = meta.annotation_samples.get(source[len(HUMAN_PREFIX):])
        stored = sample.inclusion if sample is not None else None
        if stored and keys <= set(stored):
            continue  # below, with every calibration sample
        if sample is not None and sample.strata_source and keys <= set(sample.keys):
            out.update(_stratified_inclusion(turns, sample, keys))
        else:
            out.update(dict.fromkeys(keys, min(1.0, len(keys) / max(1, len(eligible)))))
    labelled = set().union(*by_source.values()) if by_source else set()
    condition = {t.key: Condition.of(t) for t in turns}
    for sample in meta.annotation_samples.values():  # in the order they were drawn
        if sample.inclusion:
            out.update(_realised(sample.inclusion, labelled, condition))
    return out


def _realised(stored: Mapping[str, float], labelled: set[str],
              condition: Mapping[str, Condition]) -> dict[str, float]:
    """A calibration sample's inclusion probabilities as labelled so far: within each stratum
    of a condition (the keys sharing a condition and a stored probability) the labelled turns
    are a random part of the sample's (the page shows them in random order within a
    condition), so each stands for ``stored * labelled / listed`` of the stratum."""
    cells: dict[tuple[Condition, float], list[str]] = defaultdict(list)
    for key, probability in stored.items():
        if key in condition:
            cells[(condition[key], float(probability))].append(key)
    out = {}
    for (_, probability), keys in cells.items():
        done = [key for key in keys if key in labelled]
        out.update(dict.fromkeys(done, probability * len(done) / len(keys)))
    return out


def _stratified_inclusion(turns: Sequence[Turn], sample: AnnotationSample,
                          keys: set[str]) -> dict[str, float]:
    """An annotation sample stratified by a source's seven labels: slots over stratum size
    (the strata are the run's turns resolved by that source alone)."""
    strata = [sample.strata_source] if sample.strata_source else []
    stratum_of = {t.key: t.label or "undecided"
                  for t in with_sources(turns, strata) if t.labellable}
    sizes: dict[str, int] = {}
    for stratum in stratum_of.values():
        sizes[stratum] = sizes.get(stratum, 0) + 1
    slots: dict[str, int] = {}
    for key in sample.keys:
        if key in stratum_of:
            slots[stratum_of[key]] = slots.get(stratum_of[key], 0) + 1
    return {key: slots[stratum_of[key]] / sizes[stratum_of[key]] for key in keys
            if key in stratum_of}


def imported_labels(store: RunStore, path: Path, annotator: str
                    ) -> list[LabelRow]:
    """The ``key,label`` rows of ``path`` (CSV with a header, or JSONL) as label rows of
    ``human:NAME``, every row checked against the run (open to read only: the CLI
    stores them after, under the lock). An unknown key or label is named with its line."""
    path = Path(path)
    rows = _jsonl_rows(path) if path.suffix.lower() in JSONL_SUFFIXES else _csv_rows(path)
    known = {row.key for row in store.user_turn_rows()}
    labels = []
    for line, key, label in rows:
        if key not in known:
            raise CalibrationError(f"{path} line {line}: unknown key {key!r} (keys as in "
                                   "userturn export)")
        if label not in LABELS:
            raise CalibrationError(f"{path} line {line}: unknown label {label!r} (one of "
                                   f"{', '.join(LABELS)})")
        labels.append(LabelRow(key, "human", Label(
            label, source=f"{HUMAN_PREFIX}{annotator}",  # type: ignore[arg-type]
            rationale="imported")))
    if not labels:
        raise CalibrationError(f"{path} holds no key,label rows")
    return labels


def _csv_rows(path: Path) -> list[tuple[int, str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
                               ) from None
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or not {"key", "label"} <= set(reader.fieldnames):
        raise CalibrationError(f"{path} line 1: a CSV header with key and label is needed")
    return [(reader.line_num, (row.get("key") or "").strip(), (row.get("label") or "").strip())
            for row in reader]


def _jsonl_rows(path: Path) -> list[tuple[int, str, str]]:
    rows = []
    for line in json_lines(path):
        if line.error is not None or not isinstance(line.value, dict):
            raise CalibrationError(f"{path} line {line.number}: "
                                   f"{line.error or 'not a JSON object'}")
        record = line.value
        rows.append((line.number, str(record.get("key", "")), str(record.get("label", ""))))
    return rows
