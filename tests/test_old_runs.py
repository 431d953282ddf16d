"""A run folder written before the redesign still opens and reports the same tables.

``fixtures/runs/before-redesign`` was written by ``userturn run`` before the stage packages, typed
run metadata and the one read path; ``before-redesign.report.txt`` is what ``userturn report``
printed for it then. A change to the store, the metadata or the read path that misreads an older
run shows up here as a changed table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from userturn import load_run
from userturn.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures" / "runs"


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    folder = tmp_path / "before-redesign"
    shutil.copytree(FIXTURES / "before-redesign", folder)  # the run is opened writable
    return folder


def test_report_of_an_old_run_prints_what_it_printed_then(old_run, capsys):
    assert main(["report", str(old_run)]) == 0
    out = capsys.readouterr().out
    expected = (FIXTURES / "before-redesign.report.txt").read_text(encoding="utf-8")
    # Since then a rate from offline labels alone carries the labeller's measured error (the
    # old run has no human labels): that note is new, every table and line before is as then.
    lines = out.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("offline labels only"))
    end = next(i for i in range(start, len(lines)) if "--scope uncertain" in lines[i])
    assert "".join(lines[:start] + lines[end + 1:]) == expected


def test_load_run_opens_an_old_run(old_run):
    run = load_run(old_run)
    turns = run.turns()
    assert len(turns) == 36
    assert run.label_sources() == ["rules", "classifier"]
    # The variant, a name suffix in the folder, is read as a typed field beside the model;
    # the tables still print the name (turn.probed).
    assert {(turn.model, turn.user_variant, turn.enable_thinking) for turn in turns} == {
        ("tiny", "native", "default"), ("tiny", "prefill:So", "default")}
    assert {turn.probed for turn in turns} == {"tiny", "tiny[user=prefill:So]"}
    assert sum(turn.label == "empty" for turn in turns) == 33
    assert run.meta.config["models"] == ["tiny"]
    assert run.meta.labeller == "cascade" and run.meta.finished_now
    assert len(run.answers()) == 3


def test_an_old_run_resumes_with_no_model_call_and_the_same_tables(old_run, capsys,
                                                                   monkeypatch):
    """Re-running the experiment the old folder holds (the tiny model, native and one
    user-turn variant, greedy and T=1) under this release's arms and typed keys finds every
    generation stored: the weights never load, nothing is generated, and the tables are those
    the folder printed before the re-run. (Labelled first with this release's labellers, as
    the re-run labels it: the rules have learned since the folder was written.)"""
    import transformers

    from userturn.store.database import RunStore

    def tables() -> str:
        assert main(["report", str(old_run)]) == 0
        return "".join(line for line in capsys.readouterr().out.splitlines(keepends=True)
                       if not line.startswith("time by stage"))  # the re-run adds its times

    assert main(["label", str(old_run)]) == 0
    capsys.readouterr()
    before = tables()
    texts = {key: row.generation.text for key, row in RunStore.read(old_run).generations(
        [row.key for row in RunStore.read(old_run).plan_rows("user")]).items()}

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the weights were loaded for a run with nothing to generate")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    assert main(["run", "--model", "tiny", "--limit", "3", "--samples", "2",
                 "--perturbation", "truncate:0.5", "--user-turn-variant", "prefill:So",
                 "--output", str(old_run)]) == 0
    capsys.readouterr()
    store = RunStore.read(old_run)
    plan = store.plan_rows("user")
    assert len(plan) == 36 and {row.arm for row in plan} == {"opened"}
    stored = store.generations([row.key for row in plan])
    assert {key: row.generation.text for key, row in stored.items()} == texts
    assert tables() == before
