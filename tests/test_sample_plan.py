"""Sizing the human sample (issue #40): the plan's half-widths against simulated calibration
samples, the allocation against an equal split, `annotate --plan` writing nothing, and every
sample size the CLI and the page suggest giving the corrected rates it promises."""

from __future__ import annotations

import csv
import json
import re
import shutil
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from helpers import QUESTIONS, run_cli

from userturn.cli.main import main
from userturn.labels.annotate import AnnotationServer
from userturn.labels.calibration import inclusion_probabilities, sample_plan
from userturn.records import Condition, Label
from userturn.stats.correction import MIN_HUMAN_LABELS, ppi_arrays
from userturn.stats.planning import (
    Design,
    LabellerError,
    allocate,
    half_width,
    plan,
    split,
)
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns


# -- the plan against simulation ----------------------------------------------------------------
def stated(items: int, samples: int, rate: float, icc: float, sensitivity: float,
           specificity: float) -> Design:
    """The design an error model states: people's rate, the labeller's sensitivity and
    specificity, the items' spread (ICC)."""
    predicted = sensitivity * rate + (1 - specificity) * (1 - rate)
    n = items * samples
    return Design(turns=n, items=items, predicted=round(predicted * n),
                  q1=sensitivity * rate / predicted, q0=(1 - sensitivity) * rate / (1 - predicted),
                  design_effect=1 + (samples - 1) * icc)


def simulate(items: int, samples: int, rate: float, icc: float, sensitivity: float,
             specificity: float, labels: int, runs: int = 400, seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray]:
    """Half-widths and coverage of the corrected interval (stats.correction) over ``runs``
    runs drawn from the error model, each with a calibration sample of ``labels`` stratified as
    `annotate --calibration` draws it."""
    rng = np.random.default_rng(seed)
    shape = (runs, items, samples)
    if icc > 0:
        spread = (1 - icc) / icc
        item_rate = rng.beta(rate * spread, (1 - rate) * spread, size=(runs, items, 1))
    else:
        item_rate = np.full((runs, items, 1), rate)
    human = (rng.random(shape) < item_rate).astype(float)
    says = np.where(human == 1, rng.random(shape) < sensitivity,
                    rng.random(shape) > specificity).astype(float)
    weight = np.zeros(shape)
    for r in range(runs):
        flat = says[r].ravel()
        chosen = np.zeros(flat.size)
        strata = (np.flatnonzero(flat == 1), np.flatnonzero(flat == 0))
        for stratum, take in zip(strata, split((len(strata[0]), len(strata[1])), labels)):
            if take:
                chosen[rng.choice(stratum, take, replace=False)] = len(stratum) / take
        weight[r] = chosen.reshape(items, samples)
    _, low, high, _ = ppi_arrays(says, human, weight)
    return (high - low) / 2, (low <= rate) & (rate <= high)


# items, samples, rate, ICC, sensitivity, specificity, target half-width
DESIGNS = [(100, 4, 0.15, 0.1, 0.6, 0.95, 0.06), (200, 1, 0.3, 0.0, 0.8, 0.9, 0.08),
           (500, 4, 0.15, 0.1, 0.6, 0.95, 0.04), (60, 3, 0.3, 0.2, 0.7, 0.9, 0.12)]


@pytest.mark.parametrize("model", DESIGNS, ids=lambda m: f"{m[0]}x{m[1]}-{m[2]:.0%}")
def test_the_planned_labels_give_the_half_width_simulation_finds(model):
    *truth, target = model
    design = stated(*truth)
    planned = plan(design, target)
    assert planned.status == "ok" and MIN_HUMAN_LABELS <= planned.labels < design.turns
    # The fewest: one label less is expected to be wider than asked.
    assert half_width(design, planned.labels - 1) > target >= planned.half_width
    widths, covers = simulate(*truth, planned.labels)
    # The mean drawn half-width is what the plan expects (a little less: the mean of a square
    # root is below the root of the mean variance), and never wider than promised.
    assert 0.85 * planned.half_width <= widths.mean() <= 1.02 * planned.half_width
    assert widths.mean() <= target * 1.02
    assert covers.mean() >= 0.9  # 400 runs: the interval still covers people's rate


