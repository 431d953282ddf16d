"""The printed rate never moves behind the user's back: a failed verdict is never a label, a
judge that decides says whether it was checked against people, another labeller is another
source, and a resumed run keeps what its generating runs measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openai_fake import Drop, FakeOpenAI

from userturn.api import load_run
from userturn.backends import openai_http
from userturn.cli.main import main

RUN = ["--model", "fake/probe", "--dataset", "gsm_symbolic", "--limit", "3", "--samples", "2"]


def rates(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    """The follow-up cells of the rate table ``report`` prints."""
    assert main(["report", *argv]) == 0
    out = capsys.readouterr().out
    return [cells[6] for cells in (
        [c.strip() for c in line.split("│")] for line in out.splitlines()
        if line.startswith("│ fake/probe"))][:2]


@pytest.fixture
def run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    folder = tmp_path / "run"
    assert main(["run", *RUN, "-o", str(folder)]) == 0
    capsys.readouterr()
    return folder


def test_a_judge_whose_every_verdict_failed_changes_no_rate_and_no_export(run, tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    waits: list[float] = []  # the CLI's client backs off between attempts: recorded, not slept
    monkeypatch.setattr(openai_http, "backoff_wait", waits.append)
    before = rates(capsys, str(run))
    turns_before = {t.key: t.label for t in load_run(run).turns()}
    with FakeOpenAI() as fake:
        fake.always(Drop())
        code = main(["judge", str(run), "--judge", "openai/x", "--base-url", fake.url,
                     "--scope", "all"])
    out, err = capsys.readouterr()
    assert code == 1 and "9 of 9 judge request(s) failed" in err
    assert waits and max(waits) <= 60.0  # it retried, each wait within the backoff's bound
    assert "a failed verdict is never a label" in out
    assert rates(capsys, str(run)) == before
    turns = load_run(run).turns()
    assert {t.key: t.label for t in turns} == turns_before  # every label where it was
    # a judge that never once succeeded decides nothing: the run's sources stay as they were
    assert load_run(run).label_sources() == ["rules", "classifier"]
    assert "now labelled by" not in err
    # read with the judge first, every failed verdict is a label error, never a label
    (greedy, sampled) = load_run(run).summary(["judge:openai/x@rubric1", "rules", "classifier"])
    assert (greedy.label_errors, sampled.label_errors) == (3, 6)
    assert (greedy.undecided, sampled.undecided) == (0, 0)
    assert rates(capsys, str(run), "--labels", "judge:openai/x@rubric1,rules") == before
    # the exports read the same labels: none is empty, no sample is scored invalid
    assert main(["export", str(run), "--format", "hf", "-o", str(tmp_path / "hf")]) == 0
    pq = pytest.importorskip("pyarrow.parquet")
    (part,) = (tmp_path / "hf" / "data").glob("train-*.parquet")
    rows = pq.read_table(part).to_pylist()
    assert {row["key"]: row["label"] for row in rows} == turns_before
    assert main(["export", str(run), "--format", "inspect", "-o", str(tmp_path / "x.eval")]) == 0
    from inspect_ai.log import read_eval_log

    samples = read_eval_log(str(tmp_path / "x.eval")).samples or []
    assert len(samples) == 9
    assert {s.scores["user_turn_label"].value for s in samples} == set(turns_before.values())


def test_failed_verdicts_under_labels_chosen_by_hand_are_undecided_in_table_and_footer(
        run, capsys):
    from userturn.records import Label
    from userturn.store.database import RunStore
    from userturn.store.rows import LabelRow

    store = RunStore.open(run)
    keys = [t.key for t in load_run(run).turns()]
    store.put_labels([LabelRow(key, "r1", Label(None, "judge:x@r1", error="HTTP 401"))
                      for key in keys])
    store.close()
    assert main(["report", str(run), "--labels", "judge:x@r1"]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.split("│")] for line in out.splitlines()
            if line.startswith("│ fake/probe")][:2]
    # 0% of every turn (undecided: a lower bound), not a rate over the turns a judge got right
    assert [(r[5], r[6][:2], r[7], r[8]) for r in rows] == [("3", "0%", "3", "3"),
                                                             ("6", "0%", "6", "6")]
    assert re.search(r"labelled by nobody \(undecided\) 9\b", " ".join(out.split()))


def test_another_classifier_is_another_source_and_relabelling_says_so(run, capsys):
    before = load_run(run).turns()
    assert {t.label_source for t in before} <= {"rules", "classifier"}
    with pytest.warns(UserWarning) as said:
        assert main(["run", *RUN, "-o", str(run), "--classifier", "form"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    (warning,) = [str(w.message) for w in said if "now labelled by" in str(w.message)]
    # the fake model's turns are all clear cases: the rules labelled them, no classifier did
    assert warning == (f"{run} was labelled by rules, then classifier; it is now labelled by "
                       "rules, then classifier:form, so its rates can move (the earlier labels "
                       f"stay stored: `userturn report {run} --labels rules` shows them)")
    run_view = load_run(run)
    assert run_view.label_sources() == ["rules", "classifier:form"]
    # the note quotes the form classifier's own measured figures, not the shipped default's
    assert "offline labels only (rules and classifier:form):" in out
    assert "people (ShareGPT)" not in out  # measured for the shipped default only
    assert main(["report", str(run), "--labels", "rules"]) == 0
    capsys.readouterr()


def test_a_users_classifier_file_is_named_by_its_file_and_parameters(tmp_path):
    from userturn.labels.classifier import FORM_MODEL_FILE, LinearModel, source_name

    mine = tmp_path / "mine.npz"
    mine.write_bytes(FORM_MODEL_FILE.read_bytes())
    digest = LinearModel.load(mine).fingerprint()[:8]
    assert source_name(mine) == f"classifier:mine-{digest}"
    assert source_name(None) == "classifier" and source_name("form") == "classifier:form"


def test_a_rate_a_judge_decides_says_the_judge_was_not_checked_against_people(run, capsys,
                                                                              monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    before = capsys.readouterr()
    with FakeOpenAI() as fake:
        fake.verdict = lambda messages: {"label": "generic", "rationale": "scripted"}
        assert main(["judge", str(run), "--judge", "openai/x", "--base-url", fake.url,
                     "--scope", "all"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("judge:openai/x@rubric1 decides turns of these rates (fake/probe gsm_symbolic "
            "T=greedy: 3 of 3; fake/probe gsm_symbolic T=1: 6 of 6) and was not checked against "
            "people") in out
    assert "offline labels" not in out  # no rate rests on the offline labeller now
    assert before is not None
