"""Agreement between label sources: kappa on textbook tables, the NaN convention, confusion matrix,
per-label precision/recall, the item-clustered interval, and every source pair of a real store."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from userturn.backends.fake import ScriptedBackend
from userturn.config import Experiment
from userturn.probe.pipeline import run_experiment
from userturn.records import Label, Request
from userturn.report.agreement import NOTHING_TO_COMPARE, print_agreement
from userturn.stats.agreement import (
    Agreement,
    cohen_kappa,
    confusion_matrix,
    kappa_interval,
    order_sources,
    pairwise_agreement,
    per_label,
)
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns

F, G, N = "follow_up", "generic", "new_query"


def table(cells: dict[tuple[str, str], int]) -> list[tuple[str, str]]:
    return [pair for pair, count in cells.items() for _ in range(count)]


# -- kappa ------------------------------------------------------------------------------------

def test_two_label_textbook_table():
    # p_o = 35/50 = 0.7; marginals A 25/25, B 30/20: p_e = 0.5; kappa = 0.2 / 0.5.
    pairs = table({(F, F): 20, (F, G): 5, (G, F): 10, (G, G): 15})
    assert cohen_kappa(pairs) == pytest.approx(0.4)


def test_three_label_hand_computed():
    # Rows (A) 15/10/25, columns (B) 15/11/24, diagonal 38 of 50:
    # kappa = (50*38 - (15*15 + 10*11 + 25*24)) / (50**2 - 935) = 965 / 1565 = 193/313.
    pairs = table({(F, F): 10, (F, G): 2, (F, N): 3, (G, F): 1, (G, G): 8, (G, N): 1,
                   (N, F): 4, (N, G): 1, (N, N): 20})
    assert cohen_kappa(pairs) == pytest.approx(193 / 313)
    assert cohen_kappa(pairs, labels=(N, G, F, "empty")) == pytest.approx(193 / 313)


def test_perfect_chance_and_opposite_agreement():
    assert cohen_kappa([(F, F), (G, G), (N, N), (G, G)]) == 1.0
    # B's label is independent of A's: p_o = p_e = 1/2.
    assert cohen_kappa(table({(F, F): 7, (F, G): 7, (G, F): 7, (G, G): 7})) == pytest.approx(0.0)
    assert cohen_kappa(table({(F, G): 5, (G, F): 5})) == pytest.approx(-1.0)


def test_undefined_kappa_is_nan():
    # Both raters constant on the same label: p_e = 1, kappa 0/0 -> NaN (not 1, not an error).
    assert math.isnan(cohen_kappa([(G, G)] * 10))
    assert math.isnan(cohen_kappa([]))
    # Only one rater constant: p_e = p_o, kappa is a well-defined 0.
    assert cohen_kappa([(G, G), (G, G), (G, G), (G, F)]) == pytest.approx(0.0)


def test_unknown_label_is_an_error():
    with pytest.raises(ValueError, match="typo"):
        cohen_kappa([(F, "typo")])


# -- confusion matrix and per-label -----------------------------------------------------------

HAND = table({(F, F): 3, (F, G): 1, (G, G): 2, (G, F): 1, (N, G): 1})


def test_confusion_matrix_rows_are_rater_a():
    matrix = confusion_matrix(HAND)
    assert len(matrix) == 7 and all(len(row) == 7 for row in matrix)
    assert [row[:3] for row in matrix[:3]] == [[3, 1, 0], [1, 2, 0], [0, 1, 0]]
    assert sum(map(sum, matrix)) == len(HAND)
    assert confusion_matrix(HAND, labels=(G, F, N)) == [[2, 1, 0], [1, 3, 0], [1, 0, 0]]


def test_per_label_precision_recall_support():
    stats = per_label(HAND)
    assert list(stats) == [F, G, N]  # labels nobody used are left out
    assert stats[F] == {"precision": 0.75, "recall": 0.75, "f1": 0.75, "support": 4}
    assert stats[G]["f1"] == pytest.approx(2 * (2 / 4) * (2 / 3) / (2 / 4 + 2 / 3))
    assert stats[G]["precision"] == pytest.approx(2 / 4)
    assert stats[G]["recall"] == pytest.approx(2 / 3) and stats[G]["support"] == 3
    assert stats[N]["recall"] == 0.0 and stats[N]["support"] == 1
    assert math.isnan(stats[N]["precision"])  # B never said new_query
    assert math.isnan(stats[N]["f1"])


# -- clustered interval -----------------------------------------------------------------------

def clustered_pairs() -> tuple[list[tuple[str, str]], list[int]]:
    """80 turns in 8 items of 10; an item's turns all agree or all disagree. kappa = 0.5."""
    kinds = [(F, F)] * 3 + [(G, G)] * 3 + [(F, G), (G, F)]
    pairs, items = [], []
    for item, pair in enumerate(kinds):
        pairs += [pair] * 10
        items += [item] * 10
    return pairs, items


def test_interval_contains_estimate_and_widens_with_clustering():
    pairs, items = clustered_pairs()
    kappa = cohen_kappa(pairs)
    assert kappa == pytest.approx(0.5)
    low_c, high_c = kappa_interval(pairs, items, resamples=1000)
    low_i, high_i = kappa_interval(pairs, list(range(len(pairs))), resamples=1000)
    assert low_c <= kappa <= high_c and low_i <= kappa <= high_i
    assert high_c - low_c > 1.5 * (high_i - low_i)
    assert kappa_interval(pairs, items, resamples=300, seed=3) == \
        kappa_interval(pairs, items, resamples=300, seed=3)


