"""Agreement statistics beside kappa: hand-computed values, and the libraries (scikit-learn's
kappa, the krippendorff package) on random data; the labeller-vs-people view."""

from __future__ import annotations

import numpy as np
import pytest

from userturn.records import LABELS
from userturn.stats.agreement import Agreement, cohen_kappa
from userturn.stats.reliability import (
    against_people,
    alpha,
    constant_baseline,
    gwet_ac1,
    pabak,
    per_label,
)

BINARY = ("follow_up", "generic")
# 10 turns: both say follow-up once, they split twice, both say generic 7 times.
PAIRS = ([("follow_up", "follow_up")] + [("follow_up", "generic"), ("generic", "follow_up")]
         + [("generic", "generic")] * 7)


def test_hand_computed_values():
    # p_o = 0.8; pooled shares 0.2 / 0.8.
    assert cohen_kappa(PAIRS, BINARY) == pytest.approx((0.8 - 0.68) / (1 - 0.68))  # 0.375
    assert gwet_ac1(PAIRS, BINARY) == pytest.approx((0.8 - 0.32) / (1 - 0.32))  # 0.706
    assert pabak(PAIRS, BINARY) == pytest.approx(0.6)
    # Nominal alpha: 20 values, 4 off-diagonal coincidences, n_f n_g = 4 * 16 (twice):
    # 1 - 19 * 4 / 128.
    ratings = {"a": {str(i): x for i, (x, _) in enumerate(PAIRS)},
               "b": {str(i): y for i, (_, y) in enumerate(PAIRS)}}
    assert alpha(ratings, BINARY) == pytest.approx(1 - 19 * 4 / 128)
    assert constant_baseline(PAIRS) == ("generic", 0.8)
    f1 = per_label(PAIRS, BINARY)
    assert f1["follow_up"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}


def test_rare_label_kappa_drops_where_ac1_does_not():
    # 100 turns, 2 follow-ups, the raters disagree on both: 98% agreement, kappa below 0.
    pairs = ([("follow_up", "generic"), ("generic", "follow_up")]
             + [("generic", "generic")] * 98)
    assert cohen_kappa(pairs, BINARY) < 0
    assert gwet_ac1(pairs, BINARY) > 0.95


def test_against_the_libraries_on_random_labels():
    import krippendorff
    from sklearn.metrics import cohen_kappa_score

    rng = np.random.default_rng(4)
    a = rng.choice(LABELS, size=200, p=[0.1, 0.5, 0.1, 0.1, 0.1, 0.05, 0.05])
    b = np.where(rng.random(200) < 0.7, a, rng.choice(LABELS, size=200))
    pairs = list(zip(a.tolist(), b.tolist()))
    assert cohen_kappa(pairs) == pytest.approx(cohen_kappa_score(a, b))
    # Three raters with missing labels: our wrapper is the package on the same matrix.
    c = np.where(rng.random(200) < 0.6, a, rng.choice(LABELS, size=200)).astype(object)
    c[rng.random(200) < 0.3] = None
    ratings = {name: {str(i): v for i, v in enumerate(col)}
               for name, col in (("a", a), ("b", b), ("c", c))}
    index = {label: i for i, label in enumerate(LABELS)}
    data = [[index[v] if v is not None else np.nan for v in col] for col in (a, b, c)]
    expected = krippendorff.alpha(reliability_data=data, level_of_measurement="nominal")
    assert alpha(ratings) == pytest.approx(expected)


def _agreement(a, b, kappa, n=50):
    return Agreement(a, b, n, kappa, kappa, kappa, 0.9, [], {}, 0, ac1=kappa + 0.1)


def test_labellers_are_read_against_the_people_range():
    results = [_agreement("human:ana", "human:bo", 0.7), _agreement("human:ana", "human:cy", 0.8),
               _agreement("human:bo", "human:cy", 0.75), _agreement("human:ana", "rules", 0.72),
               _agreement("human:ana", "classifier", 0.5), _agreement("classifier", "rules", 0.9)]
    rows = {row.labeller: row for row in against_people(results)}
    assert set(rows) == {"rules", "classifier"}  # labeller vs labeller is not against a person
    assert (rows["rules"].human_low, rows["rules"].human_high) == (0.7, 0.8)
    assert rows["rules"].in_range is True and rows["classifier"].in_range is False


def test_empty_input_is_nan():
    assert np.isnan(gwet_ac1([])) and np.isnan(pabak([]))
    assert np.isnan(alpha({"a": {"1": "generic"}}))
    assert constant_baseline([])[0] is None
