"""Agreement between label sources: Cohen's kappa with an interval clustered by item.

A run store can hold several labels of the same generated user turn: the rule classifier
(``rules``; label None = undecided), LLM judges (``judge:<model>@<rubric>``; label None with an
error = invalid answer) and people (``human:<name>``). The paper validates its judge against blind
human labels at Cohen's kappa 0.726; this module computes the same statistic for every pair of
sources in a run, so a judge (or the rules) can be checked against people before its rates are
trusted.

- :func:`cohen_kappa`, :func:`confusion_matrix`, :func:`per_label`: the statistics of a list of
  ``(label_a, label_b)`` pairs, one per turn labelled by both raters.
- :func:`kappa_interval`: percentile bootstrap interval of kappa over *items* (all turns of an
  item are drawn together: the samples of one item are not independent, as in :mod:`.stats`).
- :func:`pairwise_agreement`: every pair of sources of a run's turns, as :class:`Agreement`
  records (:mod:`userturn.report.agreement` prints them).

Conventions. Kappa is ``(p_o - p_e) / (1 - p_e)`` with ``p_o`` the observed agreement and ``p_e``
the agreement expected by chance from the two raters' marginal label frequencies. It is computed
from integer counts, ``(n * agree - sum_k r_k c_k) / (n**2 - sum_k r_k c_k)``, so the undefined
case is detected exactly: when ``p_e = 1`` (both raters constant and on the same label, or no pair
at all) kappa is NaN, never 1 or an exception. The statistics here never raise on degenerate data;
they raise ``ValueError`` only on misuse (a label outside ``labels``, bad bootstrap settings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from userturn.records import HUMAN_PREFIX, LABELS, RULES_SOURCE, Turn
from userturn.stats.rates import check_bootstrap, percentiles
from userturn.stats.reliability import constant_baseline, gwet_ac1, pabak, per_label

_NAN = float("nan")
_CHUNK = 256  # bootstrap resamples evaluated at once (bounds memory on large runs)

Pair = tuple[str, str]


# --------------------------------------------------------------------------------------------
# Statistics of a list of pairs
# --------------------------------------------------------------------------------------------

def _codes(pairs: Sequence[Pair], labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    index = {label: i for i, label in enumerate(labels)}
    try:
        a = np.array([index[x] for x, _ in pairs], dtype=np.int64)
        b = np.array([index[y] for _, y in pairs], dtype=np.int64)
    except KeyError as missing:
        raise ValueError(f"label {missing.args[0]!r} is not one of {tuple(labels)}") from None
    return a, b


def confusion_matrix(pairs: Sequence[Pair], labels: Sequence[str] = LABELS) -> list[list[int]]:
    """Counts of ``(label_a, label_b)`` pairs: ``matrix[i][j]`` is the number of turns rater A
    labelled ``labels[i]`` and rater B labelled ``labels[j]`` (rows = A, columns = B)."""
    a, b = _codes(pairs, labels)
    k = len(labels)
    flat = np.bincount(a * k + b, minlength=k * k) if len(a) else np.zeros(k * k, dtype=np.int64)
    return [[int(v) for v in row] for row in flat.reshape(k, k)]


def _kappa_of_counts(counts: np.ndarray) -> np.ndarray:
    """Kappa of confusion matrices ``(..., k, k)`` of integer counts; NaN where ``p_e = 1``."""
    counts = np.asarray(counts, dtype=np.int64)
    n = counts.sum(axis=(-2, -1))
    agree = np.trace(counts, axis1=-2, axis2=-1)
    chance = (counts.sum(axis=-1) * counts.sum(axis=-2)).sum(axis=-1)  # sum_k r_k c_k
    numerator = (n * agree - chance).astype(float)
    denominator = (n * n - chance).astype(float)
    out = np.full(np.shape(n), _NAN)
    ok = denominator > 0
    np.divide(numerator, denominator, out=out, where=ok)
    return out


def cohen_kappa(pairs: Sequence[Pair], labels: Sequence[str] = LABELS) -> float:
    """Cohen's kappa of two raters from ``(label_a, label_b)`` pairs, one per rated unit.

    ``kappa = (p_o - p_e) / (1 - p_e)``: 1 is perfect agreement, 0 agreement at chance level given
    each rater's label frequencies, negative worse than chance. Labels missing from the data do not
    change it. NaN when undefined: no pairs, or ``p_e = 1`` (both raters gave one and the same
    label to every unit, so agreement carries no information beyond the marginals)."""
    return float(_kappa_of_counts(np.array(confusion_matrix(pairs, labels))))


def observed_agreement(pairs: Sequence[Pair]) -> float:
    """Share of pairs on which the raters agree (``p_o``); NaN with no pairs."""
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else _NAN


def kappa_interval(pairs: Sequence[Pair], items: Sequence[Hashable], *, resamples: int = 2000,
                   seed: int = 0, level: float = 0.95,
                   labels: Sequence[str] = LABELS) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`cohen_kappa`, clustered by item.

    ``items[i]`` is the item (e.g. the dataset question) of ``pairs[i]``. Each resample draws the
    distinct items with replacement and keeps all of each drawn item's turns, so several turns of
    one item count as one unit of evidence, not many; the interval is therefore wider when turns
    are concentrated in few items. Resamples where kappa is undefined (``p_e = 1``) are skipped.
    With no pairs, or no resample with a kappa, the interval is ``(nan, nan)``; with one item it is
    the degenerate ``(kappa, kappa)``."""
    check_bootstrap(resamples, level)
    if len(items) != len(pairs):
        raise ValueError(f"pairs and items must have the same length, got {len(pairs)} and "
                         f"{len(items)}")
    if not pairs:
        return _NAN, _NAN
    a, b = _codes(pairs, labels)
    k = len(labels)
    cluster_of: dict[Hashable, int] = {}
    clusters = np.array([cluster_of.setdefault(item, len(cluster_of)) for item in items])
    m = len(cluster_of)
    # per_item[c] is item c's confusion matrix, flattened.
    per_item = np.zeros((m, k * k), dtype=np.int64)
    np.add.at(per_item, (clusters, a * k + b), 1)
    if m == 1:
        kappa = float(_kappa_of_counts(per_item[0].reshape(k, k)))
        return kappa, kappa
    rng = np.random.default_rng(seed)
    kappas = []
    for start in range(0, resamples, _CHUNK):
        rows = min(_CHUNK, resamples - start)
        draws = rng.integers(0, m, size=(rows, m))
        # weights[r, c]: how many times resample r drew item c.
        weights = np.bincount((np.arange(rows)[:, None] * m + draws).ravel(),
                              minlength=rows * m).reshape(rows, m)
        kappas.append(_kappa_of_counts((weights @ per_item).reshape(rows, k, k)))
    values = np.concatenate(kappas)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return _NAN, _NAN
    return percentiles(values, level)


