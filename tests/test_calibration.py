"""Calibration samples, imported human labels and corrected rates end to end: a scripted run,
labels imported through the CLI, and the corrected columns in the terminal, the page's tables
and the API."""

from __future__ import annotations

import csv
import json
from contextlib import closing
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_cli

from userturn.labels.calibration import calibration_sample, inclusion_probabilities
from userturn.records import Label
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns


@pytest.fixture
def run(capsys, tmp_path, gsm_file) -> Path:
    """6 items x 8 sampled turns of the scripted model: the rules call every one a follow-up."""
    out = tmp_path / "run"
    code, _, _ = run_cli(capsys, "run", "--model", "fake/probe", "--dataset", str(gsm_file),
                         "--temperatures", "1.0", "--samples", "8", "--output", str(out))
    assert code == 0
    return out


def _keys(folder: Path) -> list[str]:
    with closing(RunStore.open(folder)) as store:
        return sorted(t.key for t in read_turns(store))


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "label"])
        writer.writerows(rows)
    return path


def test_imported_labels_correct_the_rate_everywhere(capsys, run, tmp_path):
    keys = _keys(run)
    assert len(keys) == 48
    # A person says only every other turn is a real follow-up: the rules over-count by half.
    labels = [(key, "follow_up" if i % 2 == 0 else "generic") for i, key in enumerate(keys[:40])]
    code, printed, _ = run_cli(capsys, "annotate", str(run), "--import",
                               str(_write_csv(tmp_path / "labels.csv", labels)),
                               "--annotator", "ana")
    assert code == 0 and "stored 40 labels as human:ana" in printed
    code, printed, _ = run_cli(capsys, "report", str(run), "--html")
    assert code == 0
    assert "corrected" in printed and "human labels" in printed
    row = next(line for line in printed.splitlines() if "fake/probe" in line and "%" in line)
    assert "100% [" in row and "50% [" in row, printed
    summary = list(csv.DictReader((run / "report_tables" / "summary.csv").open(encoding="utf-8")))
    assert len(summary) == 1
    corrected = float(summary[0]["corrected_rate"])
    low, high = float(summary[0]["corrected_low"]), float(summary[0]["corrected_high"])
    assert summary[0]["human_labels"] == "40" and float(summary[0]["follow_up"]) == 1.0
    # Every turn is predicted a follow-up, so the correction is the humans' 20 of 40.
    assert corrected == pytest.approx(0.5) and low < 0.5 < high < 1.0
    # Beside it the humans' labels alone (weighted by 48/40): a constant labeller adds nothing,
    # so the power tuning gives it no weight and the two intervals are the same.
    alone = [float(summary[0][f"human_only_{k}"]) for k in ("rate", "low", "high")]
    assert alone == pytest.approx([corrected, low, high])
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "corrected [95% CI]" in page and "human only [95% CI]" in page and "PPI++" in page
    # The agreement section: the rules against the person (kappa 0: rules say follow-up always).
    assert '<section id="agreement">' in page and 'href="#agreement"' in page
    assert '<td class="">human:ana</td><td class="">rules</td><td class="num">40</td>' in page


def test_too_few_human_labels_leave_the_correction_out_with_the_reason(capsys, run, tmp_path):
    rows = [(key, "generic") for key in _keys(run)[:10]]
    code, _, _ = run_cli(capsys, "annotate", str(run), "--import",
                         str(_write_csv(tmp_path / "few.csv", rows)), "--annotator", "ana")
    assert code == 0
    code, printed, _ = run_cli(capsys, "report", str(run))
    assert code == 0
    assert "correction not shown: 10 human label(s), fewer than 30" in printed


@pytest.mark.parametrize("content,needle", [
    ("key,label\nKEY,follow_up\nnope,generic\n", "line 3: unknown key 'nope'"),
    ("key,label\nKEY,maybe\n", "line 2: unknown label 'maybe'"),
    ("id,verdict\nKEY,generic\n", "line 1: a CSV header with key and label is needed"),
])
def test_bad_import_rows_are_named_by_line_and_nothing_is_stored(capsys, run, tmp_path, content,
                                                                 needle):
    path = tmp_path / "bad.csv"
    path.write_text(content.replace("KEY", _keys(run)[0]), encoding="utf-8")
    code, _, err = run_cli(capsys, "annotate", str(run), "--import", str(path),
                           "--annotator", "ana")
    assert_one_line_error(code, err, needle)
    with closing(RunStore.open(run)) as store:
        assert "human:ana" not in {row.source for row in store.label_rows()}


