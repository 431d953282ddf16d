"""Score intervals for clustered rates: Wilson on the design-effect-adjusted effective n.

A run's user turns come in items (several sampled turns of one conversation are not independent),
and the headline rates are small (greedy follow-up rates near zero). A percentile bootstrap over
items cannot put mass above zero when no item has a hit, so it prints ``0% [0-0]`` and covers the
truth about half the time at 20 items and 3% (benchmarks/coverage.py, docs/statistics.md). The
intervals here instead:

1. estimate the variance of the pooled rate ``p = H / N`` with the ratio-estimator (linearised,
   "ultimate cluster") variance over items, ``k/(k-1) * sum_i (h_i - p m_i)^2 / N^2``;
2. turn it into an effective sample size ``n_eff = p (1 - p) / var`` (``N / deff``), kept between
   the item count ``k`` (every item's turns perfectly alike: the largest design effect of equal
   items) and the turn count ``N`` (independent turns). With no hit, or all hits, the design
   effect cannot be estimated from the data and ``n_eff = k``, the cautious end. With hits in
   only one to three items (``J``) the estimate rests on those few items: one hit item with one
   hit looks like independent turns even where the truth is strongly clustered (a few items
   that draw follow-ups, most that never do), so ``n_eff`` is pulled toward ``k`` as
   ``n_eff * J / 4``;
3. take the Wilson score interval at ``p`` and ``n_eff``, with the lower (upper) limit of one to three
   effective hits (misses) replaced by the one-sided Poisson limit, as in Brown, Cai and
   DasGupta's modified Wilson interval: the plain Wilson limit there sits too close to the
   estimate and under-covers just above zero. Where the design effect was estimated from the
   items (``n_eff < N``), the normal quantile is replaced by Student's t on ``k - 1`` degrees
   of freedom, since the variance comes from ``k`` item residuals (at 20 items, 2.09 for 1.96).

Everything is vectorised over leading axes, so the coverage simulations (tests/test_coverage.py,
benchmarks/coverage.py) run thousands of designs at once with the same code a report uses.
A Wilson interval has positive width for any finite ``n_eff``: ``0% [0-0]`` cannot happen.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
from scipy.special import gammaincinv
from scipy.stats import t as t_dist

FEW_ITEMS = 4  # below this many items holding the rare outcome, n_eff is pulled toward k


def z_value(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson(p: np.ndarray, n: np.ndarray, level: float = 0.95,
           df: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Modified Wilson score interval for a proportion ``p`` observed on ``n`` (possibly
    fractional, effective) trials; ``df`` (per entry, ``inf`` for none): the degrees of freedom
    of an estimated variance, for a t quantile in place of the normal one."""
    p, n = np.asarray(p, dtype=float), np.asarray(n, dtype=float)
    z: float | np.ndarray = z_value(level)
    if df is not None:
        df = np.asarray(df, dtype=float)
        with np.errstate(invalid="ignore"):
            z = np.where(np.isfinite(df) & (df >= 1), t_dist.ppf(0.5 + level / 2,
                                                                 np.maximum(df, 1)), z)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)
    hits, misses = p * n, (1 - p) * n
    # Poisson limits (a gamma quantile) for small counts, one-sided at 1 - level as Brown, Cai and
    # DasGupta advise: the two-sided tail would over-cover (above 99% at 20 items and 1-2%).
    tail = 1 - level
    with np.errstate(invalid="ignore", divide="ignore"):
        poisson_low = gammaincinv(np.maximum(hits, 1e-12), tail) / n
        poisson_high = 1 - gammaincinv(np.maximum(misses, 1e-12), tail) / n
    small = 3.0  # x* = 3 at every n: with 2 (their n <= 50 choice) exact coverage dips to 0.92
    # Only on the rare side: a Poisson count is a model of few hits among many misses.
    low = np.where((hits > 0) & (hits <= small) & (hits < misses),
                   np.minimum(low, poisson_low), low)
    high = np.where((misses > 0) & (misses <= small) & (misses < hits),
                    np.maximum(high, poisson_high), high)
    # Exactly 0 (1) with no hit (miss): the formula leaves a rounding residue there.
    return np.where(hits <= 0, 0.0, low), np.where(misses <= 0, 1.0, high)


