"""The Python API a researcher uses in a notebook: run, load_run, Run, classify, render_user_turn."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import userturn
from userturn.cli.main import main
from userturn.errors import ConfigError, StoreError, UserturnError
from userturn.records import COLUMNS, Case, Label
from userturn.store.database import RunStore
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_run(tmp_path, gsm_file) -> userturn.Run:
    """A fake-model run whose rules labels are all follow-ups, then a judge that disagrees on
    some turns (one verdict failed), so the chosen label sources change the rates."""
    out = tmp_path / "run"
    run = userturn.run(models=["fake/probe"], datasets=[str(gsm_file)], limit=3, samples=2,
                       output=out)
    store = RunStore.open(out)
    turns = read_turns(store)
    store.put_labels([LabelRow(t.key, "r1", Label("generic", "judge:x@r1")) for t in turns[:3]]
                     + [LabelRow(turns[3].key, "r1",
                                 Label(None, "judge:x@r1", error="bad verdict"))])
    store.close()
    return run


def test_run_and_load_run_read_the_same_turns(fake_run, tmp_path):
    again = userturn.load_run(fake_run.folder)
    assert [t.key for t in again.turns()] == [t.key for t in fake_run.turns()]
    assert len(fake_run.turns()) == 3 * (1 + 2)
    with pytest.raises(StoreError, match="not a userturn run folder"):
        userturn.load_run(tmp_path / "nothing")


def test_summary_reads_the_label_sources_asked_for(fake_run):
    (greedy, sampled) = fake_run.summary()
    assert (greedy.follow_up.hits, greedy.follow_up.n) == (3, 3)  # the rules: all follow-ups
    greedy, sampled = fake_run.summary(["judge:x@r1", "rules"])
    assert (greedy.follow_up.hits, greedy.follow_up.n) == (0, 3)  # the judge's generic wins
    # past its failed verdict the rules decide: the turn keeps its label and counts
    assert (sampled.label_errors, sampled.follow_up.hits, sampled.follow_up.n) == (1, 6, 6)
    greedy, sampled = fake_run.summary("judge:x@r1")
    # with the judge alone, the failed verdict leaves its turn undecided, as if never asked;
    # it is counted as a label error, never as a label and never out of the rate
    assert (sampled.label_errors, sampled.undecided, sampled.follow_up.n) == (1, 6, 6)


def test_turn_status_is_the_rate_definition(fake_run):
    turns = {t.key: t for t in fake_run.turns(["judge:x@r1"])}
    statuses = [t.status for t in turns.values()]
    assert statuses.count("generic") == 3
    assert statuses.count("undecided") == 6  # the judge did not look at 5, and failed on 1
    assert all(t.counts_toward_rate for t in turns.values())
    invalid = next(t for t in turns.values() if t.label_error is not None)
    assert invalid.status == "undecided" and invalid.label is None
    assert invalid.label_error == "bad verdict"
    # every label of the turn is kept, by source: the offline cascade's (the rules', and the
    # classifier's where the rules abstain) and the judge's
    rules = next(lab for lab in invalid.labels if lab.source == "rules")
    cascade = {"rules"} if rules.label is not None else {"rules", "classifier"}
    assert {lab.source for lab in invalid.labels} == {*cascade, "judge:x@r1"}


def test_to_pandas_has_the_export_columns(fake_run):
    pd = pytest.importorskip("pandas")
    frame = fake_run.to_pandas()
    # the export's columns, then every label source's label and probability
    assert list(frame.columns)[:len(COLUMNS)] == list(COLUMNS) and len(frame) == 9
    assert {"label_rules", "probability_rules", "label_judge_x_r1"} <= set(frame.columns)
    assert isinstance(frame, pd.DataFrame) and set(frame["status"]) == {"follow_up"}


def test_summary_frame_is_summary_csv_column_for_column(fake_run, tmp_path):
    pd = pytest.importorskip("pandas")
    import numpy as np

    from userturn.report import export_tables

    store = RunStore.open(fake_run.folder)  # people labelled the greedy turns: human columns
    store.put_labels([LabelRow(t.key, "h", Label("follow_up", "human:ann"))
                      for t in read_turns(store) if t.temperature == 0])
    store.close()
    labels = ["judge:x@r1", "rules"]
    export_tables(fake_run.report(labels), tmp_path / "tables")
    written = pd.read_csv(tmp_path / "tables" / "summary.csv")
    frame = fake_run.summary_frame(labels)
    assert list(frame.columns) == list(written.columns) and len(frame) == len(written) == 2
    for name in written.columns:
        ours, theirs = frame[name], written[name]
        if pd.api.types.is_numeric_dtype(theirs):  # numbers, and columns with nothing in them
            assert pd.api.types.is_numeric_dtype(ours), name
            np.testing.assert_allclose(ours.astype(float), theirs.astype(float), equal_nan=True,
                                       err_msg=name)
        else:
            assert ours.fillna("").tolist() == theirs.fillna("").tolist(), name
    # No Rate objects, no mixed columns: text where summary.csv has text, numbers elsewhere.
    text = [name for name in frame.columns if not pd.api.types.is_numeric_dtype(frame[name])]
    assert text == ["model", "arm", "user_variant", "enable_thinking", "answerer", "dataset",
                    "perturbation", "correction_note"]
    assert all(pd.api.types.is_string_dtype(frame[name]) for name in text)
    assert {name: str(frame[name].dtype) for name in ("temperature", "follow_up", "items",
                                                      "follow_up_hits", "human_labels")} == {
        "temperature": "float64", "follow_up": "float64", "items": "int64",
        "follow_up_hits": "int64", "human_labels": "int64"}
    # A notebook's first question, answered from the frame as from summary.csv.
    assert frame.groupby("temperature")["follow_up"].mean().tolist() == \
        written.groupby("temperature")["follow_up"].mean().tolist()


def test_frames_are_the_reports_tables_with_numeric_columns(fake_run, tmp_path):
    pd = pytest.importorskip("pandas")
    from userturn.report import export_tables

    frames = fake_run.frames()
    written = {path.stem for path in export_tables(fake_run.report(), tmp_path / "t")
               if path.suffix == ".csv"}
    assert set(frames) == written - {"user_turns"}  # the turns themselves: to_pandas()
    labels = frames["labels"]
    assert list(labels.columns) == ["model", "arm", "user_variant", "enable_thinking", "answerer",
                                    "dataset", "perturbation", "temperature", "label", "count"]
    assert str(labels["count"].dtype) == "int64" and labels["count"].sum() == 9
    assert isinstance(frames["summary"], pd.DataFrame)


def test_to_polars_says_how_to_get_polars_when_missing(fake_run):
    try:
        import polars  # noqa: F401
    except ImportError:
        with pytest.raises(userturn.UserturnError, match="pip install polars"):
            fake_run.to_polars()
    else:
        assert fake_run.to_polars().columns == list(fake_run.to_pandas().columns)


def test_classify_takes_cases_turns_and_dicts(fake_run):
    turn = fake_run.turns()[0]
    labels = userturn.classify([turn, turn.case(), {"query": "q", "answer": "a",
                                                    "user_turn": ""}])
    assert [label.label for label in labels] == ["follow_up", "follow_up", "empty"]
    with pytest.raises(ConfigError, match="missing: user_turn"):
        userturn.classify([{"query": "q", "answer": "a"}])
    with pytest.raises(ConfigError, match="unknown labeller"):
        userturn.classify([turn], labeller="oracle")


def test_classify_takes_every_labeller_of_the_cli(fake_run, tmp_path):
    from userturn.labels.classifier import MODEL_FILE, LearnedClassifier

    turn = fake_run.turns()[0]  # a turn the fake model wrote: the rules call it a follow-up
    (rules,) = userturn.classify([turn], "rules")
    (learned,) = userturn.classify([turn], "classifier")
    (cascade,) = userturn.classify([turn], "cascade")
    assert (rules.label, rules.source) == ("follow_up", "rules")
    assert learned == LearnedClassifier().classify(turn.case())
    assert learned.source == "classifier" and 0 < learned.probability <= 1
    assert cascade == rules  # the rules decide: the cascade keeps their label
    unsure = {"query": turn.query, "answer": turn.answer,
              "user_turn": "Let me think about this more."}
    (undecided,) = userturn.classify([unsure], "rules")
    (fallback,) = userturn.classify([unsure], "cascade", classifier=MODEL_FILE)
    assert undecided.label is None
    assert fallback == LearnedClassifier(path=MODEL_FILE).classify(Case(
        turn.query, turn.answer, unsure["user_turn"], unsure["user_turn"]), undecided)
    # the tests' default parameters are the shipped form-only set: named as such when given
    assert fallback.source == "classifier:form" and fallback.label is not None
    with pytest.raises(UserturnError, match="no classifier parameters"):
        userturn.classify([turn], "classifier", classifier=tmp_path / "none.npz")


def test_render_user_turn_opens_a_user_turn():
    prompt = userturn.render_user_turn("fake/probe", [{"role": "user", "content": "2+2?"},
                                                      {"role": "assistant", "content": "4"}])
    assert prompt.text.endswith("4<|im_end|>\n<|im_start|>user\n")
    assert "<|im_end|>" in prompt.stop


def test_the_example_prints_the_numbers_of_userturn_report(fake_run, capsys):
    """examples/api_tour.py on a run gives the rates `userturn report` prints for it."""
    labels = "judge:x@r1"
    assert main(["report", str(fake_run.folder), "--labels", labels]) == 0
    table = [line for line in capsys.readouterr().out.splitlines()
             if "fake/probe" in line and "%" in line]  # the rate table's rows
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    tour = subprocess.run([sys.executable, str(ROOT / "examples" / "api_tour.py"),
                           str(fake_run.folder), labels], capture_output=True, text=True,
                          env=env, timeout=120, check=True).stdout
    printed = [line for line in tour.splitlines() if " follow-up " in line]
    assert len(printed) == len(table) == 2
    for row, line in zip(table, printed):
        cells = [cell.strip() for cell in row.split("│")]
        rate, undecided, label_errors, errors = cells[6], cells[7], cells[8], cells[9]
        assert f"follow-up {rate} " in line
        assert f"undecided={undecided} label_errors={label_errors} errors={errors}" in line
    assert "follow-up rate recomputed from the DataFrame" in tour or "pip install" in tour


def test_the_example_probes_with_no_warning_from_a_dependency_and_rich_bars_only(tmp_path):
    """examples/api_tour.py as a notebook runs it: probing a model (the default dataset imports
    reasoning-gym, and through it cellpylib), compiled afresh as on a first import, shows no
    warning from any dependency, and its progress is userturn's bars alone."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")}  # every module compiled afresh
    tour = subprocess.run([sys.executable, str(ROOT / "examples" / "api_tour.py"), "--model",
                           "fake/probe", "--labeller", "rules"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300, check=True)
    assert "Warning" not in tour.stderr and "site-packages" not in tour.stderr, tour.stderr
    assert "fake/probe · gsm_symbolic · user turns" in tour.stderr  # the run's own bars
    assert "it/s]" not in tour.stderr  # and no tqdm bar beside them
    assert "summary_frame():" in tour.stdout
    assert len([line for line in tour.stdout.splitlines() if " follow-up " in line]) == 2