def test_interval_degenerate_cases():
    pairs, _ = clustered_pairs()
    assert kappa_interval(pairs, ["one"] * len(pairs)) == (0.5, 0.5)
    assert all(math.isnan(v) for v in kappa_interval([], []))
    assert all(math.isnan(v) for v in kappa_interval([(G, G)] * 4, [0, 1, 2, 3]))
    with pytest.raises(ValueError):
        kappa_interval(pairs, [0])
    with pytest.raises(ValueError):
        kappa_interval(pairs, list(range(len(pairs))), level=1.5)


def test_order_sources():
    assert order_sources(["rules", "judge:b@r", "human:zoe", "judge:a@r", "human:al"]) == \
        ["human:al", "human:zoe", "judge:a@r", "judge:b@r", "rules"]


# -- a real store -----------------------------------------------------------------------------

ALICE, JUDGE = "human:alice", "judge:x@rubric1"


def script(request: Request) -> str:
    """Scripted model: a number as the answer, a thank-you (greedy) or a question (sampled)."""
    if not request.prompt.endswith("<|im_start|>user\n"):
        return "#### 26"
    return "Why 26?" if request.params.temperature > 0 else "Thank you!"


@pytest.fixture
def store(gsm_file, tmp_path):
    """24 user turns (6 greedy, then 18 sampled); alice, a judge and the pipeline's rules."""
    exp = Experiment(models=["fake/scripted"], datasets=[str(gsm_file)], limit=6,
                     temperatures=[0.0, 1.0], samples=3, output=tmp_path / "run",
                     labeller="rules")  # the pairs below are of the rules, alice and a judge
    store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(script)})
    turns = read_turns(store)
    assert len(turns) == 24
    truth = [G if t.temperature == 0 else F for t in turns]
    flip = {F: G, G: F}
    rows = []
    for i, (turn, label) in enumerate(zip(turns, truth)):
        rows.append(LabelRow(turn.key, "v1", Label(None if i in (6, 7) else label, ALICE)))
        if i == 23:
            continue  # the judge has not seen this turn
        if i in (7, 9, 10):
            rows.append(LabelRow(turn.key, "v1", Label(None, JUDGE, error="no label in answer")))
        else:
            rows.append(LabelRow(turn.key, "v1",
                                 Label(flip[label] if i in (0, 8) else label, JUDGE)))
    store.put_labels(rows)
    yield store
    store.close()


def test_pairwise_agreement_on_a_store(store):
    results = pairwise_agreement(read_turns(store), resamples=300)
    assert [(r.a, r.b) for r in results] == [(ALICE, JUDGE), (ALICE, "rules"), (JUDGE, "rules")]
    pair = results[0]
    # Shared: turns 0-22; alice None on 6, 7; judge None on 7, 9, 10 -> 4 excluded, 19 compared.
    assert (pair.n, pair.excluded, pair.excluded_a, pair.excluded_b) == (19, 4, 2, 3)
    # Rows alice: follow_up 12 agree + 1 (turn 8); generic 5 agree + 1 (turn 0).
    assert [row[:2] for row in pair.matrix[:2]] == [[12, 1], [1, 5]]
    assert pair.kappa == pytest.approx((19 * 17 - (13 * 13 + 6 * 6)) / (19 ** 2 - 205))
    assert pair.raw == pytest.approx(17 / 19)
    assert pair.low <= pair.kappa <= pair.high and pair.items == 6
    assert pair.per_label[F]["support"] == 13 and pair.per_label[G]["recall"] == pytest.approx(5 / 6)
    rules = results[1]
    assert rules.n + rules.excluded == 24 and rules.excluded_a == 2


def test_sparse_and_absent_sources_never_raise(store):
    key = read_turns(store)[0].key
    store.put_labels([LabelRow(key, "v1", Label(G, "human:bob"))])
    results = pairwise_agreement(read_turns(store), sources=[JUDGE, "human:bob", "human:nobody"],
                                 resamples=50)
    assert [(r.a, r.b) for r in results] == [(JUDGE, "human:bob"), (JUDGE, "human:nobody"),
                                             ("human:bob", "human:nobody")]
    one, absent, _ = results
    assert one.n == 1 and math.isnan(one.kappa) and one.raw == 0.0  # judge flipped turn 0
    assert absent.n == 0 and absent.excluded == 0 and math.isnan(absent.kappa)
    assert math.isnan(absent.raw) and absent.per_label == {}


def test_labels_outside_the_set_are_kept(store):
    keys = [t.key for t in read_turns(store)[:3]]
    store.put_labels([LabelRow(k, "v1", Label("sarcasm", "judge:y@r")) for k in keys])  # type: ignore
    result = next(r for r in pairwise_agreement(read_turns(store), resamples=50) if r.b == "judge:y@r")
    assert result.labels[-1] == "sarcasm" and result.per_label["sarcasm"]["support"] == 0


def render(results: list[Agreement]) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    print_agreement(results, console)
    return console.export_text()


def test_print_agreement(store):
    text = render(pairwise_agreement(read_turns(store), resamples=100))
    assert "Cohen's kappa" in text and ALICE in text and "0.76 [" in text
    assert "4 (a: 2, b: 3)" in text and "follow-up" in text and "precision" in text
    assert NOTHING_TO_COMPARE not in text


def test_print_nothing_to_compare(store):
    assert NOTHING_TO_COMPARE in render([])
    assert NOTHING_TO_COMPARE in render(pairwise_agreement(read_turns(store), sources=["rules", "human:x"]))