def test_the_plan_follows_the_labellers_table_and_is_no_narrower_than_promised():
    # A table like the shipped cascade's on unseen models; a condition where people's rate is
    # 25% and the labeller has the table's sensitivity and specificity.
    table = ((336, 272), (284, 2361))
    sensitivity, specificity = 336 / 608, 2361 / 2645
    error = LabellerError(table, "card", gap=0.07)
    rate = 0.25
    predicted = sensitivity * rate + (1 - specificity) * (1 - rate)
    q1, q0 = error.human_rates(predicted)
    design = Design(turns=800, items=200, predicted=round(predicted * 800), q1=q1, q0=q0,
                    design_effect=1.3)
    planned = plan(design, 0.05)
    widths, _ = simulate(200, 4, rate, 0.1, sensitivity, specificity, planned.labels)
    assert widths.mean() <= 0.05
    # The gap plans for a rate nearer 50% than the table predicts: more labels than without.
    plain = LabellerError(table, "card").human_rates(predicted)
    assert plan(Design(800, 200, design.predicted, *plain, 1.3), 0.05).labels < planned.labels


def test_allocation_beats_an_equal_split_on_the_widest_interval():
    # Greedy rows of 200 items at 2-5% beside sampled rows of 200 x 4 at 15-30%.
    designs = [stated(200, 1, r, 0.0, 0.6, 0.95) for r in (0.02, 0.05)]
    designs += [stated(200, 4, r, 0.1, 0.6, 0.95) for r in (0.15, 0.3)]
    budget = 600
    planned = allocate(designs, budget)
    assert sum(planned) == budget and min(planned) >= MIN_HUMAN_LABELS
    equal = [budget // len(designs)] * len(designs)
    widest = max(half_width(d, n) for d, n in zip(designs, planned))
    assert widest < 0.9 * max(half_width(d, n) for d, n in zip(designs, equal))
    # Drawn, not only expected: the widest mean half-width shrinks too.
    drawn = [simulate(200, s, r, icc, 0.6, 0.95, n, runs=200)[0].mean() for (s, r, icc), n in
             zip([(1, 0.02, 0.0), (1, 0.05, 0.0), (4, 0.15, 0.1), (4, 0.3, 0.1)], planned)]
    even = [simulate(200, s, r, icc, 0.6, 0.95, n, runs=200)[0].mean() for (s, r, icc), n in
            zip([(1, 0.02, 0.0), (1, 0.05, 0.0), (4, 0.15, 0.1), (4, 0.3, 0.1)], equal)]
    assert max(drawn) < max(even)


def test_no_corrected_rate_is_promised_where_it_cannot_be_had():
    small = stated(20, 1, 0.1, 0.0, 0.6, 0.95)  # a 20-turn greedy row
    assert plan(small, 0.2).status == "too_few_turns" and plan(small, 0.2).more == 0
    big = stated(100, 2, 0.2, 0.0, 0.6, 0.95)
    # Every budget: the small row gets nothing; a budget short of the minimum of every row
    # funds the rows it can (in order), and narrows them; short of any, it goes toward one.
    assert allocate([small, big], 1000)[0] == 0
    assert allocate([small, big, big], 45) == [0, 45, 0]  # the funded row is narrowed
    assert allocate([small, big, big], 20) == [0, 20, 0]  # toward the first row's minimum
    # Wider than can be had with every turn labelled: planned at all of them, and said so.
    hopeless = plan(big, 0.01)
    assert hopeless.status == "unreachable" and hopeless.labels == big.turns


def test_labels_given_count_toward_the_plan():
    design = stated(100, 4, 0.15, 0.1, 0.6, 0.95)
    fresh = plan(design, 0.06)
    given = Design(**{**design.__dict__, "given": 40, "given_predicted": 20})
    topped = plan(given, 0.06)
    assert topped.labels <= fresh.labels + 5 and topped.more == topped.labels - 40
    done = Design(**{**design.__dict__, "given": fresh.labels + 20,
                     "given_predicted": design.predicted})
    assert plan(done, 0.06).more == 0


# -- the commands on a run ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """6 items: greedy (6 turns) and T = 0.7 and 1.0 x 8 samples (48 turns each) of the scripted
    model, the rules' verdicts replaced so a third of each sampled row is a follow-up."""
    folder = tmp_path_factory.mktemp("plan")
    data = folder / "gsm.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": f"#### {a}"}) + "\n"
                            for q, a in QUESTIONS), encoding="utf-8")
    out = folder / "run"
    assert main(["run", "--model", "fake/probe", "--dataset", str(data), "--temperatures",
                 "0,0.7,1.0", "--samples", "8", "--output", str(out)]) == 0
    with closing(RunStore.open(out)) as store:
        keys = sorted(t.key for t in read_turns(store))
        store.put_labels([LabelRow(key, "test", Label("follow_up" if i % 3 == 0 else "generic",
                                                      "rules")) for i, key in enumerate(keys)])
    return out