def effective_n(hits: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Design-effect-adjusted sample size of the pooled rate of clusters (last axis: items),
    between the item count and the turn count. Items with no turn (size 0) do not count."""
    hits, sizes = np.asarray(hits, dtype=float), np.asarray(sizes, dtype=float)
    items = (sizes > 0).sum(axis=-1).astype(float)
    total = sizes.sum(axis=-1)
    p = hits.sum(axis=-1) / total
    residual = hits - p[..., None] * sizes
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = items / (items - 1) * (residual * residual).sum(axis=-1) / total ** 2
        n_eff = p * (1 - p) / variance
    n_eff = np.where((p <= 0) | (p >= 1) | ~np.isfinite(n_eff), items, n_eff)
    # Items holding the rare outcome: with 1-3 of them the spread between items is unseen.
    rare_items = np.where(p <= 0.5, (hits > 0).sum(axis=-1), ((sizes - hits) > 0).sum(axis=-1))
    n_eff = np.where((rare_items > 0) & (rare_items < FEW_ITEMS),
                     n_eff * rare_items / FEW_ITEMS, n_eff)
    return np.clip(n_eff, items, total)


def clustered_interval(hits: np.ndarray, sizes: np.ndarray,
                       level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Interval of the pooled rate ``sum(hits) / sum(sizes)`` over the last axis (items)."""
    hits, sizes = np.asarray(hits, dtype=float), np.asarray(sizes, dtype=float)
    total = sizes.sum(axis=-1)
    p = hits.sum(axis=-1) / total
    n_eff = effective_n(hits, sizes)
    items = (sizes > 0).sum(axis=-1)
    # t on k - 1 where the item residuals set the variance; the normal quantile where they did not
    # (independent turns, or no hit or no miss: n_eff = k is then assumed, not estimated).
    df = np.where((p > 0) & (p < 1) & (n_eff < total - 1e-9), items - 1.0, np.inf)
    return wilson(p, n_eff, level, df)


def paired_interval(hits_a: np.ndarray, sizes_a: np.ndarray, hits_b: np.ndarray,
                    sizes_b: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Interval of ``p_b - p_a`` on the same items (last axis), by the method of variance
    estimates recovery (MOVER, Newcombe's hybrid score interval for paired proportions): the
    clustered Wilson limits of each side, combined with the correlation of the two sides' item
    residuals. With one sample per item and side this is Newcombe's interval for the McNemar
    design; the between-item variance shared by both sides cancels through the correlation."""
    arrays = [np.asarray(x, dtype=float) for x in (hits_a, sizes_a, hits_b, sizes_b)]
    hits_a, sizes_a, hits_b, sizes_b = arrays
    p_a = hits_a.sum(axis=-1) / sizes_a.sum(axis=-1)
    p_b = hits_b.sum(axis=-1) / sizes_b.sum(axis=-1)
    low_a, high_a = clustered_interval(hits_a, sizes_a, level)
    low_b, high_b = clustered_interval(hits_b, sizes_b, level)
    res_a = hits_a - p_a[..., None] * sizes_a
    res_b = hits_b - p_b[..., None] * sizes_b
    norm = np.sqrt((res_a * res_a).sum(axis=-1) * (res_b * res_b).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(norm > 0, (res_a * res_b).sum(axis=-1) / norm, 0.0)
    delta = p_b - p_a
    down_b, up_a = p_b - low_b, high_a - p_a
    up_b, down_a = high_b - p_b, p_a - low_a
    low = delta - np.sqrt(np.maximum(down_b ** 2 + up_a ** 2 - 2 * r * down_b * up_a, 0))
    high = delta + np.sqrt(np.maximum(up_b ** 2 + down_a ** 2 - 2 * r * up_b * down_a, 0))
    return np.clip(low, -1, 1), np.clip(high, -1, 1)
