"""The clustered bootstrap and the paired statistics: hand-computed cases, properties, and
coverage on simulated data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from userturn.stats import (
    Correlation,
    Difference,
    McNemar,
    Rate,
    clustered_rate,
    joint_table,
    mcnemar_exact,
    paired_difference,
    rank_correlation,
)


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


# ------------------------------------------------------------------------------------------------
# Paired statistics
# ------------------------------------------------------------------------------------------------


def test_paired_difference_one_extra_hit_by_hand():
    # 12 items, one sample each; b is a with exactly one more hit (item 1: miss -> hit).
    a = [(i, i % 3 == 0) for i in range(12)]
    b = [(i, i % 3 == 0 or i == 1) for i in range(12)]
    diff = paired_difference(a, b)
    assert isinstance(diff, Difference)
    assert (diff.a.hits, diff.a.n, diff.b.hits, diff.b.n) == (4, 12, 5, 12)
    assert diff.delta == pytest.approx(1 / 12)
    assert (diff.items, diff.dropped_a, diff.dropped_b) == (12, 0, 0)
    # Every resample's difference is (times item 1 was drawn) / 12 >= 0.
    assert 0.0 == diff.low <= diff.delta <= diff.high
    # Swapping the sides negates the difference.
    assert paired_difference(b, a).delta == pytest.approx(-1 / 12)


def test_paired_difference_pools_unequal_samples_per_side():
    # a: 2 samples per item, b: 3 samples per item; pooled rates are hits over samples.
    a = [("x", True), ("x", False), ("y", False), ("y", False)]
    b = [("x", True), ("x", True), ("x", False), ("y", True), ("y", False), ("y", False)]
    diff = paired_difference(a, b, seed=3)
    assert diff.a.value == 1 / 4 and diff.b.value == 3 / 6
    assert diff.delta == pytest.approx(0.25)
    # Only two items: resample differences are all-x (2/3 - 1/2), mixed (1/2 - 1/4), all-y (1/3).
    assert 1 / 6 - 1e-12 <= diff.low <= diff.delta <= diff.high <= 1 / 3 + 1e-12


def test_paired_difference_drops_and_counts_one_sided_items():
    a = [("shared1", True), ("shared1", False), ("shared2", False), ("only_a", True),
         ("only_a", True), ("only_a2", True)]
    b = [("shared2", True), ("shared1", True), ("only_b", False)]
    diff = paired_difference(a, b)
    assert (diff.items, diff.dropped_a, diff.dropped_b) == (2, 2, 1)
    assert (diff.a.hits, diff.a.n) == (1, 3)  # the only_a hits are not counted
    assert (diff.b.hits, diff.b.n) == (2, 2)
    assert diff.delta == pytest.approx(1 - 1 / 3)


def test_paired_difference_degenerate_cases():
    none = paired_difference([("a", True)], [("b", True)])
    assert none.items == 0 and (none.dropped_a, none.dropped_b) == (1, 1)
    assert all(math.isnan(v) for v in (none.delta, none.low, none.high, none.a.value))
    one = paired_difference([("x", True), ("x", False)], [("x", True)])
    assert one.items == 1 and one.delta == one.low == one.high == 0.5
    with pytest.raises(ValueError):
        paired_difference([("x", True)], [("x", True)], level=1.5)


def test_paired_marginals_match_clustered_rate_on_shared_items():
    rng = np.random.default_rng(7)
    a = [(i, bool(rng.random() < 0.3)) for i in range(30) for _ in range(3)]
    b = [(i, bool(rng.random() < 0.4)) for i in range(30) for _ in range(2)]
    diff = paired_difference(a + [(99, True)], b, seed=5, resamples=500)
    assert diff.a == clustered_rate(a, seed=5, resamples=500)
    assert diff.b == clustered_rate(b, seed=5, resamples=500)


def _unpaired_interval(a, b, *, resamples=2000, seed=0, level=0.95):
    """Independent clustered bootstraps of the two sides (what pairing avoids)."""
    def per_item(pairs):
        out: dict = {}
        for item, hit in pairs:
            out.setdefault(item, [0, 0])
            out[item][0] += int(hit)
            out[item][1] += 1
        return np.array(list(out.values()), dtype=float).T

    rng = np.random.default_rng(seed)
    rates = []
    for hits, sizes in (per_item(a), per_item(b)):
        draws = rng.integers(0, len(hits), size=(resamples, len(hits)))
        rates.append(hits[draws].sum(axis=1) / sizes[draws].sum(axis=1))
    tail = (1 - level) / 2
    return np.quantile(rates[1] - rates[0], [tail, 1 - tail])


def test_paired_interval_is_narrower_when_sides_are_correlated_per_item():
    # Propensities near 0 or 1 (item difficulty dominates); b reuses a's uniforms with a small
    # shift, so the two sides agree on almost every sample of every item.
    rng = np.random.default_rng(11)
    propensities = rng.beta(0.3, 0.3, size=50)
    a, b = [], []
    for item, p in enumerate(propensities):
        for u in rng.random(6):
            a.append((item, bool(u < p)))
            b.append((item, bool(u < min(p + 0.08, 1.0))))
    paired = paired_difference(a, b, seed=2)
    low, high = _unpaired_interval(a, b, seed=2)
    assert paired.low <= paired.delta <= paired.high
    assert paired.high - paired.low < 0.5 * (high - low)


def test_paired_difference_coverage_on_simulated_data():
    """Item propensities shared by both sides plus a true per-item shift (mean 0.15); a has 4 and
    b 3 samples per item. The 95% interval covers the true difference ~95% of the time."""
    rng = np.random.default_rng(2027)
    true_delta, runs, covered = 0.15, 250, 0
    for run in range(runs):
        base = 0.7 * rng.beta(1.0, 3.0, size=60)  # in [0, 0.7], strongly item-dependent
        shifted = base + rng.uniform(0.0, 0.3, size=60)  # in [0, 1], mean shift 0.15
        a = [(item, bool(rng.random() < p)) for item, p in enumerate(base) for _ in range(4)]
        b = [(item, bool(rng.random() < p)) for item, p in enumerate(shifted) for _ in range(3)]
        diff = paired_difference(a, b, resamples=800, seed=run)
        covered += diff.low <= true_delta <= diff.high
    assert 0.89 <= covered / runs <= 0.99


def _mcnemar_from_counts(b00, b01, b10, b11):
    cells = [(False, False)] * b00 + [(False, True)] * b01 + [(True, False)] * b10 \
        + [(True, True)] * b11
    return ({i: x for i, (x, _) in enumerate(cells)}, {i: y for i, (_, y) in enumerate(cells)})


def test_mcnemar_exact_by_hand():
    result = mcnemar_exact(*_mcnemar_from_counts(5, 1, 9, 7))
    assert isinstance(result, McNemar)
    assert (result.b00, result.b01, result.b10, result.b11) == (5, 1, 9, 7)
    assert (result.items, result.discordant) == (22, 10)
    # 2 * P(X <= 1), X ~ Binomial(10, 1/2) = 2 * 11 / 1024.
    assert result.p_value == pytest.approx(22 / 1024)  # = 0.021484375
    # Symmetric in the direction of the switch.
    swapped = mcnemar_exact(*_mcnemar_from_counts(5, 9, 1, 7))
    assert swapped.p_value == result.p_value and (swapped.b01, swapped.b10) == (9, 1)
    # 0 vs 5: 2 / 32.
    assert mcnemar_exact(*_mcnemar_from_counts(0, 0, 5, 0)).p_value == pytest.approx(0.0625)


def test_mcnemar_exact_balanced_and_no_discordant_pairs():
    assert mcnemar_exact(*_mcnemar_from_counts(3, 4, 4, 2)).p_value == 1.0
    assert mcnemar_exact(*_mcnemar_from_counts(3, 0, 0, 2)).p_value == 1.0
    assert mcnemar_exact({}, {}).p_value == 1.0
    # Large counts stay exact and finite (integer sums, no overflow).
    assert 0.0 < mcnemar_exact(*_mcnemar_from_counts(0, 400, 500, 0)).p_value < 0.01


def test_mcnemar_exact_counts_only_shared_items():
    a = {"x": True, "y": False, "z": True, "only_a": True}
    b = {"x": False, "y": True, "z": True, "only_b1": False, "only_b2": True}
    result = mcnemar_exact(a, b)
    assert (result.b00, result.b01, result.b10, result.b11) == (0, 1, 1, 1)
    assert (result.dropped_a, result.dropped_b) == (1, 2)


def test_mcnemar_exact_is_conservative_under_the_null():
    # Paired outcomes with shared item effects and P(01) == P(10): a valid test rejects at most
    # ~5% of the time at 0.05 (the exact test, less).
    rng = np.random.default_rng(99)
    cells = rng.choice(4, size=(2000, 40), p=[0.35, 0.15, 0.15, 0.35])
    p_values = []
    for row in cells:
        a = {i: bool(c & 2) for i, c in enumerate(row)}
        b = {i: bool(c & 1) for i, c in enumerate(row)}
        p_values.append(mcnemar_exact(a, b).p_value)
    p_values = np.array(p_values)
    assert np.mean(p_values <= 0.05) <= 0.06
    assert np.mean(p_values <= 0.10) <= 0.11
    assert np.mean(p_values <= 0.50) <= 0.51
    # ... and it still has power against a real shift.
    shifted = rng.choice(4, size=(200, 40), p=[0.35, 0.25, 0.05, 0.35])
    rejections = np.mean([
        mcnemar_exact({i: bool(c & 2) for i, c in enumerate(row)},
                      {i: bool(c & 1) for i, c in enumerate(row)}).p_value <= 0.05
        for row in shifted])
    assert rejections > 0.5


def _spearman_by_brute_force(x, y):
    def ranks(v):
        return [(sum(w < a for w in v) + 1 + sum(w <= a for w in v)) / 2 for a in v]
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def test_rank_correlation_by_hand():
    # No ties: 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 4 / 120 = 0.8.
    result = rank_correlation([1, 2, 3, 4, 5], [2, 1, 4, 3, 5])
    assert isinstance(result, Correlation)
    assert result.rho == pytest.approx(0.8) and result.n == 5
    # Ties (average ranks): x ranks 1, 2.5, 2.5, 4, 5; y ranks 2, 1, 3.5, 3.5, 5;
    # deviations from 3: (-2, -.5, -.5, 1, 2) and (-1, -2, .5, .5, 2) -> 7.25 / 9.5 = 29/38.
    tied = rank_correlation([0.1, 0.2, 0.2, 0.3, 0.4], [20, 10, 30, 30, 50])
    assert tied.rho == pytest.approx(29 / 38)
    assert -1.0 <= tied.low <= tied.high <= 1.0
    # Monotone transforms don't matter; reversing one side negates rho.
    assert rank_correlation([1, 4, 9, 16, 25], [-2, -1, -4, -3, -5]).rho == pytest.approx(-0.8)


def test_rank_correlation_matches_brute_force_with_many_ties():
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 4, size=25), rng.integers(0, 3, size=25)
    assert rank_correlation(x, y).rho == pytest.approx(_spearman_by_brute_force(x, y))


def test_rank_correlation_interval_reflects_strength():
    rng = np.random.default_rng(5)
    x = rng.normal(size=40)
    strong = rank_correlation(x, x + 0.2 * rng.normal(size=40))
    assert 0.8 < strong.low <= strong.rho <= strong.high <= 1.0
    unrelated = rank_correlation(x, rng.normal(size=40))
    assert unrelated.low < 0 < unrelated.high


def test_rank_correlation_degenerate_cases_are_nan_not_errors():
    for x, y in [([], []), ([1.0], [2.0]), ([1, 2], [3, 4]),  # fewer than 3 points
                 ([1, 1, 1, 1], [1, 2, 3, 4]), ([1, 2, 3, 4], [5, 5, 5, 5])]:  # constant side
        result = rank_correlation(x, y)
        assert math.isnan(result.rho) and math.isnan(result.low) and math.isnan(result.high)
    # Non-finite pairs are left out and counted.
    result = rank_correlation([1, 2, float("nan"), 3, 4], [1, 2, 3, float("inf"), 5])
    assert (result.n, result.dropped) == (3, 2) and result.rho == pytest.approx(1.0)
    with pytest.raises(ValueError):
        rank_correlation([1, 2, 3], [1, 2])


def test_joint_table_by_hand():
    triples = [("r1", True, True), ("r1", True, False), ("r2", True, False), ("r2", True, False),
               ("w1", False, True), ("w1", False, True), ("w2", False, False)]
    table = joint_table(triples)
    assert isinstance(table["correct"], Rate) and isinstance(table["wrong"], Rate)
    assert (table["correct"].hits, table["correct"].n) == (1, 4)
    assert (table["wrong"].hits, table["wrong"].n) == (2, 3)
    assert (table["items_correct"], table["items_wrong"], table["items_mixed"]) == (2, 2, 0)
    assert table["counts"] == {"correct_hit": 1, "correct_miss": 3, "wrong_hit": 2,
                               "wrong_miss": 1}
    # Clustered by item: the interval of "correct" stays within the item rates 0 and 1/2.
    assert 0.0 <= table["correct"].low <= 0.25 <= table["correct"].high <= 0.5
    assert table["correct"] == clustered_rate([(i, h) for i, c, h in triples if c])


def test_joint_table_empty_stratum_and_mixed_items():
    table = joint_table([("x", True, True), ("x", False, False), ("y", True, False)])
    assert (table["items_correct"], table["items_wrong"], table["items_mixed"]) == (2, 1, 1)
    empty = joint_table([("x", True, True)])
    assert empty["wrong"].n == 0 and math.isnan(empty["wrong"].value)


def test_direction_and_single_sample_mcnemar():
    from userturn.stats import direction, paired_difference, single_sample_mcnemar

    up = paired_difference([(i, False) for i in range(10)], [(i, i < 8) for i in range(10)])
    assert direction(up) == "expected" and direction(up, "down") == "opposite"
    unclear = paired_difference([(i, i == 0) for i in range(10)], [(i, i == 1) for i in range(10)])
    assert direction(unclear) == "none"  # equal rates
    flat = paired_difference([(i, False) for i in range(4)], [(i, i == 0) for i in range(4)])
    assert direction(flat) == "expected_ns"
    greedy = single_sample_mcnemar([(i, False) for i in range(10)], [(i, i < 8) for i in range(10)])
    assert greedy is not None and (greedy.b01, greedy.b10) == (8, 0)
    assert single_sample_mcnemar([("a", True), ("a", False)], [("a", True)]) is None
