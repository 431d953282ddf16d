"""The flat exports (JSON Lines, CSV, Parquet, a DataFrame): the file's suffix decides the format
when --format is absent, a suffix naming another format is one line, and every label source's
label is a column, as the Hugging Face export keeps them."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import assert_one_line_error, experiment, run_cli, run_scripted, undecided_script

import userturn
from userturn.backends.fake import ScriptedBackend
from userturn.records import COLUMNS


@pytest.fixture(scope="module")
def cascade_run(tmp_path_factory):
    """Scripted turns the rules label (greedy) or leave to the form-only classifier (sampled):
    two sources, not every turn labelled by both."""
    folder = tmp_path_factory.mktemp("flat")
    data = folder / "gsm.jsonl"
    data.write_text("".join(json.dumps({"question": f"Sam has {n} apples and buys 2. How many?",
                                        "answer": f"x\n#### {n + 2}"}) + "\n"
                            for n in range(3)), encoding="utf-8")
    # the tests' default classifier is the form-only one (conftest): it labels as "classifier"
    exp = experiment(data, folder, limit=3)
    run_scripted(exp, ScriptedBackend(undecided_script)).close()
    run = userturn.load_run(exp.plan.output)
    sources = {lab.source for turn in run.turns() for lab in turn.labels}
    assert sources == {"rules", "classifier"}
    return run


def expected_sources(turn) -> dict[str, str | None]:
    found = {lab.source: lab.label or ("error" if lab.error else "undecided")
             for lab in turn.labels}
    return {"label_rules": found.get("rules"), "label_classifier": found.get("classifier")}


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_the_suffix_decides_the_format_and_every_source_is_a_column(cascade_run, tmp_path,
                                                                     capsys, suffix):
    out = tmp_path / f"turns{suffix}"
    code, printed, _ = run_cli(capsys, "export", str(cascade_run.folder), "-o", str(out))
    assert code == 0 and f"wrote {len(cascade_run.turns())} user turns to {out}" in printed
    if suffix == ".csv":
        rows = list(csv.DictReader(out.open(encoding="utf-8")))
        rows = [{k: (v or None) for k, v in row.items()} for row in rows]
    elif suffix == ".jsonl":
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    else:
        pq = pytest.importorskip("pyarrow.parquet")
        rows = pq.read_table(out).to_pylist()  # a Parquet file, not text under its name
    assert list(rows[0])[:len(COLUMNS)] == list(COLUMNS)
    assert list(rows[0])[len(COLUMNS):] == ["label_rules", "probability_rules",
                                            "label_classifier", "probability_classifier"]
    turns = {t.key: t for t in cascade_run.turns()}
    for row in rows:
        turn = turns[row["key"]]
        assert {k: row[k] for k in ("label_rules", "label_classifier")} == expected_sources(turn)
        classifier = next((lab for lab in turn.labels if lab.source == "classifier"), None)
        if classifier is not None and suffix != ".csv":
            assert row["probability_classifier"] == pytest.approx(classifier.probability)
    assert any(row["label_rules"] == "undecided" for row in rows)


def test_the_notebook_frame_has_every_source(cascade_run):
    pytest.importorskip("pandas")
    frame = cascade_run.to_pandas()
    assert list(frame.columns)[len(COLUMNS):] == ["label_rules", "probability_rules",
                                                  "label_classifier", "probability_classifier"]
    turns = {t.key: t for t in cascade_run.turns()}
    for _, row in frame.iterrows():
        expected = expected_sources(turns[row["key"]])
        assert row["label_rules"] == expected["label_rules"]
    assert cascade_run.records()[0].keys() == set(frame.columns)


@pytest.mark.parametrize(("args", "words"), [
    (["--format", "parquet", "-o", "out.csv"], "out.csv names a csv file but --format is parquet"),
    (["--format", "jsonl", "-o", "out.eval"], "names a inspect file but --format is jsonl"),
    (["-o", "out.txt"], "cannot tell the format from its name: give --format"),
    (["-o", "out"], "cannot tell the format from its name"),
])
def test_a_name_that_is_not_the_format_is_one_line_and_writes_nothing(cascade_run, tmp_path,
                                                                      capsys, monkeypatch,
                                                                      args, words):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "export", str(cascade_run.folder), *args)
    assert_one_line_error(code, err, words)
    assert list(tmp_path.iterdir()) == []
