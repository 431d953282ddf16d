"""A rate from offline labels alone carries the labeller's measured error on unseen models, and
says how to correct it; a rate a person or a judge decided does not."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import run_cli

from userturn.labels.offline_error import CARD_FILE, offline_error

NOTE = "offline labels only (rules)"  # the run below is labelled by the rules alone


@pytest.fixture
def run(capsys, tmp_path, gsm_file) -> Path:
    out = tmp_path / "run"
    code, _, _ = run_cli(capsys, "run", "--model", "fake/probe", "--dataset", str(gsm_file),
                         "--temperatures", "1.0", "--samples", "6", "--labeller", "rules",
                         "--output", str(out))
    assert code == 0
    return out


def test_the_shipped_card_holds_every_held_out_group_of_the_benchmark() -> None:
    card = json.loads(CARD_FILE.read_text(encoding="utf-8"))
    held_out = {"SmolLM2-135M", "Qwen2.5-Coder-1.5B", "people"}
    # The shipped labeller was also measured on people's ShareGPT turns (unseen_people.py).
    for labeller, groups in (("context", held_out | {"people (ShareGPT)"}), ("form", held_out)):
        folds = card["labellers"][labeller]
        assert set(folds) == groups
        assert all(-1 <= fold["kappa_follow_up"] <= 1 and fold["gaps"] for fold in folds.values())
    error = offline_error()
    gaps = [abs(g) for fold in card["labellers"]["context"].values() for g in fold["gaps"]]
    assert error.max_gap == max(gaps) and error.mean_gap == pytest.approx(sum(gaps) / len(gaps))
    assert error.kappa_follow_up == (
        min(f["kappa_follow_up"] for f in card["labellers"]["context"].values()),
        max(f["kappa_follow_up"] for f in card["labellers"]["context"].values()))


def test_an_offline_rate_says_how_far_such_labels_were_from_people_and_how_to_correct(
        capsys, run) -> None:
    code, printed, _ = run_cli(capsys, "report", str(run), "--html")
    assert code == 0
    flat = " ".join(printed.split())
    error = offline_error()
    assert NOTE in flat and f"up to {error.max_gap:.0f}" in flat
    assert "userturn annotate RUN --plan --half-width 0.05" in flat  # a size that can succeed
    page = (run / "report.html").read_text(encoding="utf-8")
    assert NOTE in page and "--scope uncertain" in page


def test_with_human_labels_the_corrected_rate_takes_the_notes_place(capsys, run, tmp_path) -> None:
    from contextlib import closing

    from userturn.store.database import RunStore
    from userturn.store.turns import read_turns

    with closing(RunStore.open(run)) as store:
        keys = sorted(t.key for t in read_turns(store))
    path = tmp_path / "labels.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "label"])
        writer.writerows((key, "follow_up") for key in keys)
    code, _, _ = run_cli(capsys, "annotate", str(run), "--import", str(path), "--annotator", "a")
    assert code == 0
    code, printed, _ = run_cli(capsys, "report", str(run))
    assert code == 0 and NOTE not in " ".join(printed.split()) and "corrected" in printed


def test_a_missing_or_broken_card_means_no_note_not_a_crash(tmp_path) -> None:
    assert offline_error(path=tmp_path / "none.json") is None
    broken = tmp_path / "broken.json"
    broken.write_text('{"labellers": {"context": {"x": {"gaps": []}}}}', encoding="utf-8")
    assert offline_error(path=broken) is None
