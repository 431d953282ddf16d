"""Clustered rates and the paired statistics: hand-computed cases and properties (coverage on
simulated designs is tests/test_coverage.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from userturn.stats.rates import (
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


def _wilson(p, n, z=1.959963984540054):
    """The plain Wilson score interval, written out from its formula."""
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_pooled_rate_over_clusters_by_hand():
    # Items of 3, 1 and 2 turns with 2, 0 and 1 hits: p = 3/6. Residuals h - p m = 0.5, -0.5, 0;
    # variance 3/2 * 0.5 / 36 = 1/48, n_eff = p(1-p) / var = 12, kept at the 6 turns there are.
    pairs = [("a", True), ("a", True), ("a", False), ("b", False), ("c", True), ("c", False)]
    rate = clustered_rate(pairs)
    assert (rate.hits, rate.n) == (3, 6) and rate.value == 0.5
    assert (rate.low, rate.high) == pytest.approx(_wilson(0.5, 6))


def test_clustered_items_shrink_the_effective_n_by_hand():
    # 10 items of 4 turns: 2 items all hits, 8 none. p = 0.2, residuals 3.2 (x2) and -0.8 (x8):
    # sum of squares 25.6, variance 10/9 * 25.6 / 1600 = 0.01778, n_eff = 0.16 / 0.01778 = 9,
    # below the 10 items, so n_eff = 10: the 40 turns count as the 10 items they are (2 effective
    # hits, so the lower limit is the Poisson one: 0.35536 / 10). The variance came from the 10
    # item residuals, so the upper limit takes Student's t on 9 degrees of freedom (2.262).
    pairs = [(i, i < 2) for i in range(10) for _ in range(4)]
    rate = clustered_rate(pairs)
    assert rate.value == 0.2
    t9 = 2.2621571627409915
    assert (rate.low, rate.high) == pytest.approx((0.035536, _wilson(0.2, 10, t9)[1]), rel=1e-4)


def test_hits_in_few_items_are_not_taken_for_independent_turns():
    # 100 items of 8 turns, one hit in one item: the residuals look like independent turns
    # (n_eff = 800), but one item cannot show how alike an item's turns are, so n_eff is pulled
    # toward the items: 800 * 1 / 4 = 200. At 2 and 3 hit items: 400 and 600; at 4, no pull.
    from userturn.stats.intervals import effective_n

    for hit_items, expected in ((1, 200), (2, 400), (3, 600), (4, 800)):
        hits = np.zeros(100)
        hits[:hit_items] = 1
        assert effective_n(hits, np.full(100, 8.0)) == pytest.approx(expected, rel=0.02)
    # The same on the other side: misses in one item of otherwise all-hit items.
    misses = np.full(100, 8.0)
    misses[0] = 7
    assert effective_n(misses, np.full(100, 8.0)) == pytest.approx(200, rel=0.02)


def test_no_hit_is_never_a_zero_width_interval():
    # Greedy, 20 items, no follow-up: the upper limit is Wilson's z^2 / (n + z^2), not 0.
    rate = clustered_rate([(i, False) for i in range(20)])
    z2 = 1.959963984540054 ** 2
    assert rate.low == 0.0 and rate.high == pytest.approx(z2 / (20 + z2))
    # With several samples an item's turns may be alike: the effective n falls back to the items.
    sampled = clustered_rate([(i, False) for i in range(20) for _ in range(4)])
    assert sampled.high == pytest.approx(z2 / (20 + z2))
    everything = clustered_rate([(i, True) for i in range(10)])
    assert everything.high == 1.0 and everything.low == pytest.approx(10 / (10 + z2))


def test_one_or_two_hits_get_the_poisson_lower_limit():
    # 2 hits in 50 turns: Wilson's lower limit (0.0110) would exclude a true 1%; the Poisson
    # limit (gamma quantile of shape 2 at 5%, 0.3554 / 50 = 0.0071) keeps it.
    rate = clustered_rate([(i, i < 2) for i in range(50)])
    assert rate.low == pytest.approx(0.35536 / 50, rel=1e-4)
    assert rate.high == pytest.approx(_wilson(0.04, 50)[1])


def test_degenerate_cases():
    empty = clustered_rate([])
    assert empty.n == 0 and np.isnan(empty.value)
    single = clustered_rate([("x", True), ("x", False)])
    assert single.low < 0.5 < single.high
    with pytest.raises(ValueError):
        clustered_rate([("x", True)], level=1.0)


def test_interval_is_wider_when_samples_are_clustered():
    # Same 40 observations: as 40 independent items, or as 4 items x 10 identical samples.
    independent = clustered_rate([(i, i % 2 == 0) for i in range(40)])
    clustered = clustered_rate([(i // 10, (i // 10) % 2 == 0) for i in range(40)])
    assert independent.value == clustered.value == 0.5
    assert clustered.high - clustered.low > 2 * (independent.high - independent.low)


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
    # Newcombe's hybrid score interval: Wilson limits of each side and the phi correlation of the
    # two sides (here the item residuals' correlation), by hand.
    la, ua = _wilson(4 / 12, 12)
    lb, ub = _wilson(5 / 12, 12)
    ra = [(1 if i % 3 == 0 else 0) - 4 / 12 for i in range(12)]
    rb = [(1 if i % 3 == 0 or i == 1 else 0) - 5 / 12 for i in range(12)]
    phi = sum(x * y for x, y in zip(ra, rb)) / math.sqrt(sum(x * x for x in ra)
                                                         * sum(y * y for y in rb))
    low = 1 / 12 - math.sqrt((5 / 12 - lb) ** 2 + (ua - 4 / 12) ** 2
                             - 2 * phi * (5 / 12 - lb) * (ua - 4 / 12))
    high = 1 / 12 + math.sqrt((ub - 5 / 12) ** 2 + (4 / 12 - la) ** 2
                              - 2 * phi * (ub - 5 / 12) * (4 / 12 - la))
    assert (diff.low, diff.high) == pytest.approx((low, high))
    assert diff.low < 0 < diff.high  # one changed item of twelve is no evidence
    # Swapping the sides negates the difference and mirrors the interval.
    swapped = paired_difference(b, a)
    assert swapped.delta == pytest.approx(-1 / 12)
    assert (swapped.low, swapped.high) == pytest.approx((-diff.high, -diff.low))


def test_paired_difference_pools_unequal_samples_per_side():
    # a: 2 samples per item, b: 3 samples per item; pooled rates are hits over samples.
    a = [("x", True), ("x", False), ("y", False), ("y", False)]
    b = [("x", True), ("x", True), ("x", False), ("y", True), ("y", False), ("y", False)]
    diff = paired_difference(a, b)
    assert diff.a.value == 1 / 4 and diff.b.value == 3 / 6
    assert diff.delta == pytest.approx(0.25)
    assert diff.low < diff.delta < diff.high


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
    # No hit on either side (greedy, a rate near zero): a finite sample, so not [0, 0].
    flat = paired_difference([(i, False) for i in range(20)], [(i, False) for i in range(20)])
    assert flat.delta == 0 and flat.low < 0 < flat.high
    with pytest.raises(ValueError):
        paired_difference([("x", True)], [("x", True)], level=1.5)


def test_paired_marginals_match_clustered_rate_on_shared_items():
    rng = np.random.default_rng(7)
    a = [(i, bool(rng.random() < 0.3)) for i in range(30) for _ in range(3)]
    b = [(i, bool(rng.random() < 0.4)) for i in range(30) for _ in range(2)]
    diff = paired_difference(a + [(99, True)], b)
    assert diff.a == clustered_rate(a)
    assert diff.b == clustered_rate(b)


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
    paired = paired_difference(a, b)
    ra, rb = clustered_rate(a), clustered_rate(b)
    # Two independent intervals combined in quadrature: what pairing avoids.
    unpaired = math.hypot(ra.high - ra.value, rb.value - rb.low) + math.hypot(
        ra.value - ra.low, rb.high - rb.value)
    assert paired.low <= paired.delta <= paired.high
    assert paired.high - paired.low < 0.5 * unpaired


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
    assert isinstance(table.correct, Rate) and isinstance(table.wrong, Rate)
    assert (table.correct.hits, table.correct.n) == (1, 4)
    assert (table.wrong.hits, table.wrong.n) == (2, 3)
    assert (table.items_correct, table.items_wrong, table.items_mixed) == (2, 2, 0)
    assert (table.correct_hit, table.correct_miss, table.wrong_hit, table.wrong_miss) == (
        1, 3, 2, 1)
    assert table.correct.low < 0.25 < table.correct.high
    assert table.correct == clustered_rate([(i, h) for i, c, h in triples if c])


def test_joint_table_empty_stratum_and_mixed_items():
    table = joint_table([("x", True, True), ("x", False, False), ("y", True, False)])
    assert (table.items_correct, table.items_wrong, table.items_mixed) == (2, 1, 1)
    empty = joint_table([("x", True, True)])
    assert empty.wrong.n == 0 and math.isnan(empty.wrong.value)


def test_direction_and_single_sample_mcnemar():
    from userturn.stats.rates import direction, paired_difference, single_sample_mcnemar

    up = paired_difference([(i, False) for i in range(10)], [(i, i < 8) for i in range(10)])
    assert direction(up) == "expected" and direction(up, "down") == "opposite"
    unclear = paired_difference([(i, i == 0) for i in range(10)], [(i, i == 1) for i in range(10)])
    assert direction(unclear) == "none"  # equal rates
    flat = paired_difference([(i, False) for i in range(4)], [(i, i == 0) for i in range(4)])
    assert direction(flat) == "expected_ns"
    greedy = single_sample_mcnemar([(i, False) for i in range(10)], [(i, i < 8) for i in range(10)])
    assert greedy is not None and (greedy.b01, greedy.b10) == (8, 0)
    assert single_sample_mcnemar([("a", True), ("a", False)], [("a", True)]) is None
