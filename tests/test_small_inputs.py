"""The smaller careless inputs: each is one line (exit 2) or does what the user meant."""

from __future__ import annotations

import pytest
from helpers import experiment, undecided_script
from openai_fake import Answer, FakeOpenAI

from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.config import load_experiment
from userturn.errors import ConfigError
from userturn.labels.judge import Judge, OpenAIChatClient
from userturn.labels.judges import judge_from_spec
from userturn.labels.stages import judge_turns
from userturn.probe.pipeline import run_experiment
from userturn.store.database import RunStore


def one_line_error(capsys, code: int, words: str) -> None:
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and words in err, err
    assert "Traceback" not in err


def test_config_faults_are_one_line(tmp_path, capsys):
    one_line_error(capsys, main(["run", str(tmp_path)]), "is a directory, not a config file")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"limit: 3\nsystem_prompt: caf\xe9\n")
    one_line_error(capsys, main(["run", str(bad)]), "is not UTF-8 text (byte 0xe9 at offset 27)")
    twice = tmp_path / "twice.yaml"
    twice.write_text("limit: 3\nsamples: 2\nlimit: 30\n")
    one_line_error(capsys, main(["run", str(twice)]), "duplicate key 'limit' at line 3")
    for url in ("notaurl", "ftp://x/v1", "http://:80/v1", "http://host:port/v1"):
        code = main(["run", "--model", "openai/m", "--base-url", url, "-o", str(tmp_path / "r")])
        one_line_error(capsys, code, "server address")
    with pytest.raises(ConfigError, match="'notaurl' is not an http"):
        judge_from_spec("openai/j", base_url="notaurl")


def test_relative_dataset_paths_are_the_experiment_files(tmp_path, monkeypatch):
    (tmp_path / "exp" / "data").mkdir(parents=True)
    (tmp_path / "exp" / "run.yaml").write_text(
        "datasets: [data/q.jsonl, 'conversations:data/c.jsonl', gsm_symbolic, data/n.ndjson,\n"
        "  'openai/gsm8k:data/g.json', 'mtbench:data/m.jsonl', ifbench]\n")
    monkeypatch.chdir(tmp_path)  # elsewhere than the file
    exp = load_experiment(tmp_path / "exp" / "run.yaml", {})
    folder = (tmp_path / "exp" / "data").resolve()
    assert exp.plan.datasets == [str(folder / "q.jsonl"), f"conversations:{folder / 'c.jsonl'}",
                            "gsm_symbolic", str(folder / "n.ndjson"),
                            f"openai/gsm8k:{folder / 'g.json'}", f"mtbench:{folder / 'm.jsonl'}",
                            "ifbench"]
    flags = load_experiment(None, {"datasets": ["data/q.jsonl"]})
    assert flags.plan.datasets == ["data/q.jsonl"]  # a flag is the shell's: relative to where it runs


def test_report_labels_with_a_typo_is_one_line(gsm_file, tmp_path, capsys):
    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    one_line_error(capsys, main(["report", str(exp.plan.output), "--labels", "judge:typo"]),
                   "--labels: no labels from judge:typo")
    assert main(["report", str(exp.plan.output), "--labels", "rules"]) == 0


class Interrupting:
    """A chat client that answers five verdicts, then the user presses Ctrl-C."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.inner = OpenAIChatClient("j", base_url=fake.url, api_key="")
        self.name, self.calls = self.inner.name, 0

    def chat(self, messages, **options):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls > 5:
            raise KeyboardInterrupt
        return self.inner.chat(messages, **options)


def test_ctrl_c_during_judging_keeps_every_verdict_received(gsm_file, tmp_path):
    exp = experiment(gsm_file, tmp_path)
    store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
    with FakeOpenAI() as fake:
        fake.always(Answer())
        judge = Judge(Interrupting(fake), concurrency=1)
        with pytest.raises(KeyboardInterrupt):
            judge_turns(store, judge, "all", chunk=32)
    kept = {row.key: row.label for row in RunStore.open(exp.plan.output).label_rows()
            if row.source == judge.name}
    assert len(kept) == 5 and set(kept.values()) == {"generic"}
