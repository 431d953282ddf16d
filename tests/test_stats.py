"""The clustered bootstrap: hand-computed cases and coverage on simulated data."""

from __future__ import annotations

import numpy as np

from userturn.stats import clustered_rate


def test_pooled_rate_over_clusters_by_hand():
    pairs = [("a", True), ("a", True), ("a", False), ("b", False), ("c", True), ("c", False)]
    rate = clustered_rate(pairs)
    assert (rate.hits, rate.n) == (3, 6) and rate.value == 0.5
    # Cluster rates are 2/3, 0, 1/2: no resample can go below 0 or above 2/3... pooled max is
    # all-"a" = 2/3 and min is all-"b" = 0.
    assert 0.0 <= rate.low <= 0.5 <= rate.high <= 2 / 3


def test_degenerate_cases():
    empty = clustered_rate([])
    assert empty.n == 0 and np.isnan(empty.value)
    single = clustered_rate([("x", True), ("x", False)])
    assert (single.low, single.high) == (0.5, 0.5)
    all_hits = clustered_rate([(i, True) for i in range(10)])
    assert (all_hits.low, all_hits.high) == (1.0, 1.0)


def test_interval_is_wider_when_samples_are_clustered():
    # Same 40 observations: as 40 independent items, or as 4 items x 10 identical samples.
    independent = clustered_rate([(i, i % 2 == 0) for i in range(40)], seed=1)
    clustered = clustered_rate([(i // 10, (i // 10) % 2 == 0) for i in range(40)], seed=1)
    assert independent.value == clustered.value == 0.5
    assert clustered.high - clustered.low > 2 * (independent.high - independent.low)


def test_coverage_on_simulated_clustered_data():
    """Items have their own follow-up propensity (beta-distributed); 4 samples per item. The 95%
    interval must cover the true pooled rate in roughly 95% of simulated experiments."""
    rng = np.random.default_rng(2026)
    true_mean, runs, covered = 0.2, 300, 0
    for run in range(runs):
        propensities = rng.beta(1.0, 4.0, size=60)  # mean 0.2, strongly item-dependent
        pairs = [(item, bool(rng.random() < p)) for item, p in enumerate(propensities)
                 for _ in range(4)]
        rate = clustered_rate(pairs, resamples=800, seed=run)
        covered += rate.low <= true_mean <= rate.high
    assert 0.89 <= covered / runs <= 0.99
