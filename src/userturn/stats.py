"""Rates with intervals that respect the design.

Several user turns sampled from the same item are not independent, so the interval of a rate comes
from a bootstrap over items (clustered): each resample draws items with replacement and keeps all
of an item's turns, and the rate is pooled (sum of hits over sum of turns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable

import numpy as np


@dataclass(frozen=True)
class Rate:
    hits: int
    n: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.hits / self.n if self.n else float("nan")


def clustered_rate(pairs: Iterable[tuple[Hashable, bool]], *, resamples: int = 2000,
                   seed: int = 0, level: float = 0.95) -> Rate:
    """Pooled rate of ``(cluster, hit)`` observations, with a percentile bootstrap interval
    over clusters. A single cluster, or none, gives the degenerate interval of its own rate."""
    per_cluster: dict[Hashable, list[int]] = {}
    for cluster, hit in pairs:
        counts = per_cluster.setdefault(cluster, [0, 0])
        counts[0] += int(hit)
        counts[1] += 1
    if not per_cluster:
        return Rate(0, 0, float("nan"), float("nan"))
    hits, sizes = np.array(list(per_cluster.values()), dtype=float).T
    total_hits, total = int(hits.sum()), int(sizes.sum())
    if len(hits) == 1:
        return Rate(total_hits, total, total_hits / total, total_hits / total)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(hits), size=(resamples, len(hits)))
    rates = hits[draws].sum(axis=1) / sizes[draws].sum(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(rates, [tail, 1 - tail])
    return Rate(total_hits, total, float(low), float(high))