def test_jsonl_import(capsys, run, tmp_path):
    keys = _keys(run)
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"key": keys[0], "label": "meta"}) + "\n\n"
                    + json.dumps({"key": keys[1], "label": "follow_up"}) + "\n", encoding="utf-8")
    code, printed, _ = run_cli(capsys, "annotate", str(run), "--import", str(path),
                               "--annotator", "bo")
    assert code == 0 and "stored 2 labels" in printed
    path.write_text('{"key": "x", "label": "meta"}\n[1]\n', encoding="utf-8")
    code, _, err = run_cli(capsys, "annotate", str(run), "--import", str(path),
                           "--annotator", "bo")
    assert_one_line_error(code, err, "line 2: not a JSON object")
    # Bytes that are not UTF-8 are named with their line too (and .ndjson is JSON Lines).
    latin = tmp_path / "labels.ndjson"
    latin.write_bytes(b'{"key": "x", "label": "meta"}\n{"key": "caf\xe9", "label": "meta"}\n')
    code, _, err = run_cli(capsys, "annotate", str(run), "--import", str(latin),
                           "--annotator", "bo")
    assert_one_line_error(code, err, "line 2: not UTF-8 text (byte 0xe9)")


def _relabel(folder: Path, follow_ups: int) -> None:
    """Make the labeller ("rules") predict a follow-up on the first ``follow_ups`` turns only."""
    with closing(RunStore.open(folder)) as store:
        labels = [LabelRow(key, "test",
                           Label("follow_up" if i < follow_ups else "generic", "rules"))
                  for i, key in enumerate(_keys(folder))]
        store.put_labels(labels)


def test_calibration_sample_oversamples_predicted_follow_ups(run):
    _relabel(run, 6)  # 6 predicted follow-ups, 42 others
    with closing(RunStore.open(run)) as store:
        turns = read_turns(store, "rules")
    keys, inclusion = calibration_sample(turns, 20, seed=1)
    assert len(keys) == len(set(keys)) == 20
    predicted = {t.key: t.follow_up for t in turns}
    # Half the slots go to predicted follow-ups, but there are only 6: all 6, then 14 of 42.
    assert sum(predicted[k] for k in keys) == 6
    assert {inclusion[k] for k in keys if predicted[k]} == {1.0}
    assert [inclusion[k] for k in keys if not predicted[k]] == [pytest.approx(14 / 42)] * 14
    assert calibration_sample(turns, 20, seed=1) == (keys, inclusion)


def test_annotate_calibration_stores_inclusion_probabilities_the_estimator_uses(run):
    from userturn.labels.annotate import AnnotationServer

    _relabel(run, 12)
    with AnnotationServer(run, "cal", calibration=10) as server:
        for key in list(server.keys):
            server.label({"key": key, "label": "generic"})
    with closing(RunStore.open(run)) as store:
        turns = read_turns(store, "rules")
        stored = store.meta().annotation_samples["cal"].inclusion
        assert inclusion_probabilities(store.meta(), turns) == stored
    predicted = {t.key: t.follow_up for t in turns}
    assert sorted(stored[k] for k in stored if predicted[k]) == [pytest.approx(5 / 12)] * 5
    assert sorted(stored[k] for k in stored if not predicted[k]) == [pytest.approx(5 / 36)] * 5


def test_compare_shows_the_corrected_difference(capsys, run, tmp_path):
    other = tmp_path / "other"
    import shutil

    shutil.copytree(run, other)
    keys = _keys(run)
    for folder, every in ((run, 2), (other, 4)):  # humans: 1/2 vs 1/4 real follow-ups
        rows = [(key, "follow_up" if i % every == 0 else "generic") for i, key in enumerate(keys)]
        assert run_cli(capsys, "annotate", str(folder), "--import",
                       str(_write_csv(tmp_path / f"{folder.name}.csv", rows)),
                       "--annotator", "ana")[0] == 0
    code, printed, _ = run_cli(capsys, "compare", str(run), str(other))
    assert code == 0, printed
    flat = " ".join(printed.replace("│", " ").split())
    # Same generations, same raw rates (100%); the humans say 50% vs 25%, so -25 points.
    assert "Corrected for the labeller's errors" in flat
    assert "50.0% (48 labels) 25.0% (48 labels) -25.0 pts [" in flat


def test_agreement_reads_the_labeller_against_the_people(capsys, run, tmp_path):
    keys = _keys(run)
    for name, flips in (("ana", ()), ("bo", (1, 2))):  # the people disagree on 2 turns of 48
        rows = [(key, "follow_up" if (i % 2 == 0) != (i in flips) else "generic")
                for i, key in enumerate(keys)]
        assert run_cli(capsys, "annotate", str(run), "--import",
                       str(_write_csv(tmp_path / f"{name}.csv", rows)), "--annotator", name)[0] == 0
    code, printed, _ = run_cli(capsys, "agreement", str(run))
    assert code == 0
    flat = " ".join(printed.replace("│", " ").split())
    assert "Labellers against people" in flat and "AC1" in flat and "PABAK" in flat
    assert "Krippendorff's alpha (nominal), people only:" in flat
    # The rules say follow-up everywhere: kappa 0 against each person, below the people's range.
    assert "rules human:ana 48 0.00" in flat and "0.92 to 0.92 no" in flat
