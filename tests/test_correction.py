"""Corrected rates: PPI++ against the ppi-python package, its coverage with a labeller of known
sensitivity and specificity (clustered by item, with and without a stratified calibration
sample), and Rogan-Gladen by hand."""

from __future__ import annotations

import numpy as np
import pytest

from userturn.stats.correction import Observation, corrected_rate, ppi_arrays, rogan_gladen

TRUE_RATE, SENSITIVITY, SPECIFICITY = 0.15, 0.6, 0.95


def _labeller(rng, truth):
    """A labeller that finds 60% of the follow-ups and wrongly flags 5% of the rest."""
    u = rng.random(truth.shape)
    return np.where(truth == 1, u < SENSITIVITY, u > SPECIFICITY).astype(float)


def test_point_estimate_and_interval_match_ppi_python():
    ppi_py = pytest.importorskip("ppi_py")
    rng = np.random.default_rng(3)
    truth = (rng.random(3000) < TRUE_RATE).astype(float)
    predicted = _labeller(rng, truth)
    labelled = rng.choice(3000, size=200, replace=False)
    observations = [Observation(i, bool(predicted[i])) for i in range(3000)]
    for i in labelled:
        observations[i] = Observation(i, bool(predicted[i]), bool(truth[i]), 200 / 3000)
    ours = corrected_rate(observations)
    # The package treats the unlabelled predictions as a separate sample; here every turn's
    # prediction is "unlabelled" data, as in our estimator's first term.
    args = (truth[labelled], predicted[labelled], predicted)
    # Power-tuned: both pick a lambda in [0, 1] and give intervals of about the same width.
    tuned_low, tuned_high = (float(np.ravel(x)[0]) for x in ppi_py.ppi_mean_ci(*args, alpha=0.05))
    assert 0 < ours.lam <= 1 and ours.low < ours.value < ours.high
    assert ours.high - ours.low == pytest.approx(tuned_high - tuned_low, rel=0.1)
    for lam in (0.0, 0.5, 1.0):
        fixed = ppi_arrays(np.array([predicted]).T, np.array([truth]).T,
                           np.where(np.isin(np.arange(3000), labelled), 3000 / 200, 0.0)[:, None],
                           lam=lam)
        expected = ppi_py.ppi_mean_pointestimate(*args, lam=lam)
        assert float(fixed[0]) == pytest.approx(float(np.ravel(expected)[0]), rel=1e-9)
        low, high = (float(np.ravel(x)[0]) for x in ppi_py.ppi_mean_ci(*args, alpha=0.05, lam=lam))
        # Same variance up to the finite-population and Wilson details: widths within 10%.
        assert float(fixed[2] - fixed[1]) == pytest.approx(high - low, rel=0.1)


def _simulate(rng, *, runs, items, samples, labels, stratified):
    """Runs of ``items`` x ``samples`` turns with between-item spread; ``labels`` human labels
    drawn at random, or stratified by the prediction (half the labels on predicted follow-ups)."""
    spread = 1 / 0.1 - 1  # intra-item correlation 0.1
    item_rates = rng.beta(TRUE_RATE * spread, (1 - TRUE_RATE) * spread, size=(runs, items, 1))
    truth = (rng.random((runs, items, samples)) < item_rates).astype(float)
    predicted = _labeller(rng, truth)
    n = items * samples
    weight = np.zeros((runs, n))
    for run in range(runs):
        flat = predicted[run].ravel()
        if stratified:
            for value, take in ((1.0, labels // 2), (0.0, labels - labels // 2)):
                pool = np.flatnonzero(flat == value)
                take = min(take, pool.size)
                weight[run, rng.choice(pool, size=take, replace=False)] = pool.size / take
        else:
            weight[run, rng.choice(n, size=labels, replace=False)] = n / labels
    return predicted, truth, weight.reshape(runs, items, samples)


@pytest.mark.parametrize("labels,stratified", [(100, False), (300, False), (150, True)])
def test_corrected_interval_covers_the_true_rate(labels, stratified):
    rng = np.random.default_rng(labels + stratified)
    predicted, truth, weight = _simulate(rng, runs=1000, items=500, samples=4, labels=labels,
                                         stratified=stratified)
    value, low, high, _ = ppi_arrays(predicted, truth, weight)
    coverage = ((low <= TRUE_RATE) & (TRUE_RATE <= high)).mean()
    assert 0.93 <= coverage <= 0.975
    # The labeller's own rate is biased (0.6 * 0.15 + 0.05 * 0.85 = 0.1325) and its interval
    # misses the truth most of the time: the correction is what makes the rate right.
    raw = predicted.mean(axis=(1, 2))
    assert abs(raw.mean() - 0.1325) < 0.005
    # Narrower than the interval from the human labels alone (lambda = 0).
    _, human_low, human_high, _ = ppi_arrays(predicted, truth, weight, lam=0.0)
    assert np.median(high - low) < np.median(human_high - human_low)
    assert abs(value.mean() - TRUE_RATE) < 0.005


def test_too_few_human_labels_say_why():
    observations = [Observation(i, False, True if i < 12 else None, 0.1) for i in range(100)]
    assert corrected_rate(observations) == "12 human label(s), fewer than 30"


def test_rogan_gladen_by_hand():
    # Labelled: 10 follow-ups (6 found), 40 others (2 flagged); sens 0.6, spec 0.95.
    observations = ([Observation(i, i < 6, True) for i in range(10)]
                    + [Observation(10 + i, i < 2, False) for i in range(40)])
    result = rogan_gladen(0.1325, 0.0001, observations)
    assert (result.sensitivity, result.specificity) == pytest.approx((0.6, 0.95))
    assert result.value == pytest.approx((0.1325 + 0.95 - 1) / 0.55)
    assert result.low < result.value < result.high
    chance = [Observation(0, True, True), Observation(1, True, False)]
    assert "no better than chance" in rogan_gladen(0.5, 0.01, chance)


def test_corrected_paired_difference_covers():
    """Perturbed vs original on the same 200 items x 2 turns; the item's propensity is shared by
    both sides (paired) and 100 turns of each side are labelled by a person."""
    from userturn.stats.correction import corrected_difference

    rng = np.random.default_rng(5)
    true_delta, covered, runs = 0.10, 0, 300
    for _ in range(runs):
        base = rng.beta(1.5, 8.5, size=200)  # mean 0.15, items differ
        sides = []
        for shift in (0.0, true_delta):
            truth = (rng.random((200, 2)) < (base + shift)[:, None]).astype(float)
            predicted = _labeller(rng, truth)
            labelled = set(rng.choice(400, size=100, replace=False).tolist())
            sides.append([Observation(i // 2, bool(predicted.flat[i]),
                                      bool(truth.flat[i]) if i in labelled else None, 0.25)
                          for i in range(400)])
        d = corrected_difference(*sides)
        covered += d.low <= true_delta <= d.high
    assert 0.92 <= covered / runs <= 0.98


def test_corrected_difference_needs_labels_on_both_sides():
    from userturn.stats.correction import corrected_difference

    a = [Observation(i, False, False, 0.5) for i in range(40)]
    b = [Observation(i, False, None) for i in range(40)]
    assert corrected_difference(a, b) == "B: 0 human label(s), fewer than 30"
