"""Simulated run designs for the coverage checks (tests/test_coverage.py, benchmarks/coverage.py).

A design is ``items`` items with ``samples`` sampled turns each and a true follow-up rate; items
differ (between-item spread): an item's own rate is drawn from a Beta distribution with that mean
and intra-item correlation ``icc`` (0: every item alike, binomial turns). Paired designs shift
every item's log-odds by the same amount on the second side, so the two sides share each item's
difficulty, as perturbed vs original contexts do.
"""

from __future__ import annotations

import numpy as np


def item_rates(rng: np.random.Generator, rate: float, icc: float, shape: tuple[int, ...]):
    if icc <= 0:
        return np.full(shape, rate)
    spread = 1 / icc - 1
    return rng.beta(rate * spread, (1 - rate) * spread, size=shape)


def clustered_hits(rng: np.random.Generator, *, items: int, samples: int, rate: float,
                   icc: float, runs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(hits, sizes)``, each ``(runs, items)``: one simulated run per row."""
    rates = item_rates(rng, rate, icc, (runs, items))
    return rng.binomial(samples, rates).astype(float), np.full((runs, items), float(samples))


def paired_hits(rng: np.random.Generator, *, items: int, samples: int, rate: float, icc: float,
                odds_ratio: float, runs: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(hits_a, hits_b, true_delta)`` of a paired design: side b's item rates are side a's
    with the odds multiplied by ``odds_ratio``."""
    rates_a = item_rates(rng, rate, icc, (runs, items))
    odds = rates_a / (1 - rates_a) * odds_ratio
    rates_b = odds / (1 + odds)
    # The true difference is the mean over the item distribution, not over this draw.
    population = item_rates(np.random.default_rng(12345), rate, icc, (400_000,))
    pop_odds = population / (1 - population) * odds_ratio
    true_delta = float((pop_odds / (1 + pop_odds)).mean() - population.mean())
    return (rng.binomial(samples, rates_a).astype(float),
            rng.binomial(samples, rates_b).astype(float), true_delta)
