"""Rates with intervals that respect the design.

Several user turns sampled from the same item are not independent, so the interval of a rate is
clustered by item: the rate is pooled (sum of hits over sum of turns) and its interval is a
Wilson score interval on the effective sample size the items' spread leaves (:mod:`.intervals`).

Comparisons on the same items (perturbed vs original, trained vs base, model A vs B) are paired:
an item that is easy for one side is usually easy for the other, so resampling the two sides
independently would charge the comparison with the between-item variance twice and give intervals
that are far too wide. The paired statistics below resample (or test) the items jointly:

- :func:`paired_difference`: difference of pooled rates on the shared items, paired clustered
  score interval (several samples per item on each side).
- :func:`mcnemar_exact`: exact McNemar test for one binary outcome per item on each side (e.g.
  greedy follow-up yes/no before vs after).
- :func:`rank_correlation`: Spearman's rho with a bootstrap interval over paired points (e.g. task
  accuracy vs follow-up rate across models).
- :func:`joint_table`: follow-up rate when the item's answer was right vs wrong.

Rates and paired differences get score intervals on the design-effect-adjusted effective sample
size (:mod:`.intervals`; their coverage is checked by simulation in tests/test_coverage.py and
tabulated in docs/statistics.md); the rank correlation keeps a percentile bootstrap with a fixed
``seed``, so results are reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from userturn.stats.intervals import clustered_interval, paired_interval


@dataclass(frozen=True)
class Rate:
    hits: int
    n: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.hits / self.n if self.n else float("nan")


def clustered_rate(pairs: Iterable[tuple[Hashable, bool]], *, level: float = 0.95) -> Rate:
    """Pooled rate of ``(cluster, hit)`` observations (hits over turns), with the clustered
    Wilson interval of :mod:`.intervals` (effective n between the cluster count and the turn
    count). No observation gives NaN; otherwise the interval has positive width."""
    check_level(level)
    per_cluster = _per_item(pairs)
    if not per_cluster:
        return Rate(0, 0, float("nan"), float("nan"))
    hits, sizes = np.array(list(per_cluster.values()), dtype=float).T
    low, high = clustered_interval(hits, sizes, level)
    return Rate(int(hits.sum()), int(sizes.sum()), float(low), float(high))


# --------------------------------------------------------------------------------------------
# Paired statistics
# --------------------------------------------------------------------------------------------

_NAN = float("nan")


def check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be strictly between 0 and 1, got {level}")


def check_bootstrap(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    check_level(level)


def _per_item(pairs: Iterable[tuple[Hashable, Any]]) -> dict[Hashable, list[int]]:
    """``item -> [hits, samples]``, in order of first appearance."""
    per_item: dict[Hashable, list[int]] = {}
    for item, hit in pairs:
        counts = per_item.setdefault(item, [0, 0])
        counts[0] += int(bool(hit))
        counts[1] += 1
    return per_item


def percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Difference:
    """``delta = b.value - a.value`` on the shared items, with a paired interval.

    ``a`` and ``b`` are the pooled rates of each side over the shared items only (with the
    intervals :func:`clustered_rate` gives on those items). ``items`` is the number of
    shared items; ``dropped_a`` / ``dropped_b`` count the distinct items present on that side only
    (left out of everything)."""

    a: Rate
    b: Rate
    delta: float
    low: float
    high: float
    items: int
    dropped_a: int
    dropped_b: int


def paired_difference(a: Iterable[tuple[Hashable, bool]], b: Iterable[tuple[Hashable, bool]], *,
                      level: float = 0.95) -> Difference:
    """Difference of pooled rates, ``b`` minus ``a``, on the items both sides share.

    Each side is an iterable of ``(item, hit)`` observations; an item may have several samples,
    and the two sides may have different numbers of samples per item (the rate of a side is
    pooled: its hits over its samples). Items present on one side only are dropped and counted.

    Assumes items are the independent units and samples within an item are not (clustered), and
    that the two sides are measured on the same items, so item difficulty is shared (paired). The
    interval is :func:`~userturn.stats.intervals.paired_interval`: each side's clustered Wilson limits
    combined through the correlation of the two sides' item residuals, so the between-item
    variation cancels in the difference instead of being counted twice, as it would be by two
    independent clustered intervals. With one greedy turn per item it is Newcombe's interval
    for the McNemar design, the interval beside :func:`mcnemar_exact`'s p-value.

    With no shared item everything is NaN; otherwise the interval has positive width.
    """
    check_level(level)
    per_a, per_b = _per_item(a), _per_item(b)
    shared = [item for item in per_a if item in per_b]
    dropped_a = len(per_a) - len(shared)
    dropped_b = len(per_b) - len(shared)
    if not shared:
        empty = Rate(0, 0, _NAN, _NAN)
        return Difference(empty, empty, _NAN, _NAN, _NAN, 0, dropped_a, dropped_b)
    hits_a, sizes_a = np.array([per_a[item] for item in shared], dtype=float).T
    hits_b, sizes_b = np.array([per_b[item] for item in shared], dtype=float).T
    total_a, total_b = int(sizes_a.sum()), int(sizes_b.sum())
    delta = float(hits_b.sum() / total_b - hits_a.sum() / total_a)
    low, high = paired_interval(hits_a, sizes_a, hits_b, sizes_b, level)
    low_a, high_a = clustered_interval(hits_a, sizes_a, level)
    low_b, high_b = clustered_interval(hits_b, sizes_b, level)
    return Difference(Rate(int(hits_a.sum()), total_a, float(low_a), float(high_a)),
                      Rate(int(hits_b.sum()), total_b, float(low_b), float(high_b)),
                      delta, float(low), float(high), len(shared), dropped_a, dropped_b)


@dataclass(frozen=True)
class McNemar:
    """Paired 2x2 table of one binary outcome per shared item, and the exact McNemar p-value.

    ``b01``: a False, b True; ``b10``: a True, b False; ``b00`` / ``b11``: concordant.
    ``dropped_a`` / ``dropped_b`` count the items present on that side only."""

    b00: int
    b01: int
    b10: int
    b11: int
    p_value: float
    dropped_a: int = 0
    dropped_b: int = 0

    @property
    def items(self) -> int:
        return self.b00 + self.b01 + self.b10 + self.b11

    @property
    def discordant(self) -> int:
        return self.b01 + self.b10


def _binomial_half_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly (integer sums, one rounding at the end)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def mcnemar_exact(a: Mapping[Hashable, bool], b: Mapping[Hashable, bool]) -> McNemar:
    """Exact (binomial) McNemar test of ``a`` vs ``b``: one binary outcome per item on each side.

    Only items in both mappings count (the others are counted in ``dropped_a`` / ``dropped_b``).
    Under the null hypothesis that the outcome is as likely to switch one way as the other, the
    number of ``b01`` switches among the ``b01 + b10`` discordant items is Binomial(discordant,
    1/2); the two-sided p-value is ``min(1, 2 * P(X <= min(b01, b10)))``, and 1.0 when no item is
    discordant. Concordant items carry no information about the difference, which is why the test
    is paired: item difficulty shared by both sides cancels. Assumes items are independent and
    each has one outcome per side (greedy decoding); with several samples per item use
    :func:`paired_difference`. The exact test is conservative (its size is at most the level).
    """
    b00 = b01 = b10 = b11 = 0
    for item, outcome_a in a.items():
        if item not in b:
            continue
        before, after = bool(outcome_a), bool(b[item])
        if before and after:
            b11 += 1
        elif before:
            b10 += 1
        elif after:
            b01 += 1
        else:
            b00 += 1
    shared = b00 + b01 + b10 + b11
    discordant = b01 + b10
    p_value = 1.0 if discordant == 0 else min(1.0, 2 * _binomial_half_cdf(min(b01, b10),
                                                                          discordant))
    return McNemar(b00, b01, b10, b11, p_value, len(a) - shared,
                   sum(1 for item in b if item not in a))


@dataclass(frozen=True)
class Correlation:
    """Spearman's ``rho`` over ``n`` paired points with a percentile bootstrap interval
    ``[low, high]``. ``dropped`` counts the pairs left out because a value was not finite."""

    rho: float
    low: float
    high: float
    n: int
    dropped: int = 0


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Pearson correlation of 2-D arrays; NaN for rows where either side is constant."""
    dx = x - x.mean(axis=-1, keepdims=True)
    dy = y - y.mean(axis=-1, keepdims=True)
    sxx, syy = (dx * dx).sum(axis=-1), (dy * dy).sum(axis=-1)
    sxy = (dx * dy).sum(axis=-1)
    # Ranks are multiples of 1/2, so a constant row has exactly zero spread.
    ok = (sxx > 0) & (syy > 0)
    out = np.full(x.shape[0], np.nan)
    out[ok] = sxy[ok] / np.sqrt(sxx[ok] * syy[ok])
    return np.clip(out, -1.0, 1.0)


