"""Follow-up rates corrected for the labeller's errors with a human-labelled calibration sample.

A rate measured by a labeller (the rules, a classifier, a judge: any non-human source) inherits
its errors: one that misses a third of the follow-ups reports a third less. With human labels on
a sample of the same turns, prediction-powered inference (PPI; Angelopoulos et al. 2023, and its
power-tuned form PPI++, 2024) estimates the rate from the labeller's predictions on every turn
plus the human-labelled sample's measure of their error:

    theta = lambda * mean_all(f) + (1/N) * sum_{labelled j} w_j * (y_j - lambda * f_j)

``f``: the labeller says follow-up (0/1), ``y``: the human does, ``w_j = 1 / pi_j`` the inverse
inclusion probability of turn ``j`` in the calibration sample (``userturn annotate --calibration``
oversamples the rare predicted follow-ups and stores ``pi``), ``N`` the turns of the rate. The
estimate is unbiased for any ``lambda``: ``lambda = 0`` is the human-only (Horvitz-Thompson)
estimate, ``lambda = 1`` plain PPI; PPI++ picks the ``lambda`` in [0, 1] that minimises the
estimated variance, so the result is never worse than either.

Clustered by item, as every rate here: theta is a sum of item totals
``T_i = lambda * sum_{j in i} f_j + sum_{labelled j in i} w_j (y_j - lambda f_j)`` over ``N``,
and its variance is the between-item ("ultimate cluster") variance of those totals,
``k/(k-1) * sum_i (T_i - theta m_i)^2 / N^2``. That variance counts both the items drawn and the
turns chosen for labelling (a with-replacement approximation: slightly conservative). The
interval is the Wilson interval of :mod:`.intervals` on ``n_eff = theta (1 - theta) / var``, at
most ``N``, so it has positive width and stays in [0, 1].

:func:`rogan_gladen` is the classical alternative: correct the raw rate with the labeller's
sensitivity and specificity measured on the labelled turns. It is simpler and needs no per-turn
pairing, but wastes information (it ignores which turns were labelled) and is unstable when
``sensitivity + specificity - 1`` is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from userturn.stats.intervals import wilson, z_value

MIN_HUMAN_LABELS = 30  # fewer: the correction is not shown (its variance estimate is unreliable)


@dataclass(frozen=True)
class Corrected:
    """A corrected rate: ``value`` in ``[low, high]``, from ``human_labels`` human-labelled turns
    of the rate's ``n`` turns. ``lam``: the power-tuning weight (0: human labels only)."""

    value: float
    low: float
    high: float
    human_labels: int
    n: int
    lam: float


@dataclass(frozen=True)
class Observation:
    """One turn of a rate: its item, the labeller's verdict, and (when labelled by a person) the
    human verdict with the turn's inclusion probability in the calibration sample."""

    item: Hashable
    predicted: bool
    human: bool | None = None
    inclusion: float = 1.0


def ppi_arrays(predicted: np.ndarray, human: np.ndarray, weight: np.ndarray,
               level: float = 0.95, lam: float | None = None) -> tuple[np.ndarray, ...]:
    """PPI++ on arrays ``(..., items, turns)``: ``predicted`` 0/1, ``human`` 0/1 (anything where
    unlabelled), ``weight`` = 1/pi for labelled turns and 0 elsewhere. Every item has the same
    number of turn slots; ``weight`` NaN marks an absent slot. Returns
    ``(value, low, high, lam)`` over the leading axes. Vectorised for the coverage simulations."""
    present = ~np.isnan(weight)
    w = np.where(present, weight, 0.0)
    f = np.where(present, predicted, 0.0)
    y = np.where(w > 0, human, 0.0)
    sizes = present.sum(axis=-1).astype(float)
    total = sizes.sum(axis=-1)
    items = (sizes > 0).sum(axis=-1).astype(float)
    # T_i(lam) = A_i + lam * B_i
    a = (w * y).sum(axis=-1)
    b = f.sum(axis=-1) - (w * f).sum(axis=-1)
    a_res = a - (a.sum(axis=-1) / total)[..., None] * sizes
    b_res = b - (b.sum(axis=-1) / total)[..., None] * sizes
    if lam is None:
        with np.errstate(invalid="ignore", divide="ignore"):
            tuned = -(a_res * b_res).sum(axis=-1) / (b_res * b_res).sum(axis=-1)
        lam_arr = np.clip(np.nan_to_num(tuned, nan=0.0), 0.0, 1.0)
    else:
        lam_arr = np.full(np.shape(total), float(lam))
    value = (a.sum(axis=-1) + lam_arr * b.sum(axis=-1)) / total
    residual = a_res + lam_arr[..., None] * b_res
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = items / (items - 1) * (residual * residual).sum(axis=-1) / total ** 2
    clipped = np.clip(value, 0.0, 1.0)
    labelled = (w > 0).sum(axis=(-2, -1)).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        n_eff = clipped * (1 - clipped) / variance
    n_eff = np.where((clipped <= 0) | (clipped >= 1) | ~np.isfinite(n_eff), labelled, n_eff)
    # The variance comes from the item residuals: t on k - 1, as for the raw rate's interval.
    low, high = wilson(clipped, np.clip(n_eff, 1.0, total), level, df=items - 1)
    return value, low, high, lam_arr