@pytest.fixture
def run(made, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(made, copy)
    return copy


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_plan_writes_nothing_needs_no_annotator_and_its_total_corrects_every_row(capsys, run):
    before = snapshot(run)
    code, printed, err = run_cli(capsys, "annotate", str(run), "--plan", "--half-width", "0.2")
    assert code == 0, err
    assert snapshot(run) == before  # no lock, no sample, not a byte changed
    flat = " ".join(printed.split())
    assert "1 condition(s) have fewer than 30 turns" in flat  # the greedy row: 6 turns
    total = int(re.search(r"--calibration (\d+)", flat).group(1))
    assert total >= 2 * MIN_HUMAN_LABELS
    # The suggested sample, labelled, corrects every row it planned for.
    with AnnotationServer(run, "ana", calibration=total) as server:
        assert len(server.keys) == total
        for i, key in enumerate(list(server.keys)):
            server.label({"key": key, "label": "follow_up" if i % 4 == 0 else "generic"})
    code, printed, _ = run_cli(capsys, "report", str(run), "--html")
    assert code == 0
    rows = list(csv.DictReader((run / "report_tables" / "summary.csv").open(encoding="utf-8")))
    by_t = {float(r["temperature"]): r for r in rows}
    assert by_t[0.0]["corrected_rate"] == "" and by_t[0.0]["human_labels_more"] == ""
    for t in (0.7, 1.0):
        assert by_t[t]["corrected_rate"] != "" and by_t[t]["human_labels_more"] == "0"
        low, high = float(by_t[t]["corrected_low"]), float(by_t[t]["corrected_high"])
        assert (high - low) / 2 <= 0.2 + 0.02  # the plan's half-width (one run: a margin)


def test_plan_refuses_a_bad_half_width_in_one_line(capsys, run):
    code, _, err = run_cli(capsys, "annotate", str(run), "--plan", "--half-width", "0")
    assert code == 2 and "--half-width" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "annotate", str(run))
    assert code == 2 and "--annotator" in err


def test_the_page_counts_toward_each_rows_minimum_first(run):
    with AnnotationServer(run, "ana", calibration=70) as server:
        progress = server.progress()
        # Two rows of 48 can be corrected (35 labels each, give or take the widest's), the greedy
        # row is not drawn from.
        planned = [c["planned"] for c in progress["conditions"]]
        assert sum(planned) == 70 and min(planned) >= 30 and len(planned) == 2
        assert progress["to_correction"] == 60 and progress["short"] == 0
        for key in list(server.keys)[:60]:  # the first 60 keys bring both rows to 30
            server.label({"key": key, "label": "generic"})
        progress = server.progress()
        assert progress["to_correction"] == 0
        assert [c["done"] for c in progress["conditions"]] == [30, 30]
    # Another person's sample counts them: both rows are corrected already.
    with AnnotationServer(run, "bo", calibration=20) as server:
        progress = server.progress()
        assert [c["done"] for c in progress["conditions"]] == [30, 30]
        assert progress["to_correction"] == 0 and progress["short"] == 0