# --------------------------------------------------------------------------------------------
# Pairs of sources of a run
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Agreement:
    """Agreement of source ``a`` (the reference for precision and recall) with source ``b``.

    ``n``: turns both sources labelled with a label; ``kappa`` with its item-clustered bootstrap
    interval ``[low, high]`` (NaN when ``n < 2`` or undefined); ``raw``: observed agreement;
    ``matrix``: confusion matrix over ``labels`` (rows = a, columns = b); ``per_label``: as
    :func:`per_label`. ``excluded``: turns both sources labelled where at least one gave None
    (rules undecided, judge invalid); ``excluded_a`` / ``excluded_b``: of those, where ``a`` / ``b``
    gave None (a turn where both did counts in both). ``items``: distinct items of the ``n``
    turns."""

    a: str
    b: str
    n: int
    kappa: float
    low: float
    high: float
    raw: float
    matrix: list[list[int]]
    per_label: dict[str, dict[str, Any]]
    excluded: int
    excluded_a: int = 0
    excluded_b: int = 0
    items: int = 0
    labels: tuple[str, ...] = field(default=LABELS)
    ac1: float = _NAN  # Gwet's AC1 (.reliability)
    pabak: float = _NAN  # prevalence- and bias-adjusted kappa
    baseline: float = _NAN  # agreement of always giving a's most common label
    baseline_label: str | None = None


