"""Coverage of the rate and paired-difference intervals over a grid of simulated designs: the
same functions the summary, report and compare use, vectorised over simulated runs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from designs import clustered_hits, paired_hits

from userturn.stats.intervals import clustered_interval, paired_interval

ITEMS, SAMPLES = (20, 50, 100, 200), (1, 2, 4, 8)
RATES, SPREADS = (0.01, 0.02, 0.05, 0.15, 0.5), (0.0, 0.05, 0.2)
RUNS = 800  # per design: a coverage of 0.95 is estimated to +-0.015 (2 standard errors)


def _exact_one_turn_coverage(items: int, rate: float) -> tuple[float, float]:
    """One turn per item: the hit count is binomial, so coverage is a sum over its values, with
    no simulation error (the spread between items does not change this design's data)."""
    from scipy.stats import binom

    counts = np.arange(items + 1)
    hits = (np.arange(items)[None, :] < counts[:, None]).astype(float)  # count c: c items hit
    low, high = clustered_interval(hits, np.ones_like(hits))
    weight = binom.pmf(counts, items, rate)
    return (float((weight * ((low <= rate) & (rate <= high))).sum()),
            float((weight * (high - low <= 0)).sum()))


def _rate_coverage() -> dict[tuple[int, int, float, float], tuple[float, float]]:
    rng = np.random.default_rng(2026)
    out = {}
    for items, samples, rate, icc in itertools.product(ITEMS, SAMPLES, RATES, SPREADS):
        if samples == 1:
            out[(items, samples, rate, icc)] = _exact_one_turn_coverage(items, rate)
            continue
        hits, sizes = clustered_hits(rng, items=items, samples=samples, rate=rate, icc=icc,
                                     runs=RUNS)
        low, high = clustered_interval(hits, sizes)
        out[(items, samples, rate, icc)] = (float(((low <= rate) & (rate <= high)).mean()),
                                            float((high - low <= 0).mean()))
    return out


@pytest.fixture(scope="module")
def rate_coverage():
    return _rate_coverage()


def test_rate_intervals_cover_across_the_grid(rate_coverage):
    coverage = {design: c for design, (c, _) in rate_coverage.items()}
    # Exact binomial coverage of this interval is at least 0.93 at one turn per item; the slack
    # is the simulation's own error.
    low = {d: c for d, c in coverage.items() if c < 0.915}
    assert not low, f"under-covering designs (items, samples, rate, spread): {low}"
    assert 0.94 <= np.mean(list(coverage.values())) <= 0.975
    # Above 0.97 only where few hits are expected: a count of 0-3 hits cannot be split finer.
    high = {d: c for d, c in coverage.items() if c > 0.98 and d[0] * d[1] * d[2] >= 10}
    assert not high, f"over-covering designs with 10+ expected hits: {high}"


def test_no_interval_is_zero_width(rate_coverage):
    assert all(zero == 0 for _, zero in rate_coverage.values())


def test_paired_differences_cover():
    rng = np.random.default_rng(2027)
    coverage = {}
    for items, samples, rate, icc in itertools.product((20, 50, 200), (1, 4), (0.02, 0.15),
                                                       SPREADS):
        hits_a, hits_b, delta = paired_hits(rng, items=items, samples=samples, rate=rate,
                                            icc=icc, odds_ratio=2.0, runs=RUNS)
        sizes = np.full_like(hits_a, samples)
        low, high = paired_interval(hits_a, sizes, hits_b, sizes)
        assert (high - low > 0).all()
        coverage[(items, samples, rate, icc)] = float(((low <= delta) & (delta <= high)).mean())
    low = {d: c for d, c in coverage.items() if c < 0.92}
    assert not low, f"under-covering paired designs: {low}"
