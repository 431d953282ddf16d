"""The human-labelled calibration sample behind corrected rates (:mod:`userturn.stats.correction`).

- :func:`calibration_sample`: ``userturn annotate RUN --calibration N``: turns drawn at random,
  stratified by the labeller's predicted label (follow-up or not), half of the slots on the
  predicted follow-ups so the rare ones are seen; each turn's inclusion probability
  (``slots / turns`` of its stratum) is stored with the sample, so the correction weights it back.
- :func:`inclusion_probabilities`: the inclusion probability of every human-labelled turn, from
  the stored samples: a calibration sample's own; an older stratified annotation sample's
  recomputed from its strata; labels imported or made without a sample are taken as a simple
  random sample of the run's turns (the only assumption possible without a design).
- :func:`imported_labels`: ``userturn annotate RUN --import FILE --annotator NAME``: ``key,label``
  rows from a CSV or JSONL file made elsewhere, every row checked before any is stored.

The labeller is whatever non-human source the run reads (rules, a classifier, a judge, or a
cascade of them): the turns' resolved label, so any label source works the same way.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Sequence

from userturn.data.rows import json_lines, suffixes_of
from userturn.errors import UserturnError
from userturn.records import HUMAN_PREFIX, LABELS, Label, Turn, human_label
from userturn.store.database import RunStore
from userturn.store.meta import AnnotationSample
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns

PREDICTED = ("follow_up", "other")  # the calibration strata
# Human labels come as JSON Lines (a .json file too, one object a line) or else as CSV.
JSONL_SUFFIXES = (*suffixes_of(("jsonl",)), ".json")


class CalibrationError(UserturnError):
    """A calibration sample or a label import that cannot be made as asked."""


def _stratum(turn: Turn) -> str:
    return PREDICTED[0] if turn.follow_up else PREDICTED[1]


def calibration_sample(turns: Sequence[Turn], size: int,
                       seed: int = 0) -> tuple[list[str], dict[str, float]]:
    """``size`` turn keys stratified by the predicted label, and each chosen key's inclusion
    probability. Only turns that count toward a rate can be drawn."""
    if size < 1:
        raise CalibrationError(f"calibration sample size must be at least 1, got {size}")
    strata: dict[str, list[str]] = {name: [] for name in PREDICTED}
    for turn in turns:
        if turn.counts_toward_rate:
            strata[_stratum(turn)].append(turn.key)
    available = {name: len(keys) for name, keys in strata.items()}
    if not sum(available.values()):
        raise CalibrationError("the run has no labelled or undecided user turns to sample")
    take = {PREDICTED[0]: min(available[PREDICTED[0]], size // 2 + size % 2)}
    take[PREDICTED[1]] = min(available[PREDICTED[1]], size - take[PREDICTED[0]])
    take[PREDICTED[0]] = min(available[PREDICTED[0]], size - take[PREDICTED[1]])
    rng = random.Random(seed)
    keys: list[str] = []
    inclusion: dict[str, float] = {}
    for name in PREDICTED:
        pool = sorted(strata[name])  # the store's row order must not matter
        chosen = rng.sample(pool, take[name])
        keys += chosen
        inclusion.update({key: take[name] / len(pool) for key in chosen})
    rng.shuffle(keys)
    return keys, inclusion


def inclusion_probabilities(store: RunStore, turns: Sequence[Turn]) -> dict[str, float]:
    """``key -> inclusion probability`` of the turns labelled by the first human source that
    labelled them (the human label the correction uses, see :func:`human_label`)."""
    meta = store.meta()
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
            out.update({key: float(stored[key]) for key in keys})
        elif sample is not None and sample.strata_source and keys <= set(sample.keys):
            out.update(_stratified_inclusion(store, sample, keys))
        else:
            out.update(dict.fromkeys(keys, min(1.0, len(keys) / max(1, len(eligible)))))
    return out


def _stratified_inclusion(store: RunStore, sample: AnnotationSample,
                          keys: set[str]) -> dict[str, float]:
    """An annotation sample stratified by a source's seven labels: slots over stratum size."""
    stratum_of = {t.key: t.label or "undecided"
                  for t in read_turns(store, sample.strata_source) if t.error is None}
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