def test_the_page_says_which_rows_a_small_sample_cannot_correct(run):
    # Too small a sample for two rows: one row gets all 45, the other none, and the page says
    # it cannot reach 30 rather than counting toward it.
    with AnnotationServer(run, "bo", calibration=45) as server:
        progress = server.progress()
        assert [c["planned"] for c in progress["conditions"]] == [45, 0]
        assert progress["to_correction"] == 30 and progress["short"] == 1


def _cells(run: Path) -> dict[tuple[Condition, bool], int]:
    with closing(RunStore.read(run)) as store:
        turns = read_turns(store)
    sizes: dict[tuple[Condition, bool], int] = {}
    for t in turns:
        sizes[(Condition.of(t), t.follow_up)] = sizes.get((Condition.of(t), t.follow_up), 0) + 1
    return sizes


def _weights(run: Path) -> dict[tuple[Condition, bool], float]:
    """Per stratum of a condition, the labelled turns' inverse inclusion probabilities summed:
    the turns they stand for, which must be the stratum's size."""
    with closing(RunStore.read(run)) as store:
        turns = read_turns(store)
        inclusion = inclusion_probabilities(store.meta(), turns)
    sums: dict[tuple[Condition, bool], float] = {}
    for t in turns:
        if t.key in inclusion:
            cell = (Condition.of(t), t.follow_up)
            sums[cell] = sums.get(cell, 0.0) + 1 / inclusion[t.key]
    return sums


def test_a_sample_labelled_in_part_stands_for_every_turn_of_each_stratum(run):
    with AnnotationServer(run, "ana", calibration=80) as server:
        for key in list(server.keys)[:50]:
            server.label({"key": key, "label": "generic"})
    sizes = _cells(run)
    for cell, total in _weights(run).items():
        assert total == pytest.approx(sizes[cell])


def test_a_second_sample_tops_up_the_first_and_the_union_is_weighted_as_one(capsys, run):
    with AnnotationServer(run, "ana", calibration=62) as server:
        first = list(server.keys)
        for key in first:
            server.label({"key": key, "label": "generic"})
    code, printed, _ = run_cli(capsys, "annotate", str(run), "--plan", "--half-width", "0.12")
    assert code == 0
    more = int(re.search(r"--calibration (\d+)", " ".join(printed.split())).group(1))
    # The 62 labels given count: the plan asks for the rest only.
    with closing(RunStore.read(run)) as store:
        rows = sample_plan(store, 0.12)
    assert sum(r.design.given for r in rows) == 62
    assert more == sum(r.planned.labels - r.design.given for r in rows) > 0
    with AnnotationServer(run, "bo", calibration=more) as server:
        assert not set(server.keys) & set(first)  # labelled turns are not drawn again
        for key in list(server.keys):
            server.label({"key": key, "label": "follow_up"})
    sizes = _cells(run)
    for cell, total in _weights(run).items():
        assert total == pytest.approx(sizes[cell])


def test_corrected_rates_lead_and_short_rows_say_how_many_more(capsys, run):
    with closing(RunStore.open(run)) as store:
        turns = [t for t in read_turns(store) if t.temperature == 0.7]
        store.put_labels([LabelRow(t.key, "human", Label("generic", "human:ana"))
                          for t in turns[:12]])
    code, printed, _ = run_cli(capsys, "report", str(run), "--html")
    assert code == 0
    flat = " ".join(printed.split())
    assert "(18 more" in flat and "(none: 6" in flat and "12 of 30" in flat
    # The suggestion is a size that corrects every row that can have one: 18 + 30.
    assert "--calibration 48" in flat and "calibration 100" not in flat
    header = next(line for line in printed.splitlines() if "corrected" in line and "raw" in line)
    assert header.index("corrected") < header.index("raw follow-up")
    page = (run / "report.html").read_text(encoding="utf-8")
    assert page.index("corrected [95% CI]") < page.index("raw follow-up [95% CI]")
    assert "18 more labels" in page