def source_rank(source: str) -> tuple[int, str]:
    """Where a source stands among raters: people (0), judges (1), the rules (2), the rest (3)."""
    if source.startswith(HUMAN_PREFIX):
        group = 0
    elif source.startswith("judge:"):
        group = 1
    elif source == RULES_SOURCE:
        group = 2
    else:
        group = 3
    return group, source


def order_sources(sources: Sequence[str]) -> list[str]:
    """Humans first, then judges, then the rules, then anything else; by name within a group."""
    return sorted(dict.fromkeys(sources), key=source_rank)


def pairwise_agreement(turns: Sequence[Turn], *, sources: Sequence[str] | None = None,
                       resamples: int = 2000, seed: int = 0,
                       level: float = 0.95) -> list[Agreement]:
    """:class:`Agreement` of every pair of label sources of a run's user turns.

    Without ``sources``, every source with a label of a turn, ordered humans, judges, rules
    (so a person is the reference ``a`` whenever one is in the pair); with ``sources``, those in
    the given order (a source that labelled no turn gives pairs with ``n = 0``). Pairs are
    ``(sources[i], sources[j])`` for ``i < j``. A pair is compared on the turns both labelled with
    a label; turns where either gave None are counted in ``excluded``. The interval is clustered
    by item, an item being ``(dataset, item_id)`` across models and temperatures (turns generated
    from the same question are not independent). Pairs with fewer than 2 compared turns get NaN
    kappa; nothing here raises on sparse data. Labels outside :data:`LABELS` (if a source stored
    any) are appended to the label set rather than rejected."""
    by_source: dict[str, dict[str, str | None]] = {}
    for turn in turns:
        for label in turn.labels:
            by_source.setdefault(label.source, {})[turn.key] = label.label
    chosen = order_sources(list(by_source)) if sources is None else list(dict.fromkeys(sources))
    item_of = {t.key: (t.dataset, t.item_id) for t in turns}
    extra = sorted({label for labels in by_source.values() for label in labels.values()
                    if label is not None and label not in LABELS})
    label_set = (*LABELS, *extra)
    results = []
    for i, a in enumerate(chosen):
        for b in chosen[i + 1:]:
            results.append(_compare(a, b, by_source.get(a, {}), by_source.get(b, {}), item_of,
                                    label_set, resamples=resamples, seed=seed, level=level))
    return results


def _compare(a: str, b: str, labels_a: Mapping[str, str | None], labels_b: Mapping[str, str | None],
             item_of: Mapping[str, Hashable], label_set: tuple[str, ...], *, resamples: int,
             seed: int, level: float) -> Agreement:
    shared = sorted(key for key in labels_a if key in labels_b)
    none_a = sum(1 for key in shared if labels_a[key] is None)
    none_b = sum(1 for key in shared if labels_b[key] is None)
    kept = [key for key in shared if labels_a[key] is not None and labels_b[key] is not None]
    pairs = [(labels_a[key], labels_b[key]) for key in kept]
    items = [item_of.get(key, key) for key in kept]  # an unknown key is its own cluster
    n = len(pairs)
    if n >= 2:
        kappa = cohen_kappa(pairs, label_set)  # type: ignore[arg-type]
        low, high = kappa_interval(pairs, items, resamples=resamples, seed=seed,  # type: ignore
                                   level=level, labels=label_set)
        if math.isnan(kappa):
            low = high = _NAN
    else:
        kappa = low = high = _NAN
    return Agreement(
        a=a, b=b, n=n, kappa=kappa, low=low, high=high,
        raw=observed_agreement(pairs),  # type: ignore[arg-type]
        matrix=confusion_matrix(pairs, label_set),  # type: ignore[arg-type]
        per_label=per_label(pairs, label_set),  # type: ignore[arg-type]
        excluded=len(shared) - n, excluded_a=none_a, excluded_b=none_b,
        items=len(set(items)), labels=label_set,
        ac1=gwet_ac1(pairs, label_set), pabak=pabak(pairs, label_set),  # type: ignore[arg-type]
        baseline=constant_baseline(pairs)[1],  # type: ignore[arg-type]
        baseline_label=constant_baseline(pairs)[0])  # type: ignore[arg-type]