def _row_average_ranks(codes: np.ndarray) -> np.ndarray:
    """1-based average ranks (ties share the mean of their positions) of each row of a 2-D array
    of non-negative integer codes, vectorized: one global sort of ``row * span + code``."""
    rows, n = codes.shape
    span = int(codes.max()) + 1
    keys = (np.arange(rows)[:, None] * span + codes).ravel()
    ordered = np.sort(keys)
    offsets = (np.arange(rows) * n)[:, None]
    below = np.searchsorted(ordered, keys, side="left").reshape(rows, n) - offsets
    upto = np.searchsorted(ordered, keys, side="right").reshape(rows, n) - offsets
    return (below + 1 + upto) / 2


def rank_correlation(x: Sequence[float], y: Sequence[float], *, resamples: int = 2000,
                     seed: int = 0, level: float = 0.95) -> Correlation:
    """Spearman's rank correlation of paired points ``(x[i], y[i])``, with a bootstrap interval.

    rho is the Pearson correlation of the ranks, ties getting the average of the ranks they span.
    The interval is a percentile bootstrap over the paired points (each resample draws points
    with replacement, keeping each ``x`` with its ``y``); resamples in which one side is constant
    have no correlation and are skipped. Assumes the points are independent units (e.g. one per
    model: task accuracy vs follow-up rate); with a handful of points the interval is wide and
    only indicative.

    Pairs with a non-finite value (e.g. the NaN rate of a model with no labelled turn) are left
    out and counted in ``dropped``. With fewer than 3 remaining points, or a constant side, rho and
    the interval are NaN; this never raises. ``x`` and ``y`` of different lengths is an error.
    """
    check_bootstrap(resamples, level)
    xs, ys = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same length, got {xs.size} and {ys.size}")
    finite = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[finite], ys[finite]
    n, dropped = int(xs.size), int((~finite).sum())
    if n < 3:
        return Correlation(_NAN, _NAN, _NAN, n, dropped)
    # Integer codes keep the order and ties of the values, so a resample's ranks come from codes.
    code_x = np.unique(xs, return_inverse=True)[1].ravel()
    code_y = np.unique(ys, return_inverse=True)[1].ravel()
    rho = float(_pearson_rows(_row_average_ranks(code_x[None, :]),
                              _row_average_ranks(code_y[None, :]))[0])
    if math.isnan(rho):
        return Correlation(_NAN, _NAN, _NAN, n, dropped)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    rhos = _pearson_rows(_row_average_ranks(code_x[draws]), _row_average_ranks(code_y[draws]))
    rhos = rhos[~np.isnan(rhos)]
    if rhos.size == 0:
        return Correlation(rho, _NAN, _NAN, n, dropped)
    low, high = percentiles(rhos, level)
    return Correlation(rho, low, high, n, dropped)