def corrected_rate(observations: Sequence[Observation], *, level: float = 0.95,
                   minimum: int = MIN_HUMAN_LABELS, lam: float | None = None) -> Corrected | str:
    """The PPI++ corrected rate of ``observations``, or why there is none (a short reason).
    ``lam`` fixes the weight of the labeller's verdicts (power-tuned when None); ``lam=0`` is the
    rate of the human labels alone (inverse-probability weighted), the reference the corrected
    rate should be narrower than."""
    labelled = sum(1 for o in observations if o.human is not None)
    if labelled < minimum:
        return f"{labelled} human label(s), fewer than {minimum}"
    if any(not 0 < o.inclusion <= 1 for o in observations if o.human is not None):
        raise ValueError("inclusion probabilities must be in (0, 1]")
    slots: dict[Hashable, list[Observation]] = {}
    for o in observations:
        slots.setdefault(o.item, []).append(o)
    width = max(len(v) for v in slots.values())
    shape = (len(slots), width)
    predicted, human = np.zeros(shape), np.zeros(shape)
    weight = np.full(shape, np.nan)
    for i, group in enumerate(slots.values()):
        for j, o in enumerate(group):
            predicted[i, j] = float(o.predicted)
            human[i, j] = float(bool(o.human))
            weight[i, j] = 1 / o.inclusion if o.human is not None else 0.0
    value, low, high, tuned = ppi_arrays(predicted, human, weight, level, lam)
    return Corrected(float(value), float(low), float(high), labelled, len(observations),
                     float(tuned))


@dataclass(frozen=True)
class RoganGladen:
    value: float
    low: float
    high: float
    sensitivity: float
    specificity: float


def rogan_gladen(raw: float, raw_variance: float, observations: Sequence[Observation], *,
                 level: float = 0.95) -> RoganGladen | str:
    """Rogan-Gladen: ``(raw + spec - 1) / (sens + spec - 1)``, with the labeller's sensitivity
    and specificity estimated on the human-labelled turns (weighted by 1/pi), and a delta-method
    (Wald) interval from the raw rate's variance and the binomial variances of ``sens`` and
    ``spec``. A reason string when the labelled turns hold no follow-up or no other label, or
    the labeller is no better than chance there."""
    pos = [(o.predicted, 1 / o.inclusion) for o in observations if o.human is True]
    neg = [(o.predicted, 1 / o.inclusion) for o in observations if o.human is False]
    if not pos or not neg:
        return "the human labels hold no follow-up, or nothing else"
    sens = sum(w for p, w in pos if p) / sum(w for _, w in pos)
    spec = sum(w for p, w in neg if not p) / sum(w for _, w in neg)
    youden = sens + spec - 1
    if youden <= 0:
        return f"the labeller is no better than chance (sensitivity + specificity = {youden + 1:.2f})"
    value = (raw + spec - 1) / youden
    # d/d raw = 1/J; d/d sens = -value/J; d/d spec = (1 - value)/J.
    variance = (raw_variance + value ** 2 * sens * (1 - sens) / len(pos)
                + (1 - value) ** 2 * spec * (1 - spec) / len(neg)) / youden ** 2
    half = z_value(level) * math.sqrt(variance)
    return RoganGladen(value, max(0.0, value - half), min(1.0, value + half), sens, spec)


@dataclass(frozen=True)
class CorrectedDifference:
    """``b.value - a.value`` of two corrected rates on the same items, with a paired interval."""

    a: Corrected
    b: Corrected
    delta: float
    low: float
    high: float


def _item_totals(observations: Sequence[Observation], items: Sequence[Hashable]
                 ) -> tuple[Corrected, np.ndarray]:
    """One side's corrected rate on ``items`` and its item residuals ``T_i - theta m_i``."""
    index = {item: i for i, item in enumerate(items)}
    kept = [o for o in observations if o.item in index]
    corrected = corrected_rate(kept, minimum=0)
    assert isinstance(corrected, Corrected)
    totals, sizes = np.zeros(len(items)), np.zeros(len(items))
    for o in kept:
        i = index[o.item]
        weight = 1 / o.inclusion if o.human is not None else 0.0
        totals[i] += corrected.lam * o.predicted + weight * (float(bool(o.human))
                                                            - corrected.lam * o.predicted)
        sizes[i] += 1
    return corrected, totals - corrected.value * sizes


def corrected_difference(a: Sequence[Observation], b: Sequence[Observation], *,
                         level: float = 0.95,
                         minimum: int = MIN_HUMAN_LABELS) -> CorrectedDifference | str:
    """Corrected ``b - a`` on the items both sides share (perturbed vs original, trained vs
    base), each side power-tuned on its own; the interval is Wald on the paired linearised
    variance ``k/(k-1) sum_i (r_bi / N_b - r_ai / N_a)^2``, so the item effects shared by both
    sides cancel as in :func:`~userturn.stats.rates.paired_difference`. A reason when a side has fewer
    than ``minimum`` human labels on the shared items."""
    items = sorted({o.item for o in a} & {o.item for o in b}, key=str)
    shared = set(items)
    for name, side in (("A", a), ("B", b)):
        labelled = sum(1 for o in side if o.item in shared and o.human is not None)
        if labelled < minimum:
            return f"{name}: {labelled} human label(s), fewer than {minimum}"
    corrected_a, residual_a = _item_totals(a, items)
    corrected_b, residual_b = _item_totals(b, items)
    k = len(items)
    spread = residual_b / corrected_b.n - residual_a / corrected_a.n
    variance = k / (k - 1) * float((spread * spread).sum()) if k > 1 else math.inf
    delta = corrected_b.value - corrected_a.value
    half = z_value(level) * math.sqrt(variance)
    return CorrectedDifference(corrected_a, corrected_b, delta, max(-1.0, delta - half),
                               min(1.0, delta + half))
