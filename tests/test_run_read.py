"""A run is read once per command: ``report``, ``compare`` and ``label`` each read a run's turns
once (a labelling command then re-reads only the labels it wrote), and what they show equals a
fresh read. The run's stored experiment comes back typed from its metadata."""

from __future__ import annotations

import shutil
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from helpers import experiment, grounded_script, run_cli

from userturn.backends.fake import ScriptedBackend
from userturn.errors import ConfigError
from userturn.labels.plan import LabellingPlan
from userturn.probe.engine import EngineSpec
from userturn.probe.pipeline import run_experiment
from userturn.probe.plan import ProbePlan
from userturn.records import Label, Request
from userturn.report.view import read_run, view_of
from userturn.store.database import RunStore
from userturn.store.meta import RunMeta
from userturn.store.rows import LabelRow
from userturn.store.turns import read_turns
from userturn.store.view import StoredRun, read_stored_run

OLD_RUN = Path(__file__).parent / "fixtures" / "runs" / "before-redesign"


def second_model(request: Request) -> str:
    """Another model: the same answers, a different user turn where the first thanks."""
    text = grounded_script(request)
    return "Why is that the answer?" if text == "Thanks!" else text


def make_run(gsm_file: Path, folder: Path, spec: str, script: Any) -> Path:
    exp = experiment(gsm_file, folder, models=[spec])
    run_experiment(exp, backends={spec: ScriptedBackend(script, spec=spec)}).close()
    return exp.plan.output


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times the store's user turns and labels are read, by what is read."""
    counted: Counter[str] = Counter()
    for name in ("user_turn_rows", "label_rows", "answer_rows"):
        method = getattr(RunStore, name)

        def counting(self: RunStore, *args: Any, _method: Any = method, _name: str = name
                     ) -> Any:
            counted[_name] += 1
            return _method(self, *args)

        monkeypatch.setattr(RunStore, name, counting)
    return counted


def test_report_reads_the_run_once(gsm_file, tmp_path, reads, capsys):
    run = make_run(gsm_file, tmp_path / "a", "fake/a", grounded_script)
    reads.clear()
    code, out, _ = run_cli(capsys, "report", str(run), "--html")
    assert code == 0 and "Genuine follow-up rate" in out
    assert reads == {"user_turn_rows": 1, "label_rows": 1, "answer_rows": 1}


def test_compare_reads_each_run_once(gsm_file, tmp_path, reads, capsys):
    a = make_run(gsm_file, tmp_path / "a", "fake/a", grounded_script)
    b = make_run(gsm_file, tmp_path / "b", "fake/b", second_model)
    reads.clear()
    code, out, _ = run_cli(capsys, "compare", str(a), str(b))
    assert code == 0 and "B minus A" in out
    assert reads == {"user_turn_rows": 2, "label_rows": 2, "answer_rows": 2}


def test_label_reads_the_turns_once_and_the_labels_it_wrote_again(gsm_file, tmp_path, reads,
                                                                  capsys):
    run = make_run(gsm_file, tmp_path / "a", "fake/a", grounded_script)
    with closing(RunStore.open(run)) as store:  # labels of an earlier labeller version
        store.put_labels([LabelRow(t.key, "0", _label(t.label_source, t.label))
                          for t in read_turns(store) if t.label_source == "rules"])
    reads.clear()
    with pytest.warns(UserWarning, match="its rates can move"):  # the classifier left
        code, out, _ = run_cli(capsys, "label", str(run), "--labeller", "rules")
    assert code == 0 and "label(s) added (rules)" in out
    assert reads == {"user_turn_rows": 1, "label_rows": 2, "answer_rows": 1}
    # What it printed is what a fresh read of the relabelled run prints.
    code, again, _ = run_cli(capsys, "report", str(run))
    assert out.split("nothing generated\n", 1)[1] == again


def test_run_reads_the_turns_once_and_prints_what_report_prints(tmp_path, reads, capsys):
    """``userturn run`` labels the turns it read once and prints them with the labels read
    again: the same tables as a ``report`` of the folder afterwards."""
    folder = tmp_path / "run"
    code, out, _ = run_cli(capsys, "run", "--model", "fake/probe", "--dataset", "gsm_symbolic",
                           "--limit", "3", "--samples", "2", "-o", str(folder))
    assert code == 0
    assert reads["user_turn_rows"] == 1 and reads["label_rows"] == 2
    code, again, _ = run_cli(capsys, "report", str(folder))
    assert code == 0
    assert out.split("run stored in")[0] == again


def test_the_annotation_page_reads_the_run_once(gsm_file, tmp_path, reads):
    """Its sample (stratified by the rules), what the page shows of each turn and the
    per-condition plans come from one read of the run."""
    from userturn.labels.annotate import AnnotationServer

    run = make_run(gsm_file, tmp_path / "a", "fake/a", grounded_script)
    reads.clear()
    server = AnnotationServer(run, "ann", size=4)
    try:
        assert len(server.keys) == 4 and set(server.keys) <= set(server.contexts)
        assert reads["user_turn_rows"] == 1
    finally:
        server.stop()


def test_agreement_reads_the_run_once(gsm_file, tmp_path, reads, capsys):
    run = make_run(gsm_file, tmp_path / "a", "fake/a", grounded_script)
    reads.clear()
    code, out, _ = run_cli(capsys, "agreement", str(run))
    assert code == 0 and "no two label sources share labelled turns" in out
    assert reads["user_turn_rows"] == 1


def _label(source: str | None, label: str | None) -> Label:
    return Label(label, source=source or "rules")  # type: ignore[arg-type]


def relabelled_view_summary(run: StoredRun) -> list[Any]:
    return view_of(run).summary()


def test_turns_resolved_again_in_memory_equal_a_fresh_read(gsm_file, tmp_path):
    run = make_run(gsm_file, tmp_path / "a", "fake/a", grounded_script)
    with closing(RunStore.open(run)) as store:
        read = read_stored_run(store)
        assert read.with_sources("classifier").turns == read_turns(store, "classifier")
        assert read.with_sources(["classifier", "rules"]).sources == ["classifier", "rules"]
        assert read.with_sources().turns == read_turns(store)  # none given: the run's own
        # Labels written after the read: the relabelled run is the run read afresh.
        first = read.turns[0]
        store.put_labels([LabelRow(first.key, "v9", _label("human:ann", "generic"))])
        store.update_meta(label_sources=["human:ann", *read.sources])
        relabelled = read.relabelled(store)
        assert relabelled == read_stored_run(store)
        assert relabelled.turns[0].label == "generic"
        assert relabelled.turns[0].label_source == "human:ann"
        assert read_run(store).summary() == relabelled_view_summary(relabelled)


def test_the_stored_experiment_comes_back_typed_from_the_meta(tmp_path):
    folder = tmp_path / "old"
    shutil.copytree(OLD_RUN, folder)
    with closing(RunStore.read(folder)) as store:
        meta = store.meta()
    assert meta.stored(ProbePlan) == ProbePlan.stored(meta.config)
    assert meta.stored(ProbePlan).models == ["tiny"]
    assert meta.stored(EngineSpec) == EngineSpec.stored(meta.config)
    assert meta.stored(LabellingPlan).labeller == "cascade"
    # A stored experiment this version cannot read is one line, not a traceback.
    damaged = RunMeta(config={**meta.config, "temperatures": "hot"})
    with pytest.raises(ConfigError, match="^the run's stored experiment does not read"
                                          r" \(temperatures") as refused:
        damaged.stored(ProbePlan)
    assert "\n" not in str(refused.value)