@dataclass(frozen=True)
class RightWrong:
    """The follow-up rate after a right answer and after a wrong one (:func:`joint_table`).

    ``correct`` / ``wrong``: follow-ups among the turns after a right / wrong answer, clustered
    by item; ``items_correct`` / ``items_wrong``: distinct items with turns in that stratum;
    ``items_mixed``: items in both (possible only when the assistant answer varies across an
    item's samples; such an item is a cluster in each stratum); ``correct_hit`` ...
    ``wrong_miss``: turns per cell of the two-by-two table."""

    correct: Rate
    wrong: Rate
    items_correct: int
    items_wrong: int
    items_mixed: int
    correct_hit: int
    correct_miss: int
    wrong_hit: int
    wrong_miss: int


def joint_table(pairs: Iterable[tuple[Hashable, bool, bool]], *,
                level: float = 0.95) -> RightWrong:
    """Follow-up rate when the item's answer was right vs wrong: ``(item, correct, hit)`` triples,
    one per sampled user turn (``correct`` is the task score of the assistant answer the turn
    reacts to, so it normally repeats across an item's samples).

    The two rates come from different items, so they are not paired: compare them with their own
    intervals, not with :func:`paired_difference`.
    """
    check_level(level)
    strata: dict[bool, list[tuple[Hashable, bool]]] = {True: [], False: []}
    for item, correct, hit in pairs:
        strata[bool(correct)].append((item, bool(hit)))
    items_right = {item for item, _ in strata[True]}
    items_wrong = {item for item, _ in strata[False]}
    return RightWrong(
        correct=clustered_rate(strata[True], level=level),
        wrong=clustered_rate(strata[False], level=level),
        items_correct=len(items_right), items_wrong=len(items_wrong),
        items_mixed=len(items_right & items_wrong),
        correct_hit=sum(hit for _, hit in strata[True]),
        correct_miss=sum(not hit for _, hit in strata[True]),
        wrong_hit=sum(hit for _, hit in strata[False]),
        wrong_miss=sum(not hit for _, hit in strata[False]))


def direction(d: Difference, expected: str = "up") -> str:
    """Where a paired difference went relative to the expected direction ("up" or "down"):
    expected / opposite, with ``_ns`` when the interval includes 0; "none" for no change."""
    if d.items == 0 or not math.isfinite(d.delta) or d.delta == 0:
        return "none"
    towards = d.delta * (1 if expected == "up" else -1) > 0
    clear = d.low > 0 or d.high < 0
    return ("expected" if towards else "opposite") + ("" if clear else "_ns")


def single_sample_mcnemar(a: Sequence[tuple[Hashable, bool]],
                          b: Sequence[tuple[Hashable, bool]]) -> McNemar | None:
    """McNemar's exact test when each item has one outcome per side (greedy decoding); None
    when an item has several samples (then only the paired bootstrap applies)."""
    first, second = dict(a), dict(b)
    if len(first) != len(a) or len(second) != len(b):
        return None
    return mcnemar_exact(first, second)
