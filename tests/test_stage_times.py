"""Where a run's time went: every run stores, stage by stage, wall seconds, what it did and the
tokens it generated; `userturn run` and `userturn report` print them and the HTML report shows
them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from userturn.cli.main import main
from userturn.probe.timing import StageClock
from userturn.store.database import RunStore
from userturn.store.meta import StageTime


def run_args(out: Path) -> list[str]:
    return ["run", "--model", "fake/probe", "--dataset", "gsm_symbolic", "--limit", "3",
            "--temperatures", "0,1", "--samples", "2", "--labeller", "rules", "-o", str(out)]


def stored_tokens(folder: Path, role: str) -> tuple[int, int]:
    """(generations, completion tokens) the run folder holds for ``role``, read raw."""
    with sqlite3.connect(folder / "userturn.db") as db:
        count, tokens = db.execute("SELECT COUNT(*), SUM(completion_tokens) FROM generations "
                                   "WHERE role = ?", (role,)).fetchone()
    return count, tokens


def test_a_run_stores_and_prints_each_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    out = tmp_path / "run"
    assert main(run_args(out)) == 0
    printed = capsys.readouterr().out
    store = RunStore.read(out)
    stages = {s.stage: s for s in store.meta().stages}
    store.close()
    assert list(stages) == ["model load", "answers", "user turns", "labelling"]
    answers, user_turns = stored_tokens(out, "assistant"), stored_tokens(out, "user")
    assert (stages["answers"].count, stages["answers"].tokens) == answers
    assert (stages["user turns"].count, stages["user turns"].tokens) == user_turns
    assert user_turns[0] == 3 * (1 + 2) and user_turns[1] > 0
    assert stages["labelling"].unit == "labels" and stages["labelling"].count == user_turns[0]
    assert stages["labelling"].tokens is None  # labelling generates nothing
    assert all(s.seconds > 0 for s in stages.values())
    assert "time by stage: model load:" in " ".join(printed.split())
    assert stages["user turns"].line() in " ".join(printed.split())

    # `userturn report` prints them again, and the HTML report shows them.
    assert main(["report", str(out), "--html"]) == 0
    assert stages["answers"].line() in " ".join(capsys.readouterr().out.split())
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "Time by stage" in html and stages["user turns"].line() in html


def test_a_run_run_again_keeps_what_its_generating_run_measured(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    out = tmp_path / "run"
    assert main(run_args(out)) == 0
    first = {s.stage: s for s in RunStore.read(out).meta().stages}
    assert main(run_args(out)) == 0  # everything is stored: nothing is generated again
    again = {s.stage: s for s in RunStore.read(out).meta().stages}
    assert list(again) == list(first)
    for stage in ("answers", "user turns", "labelling"):  # nothing done twice, nothing lost
        assert (again[stage].count, again[stage].tokens) == (first[stage].count,
                                                             first[stage].tokens)
        assert first[stage].seconds <= again[stage].seconds < first[stage].seconds + 1.0
    assert main(["report", str(out)]) == 0
    assert again["user turns"].line() in " ".join(capsys.readouterr().out.split())


def test_a_finished_run_run_again_never_loads_the_weights(tmp_path: Path, monkeypatch) -> None:
    """The transformers backend loads its tokenizer (the template, the keys) at once and its
    weights on first use: a re-run that generates nothing never loads them, and a run that does
    counts their load as its model load, not as its answers' time."""
    out = tmp_path / "run"
    tiny = ["run", "--model", "tiny", "--limit", "1", "--samples", "1", "--max-tokens", "4",
            "--user-max-tokens", "4", "--labeller", "rules", "-o", str(out)]
    assert main(tiny) == 0
    first = {s.stage: s for s in RunStore.read(out).meta().stages}
    import transformers

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the weights were loaded for a run with nothing to generate")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    assert main(tiny) == 0
    again = {s.stage: s for s in RunStore.read(out).meta().stages}
    assert (again["user turns"].count, again["answers"].count) == (
        first["user turns"].count, first["answers"].count) == (2, 1)


def test_a_stage_that_runs_once_per_dataset_adds_up(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    ticks = iter([0.0, 2.0, 10.0, 13.0, 20.0, 21.5])
    clock = StageClock(store, clock=lambda: next(ticks))
    for tokens in (100, 50):
        with clock.generating("answers"):
            store.tally.count("generation", None, tokens)
            store.tally.count("generation", "a failure", 0)
    clock.timed("labelling", "labels", lambda: 4)
    stored = store.meta().stages
    store.close()
    assert stored == [StageTime(stage="answers", seconds=5.0, count=4, unit="generations",
                                tokens=150),
                      StageTime(stage="labelling", seconds=1.5, count=4, unit="labels")]
    assert stored[0].line() == ("answers: 5.00 s, 4 generations (0.80 generations/s), 150 "
                                "tokens (30.0 tokens/s)")
    assert stored[1].line() == "labelling: 1.50 s, 4 labels (2.67 labels/s)"
    assert StageTime(stage="model load", seconds=3.0, count=1, unit="models").line() == \
        "model load: 3.00 s, 1 models"
