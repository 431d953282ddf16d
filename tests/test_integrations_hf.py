"""A run, and the shipped corpus, as Hugging Face dataset folders in the hub's layout: opened by
`datasets.load_dataset(folder)` itself, one fixed schema (two runs' exports concatenate), with a
card whose YAML the hub can read and whose text says what every column means."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import experiment, fake_probe_run, run_scripted, undecided_script

import userturn
from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.integrations.hf import CORPUS_COLUMNS, RUN_COLUMNS, features, read_card
from userturn.labels.classifier import FORM_MODEL_FILE
from userturn.labels.corpus import corpus_examples

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    return fake_probe_run(folder)


@pytest.fixture(scope="module")
def cascade_run(tmp_path_factory):
    """Another run: a system prompt, turns the rules leave to the form-only classifier (so
    probabilities and undecided rules labels), where fake_run's every column is decided."""
    folder = tmp_path_factory.mktemp("hf-cascade")
    data = folder / "gsm.jsonl"
    data.write_text("".join(json.dumps({"question": f"Sam has {n} pens and buys 2. How many?",
                                        "answer": f"x\n#### {n + 2}"}) + "\n"
                            for n in range(2)), encoding="utf-8")
    exp = experiment(data, folder, limit=2, classifier=FORM_MODEL_FILE, system_prompt="Be kind.")
    run_scripted(exp, ScriptedBackend(undecided_script)).close()
    return userturn.load_run(exp.plan.output)


def export_hf(run, out):
    assert main(["export", str(run.folder), "--format", "hf", "--out", str(out)]) == 0
    return datasets.load_dataset(str(out))


def test_the_run_folder_opens_in_datasets_with_every_turn_and_label(fake_run, tmp_path, capsys):
    out = tmp_path / "hf"
    loaded = export_hf(fake_run, out)["train"]
    assert "wrote 9 user turns" in capsys.readouterr().out
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "README.md", "data", "data/train-00000-of-00001.parquet"]  # the hub's layout
    turns = fake_run.turns()
    assert loaded.num_rows == len(turns) == 9
    assert loaded["key"] == [t.key for t in turns]
    assert loaded["user_turn"] == [t.user_turn for t in turns]
    assert loaded["label"] == [t.label for t in turns]
    first = loaded[0]
    assert {lab["source"] for lab in first["labels"]} == {lab.source for lab in turns[0].labels}


def test_messages_are_the_conversation_then_the_generated_turn(cascade_run, tmp_path):
    """The same conversation as the Inspect log's messages: system, query, answer, turn."""
    log_module = pytest.importorskip("inspect_ai.log")
    loaded = export_hf(cascade_run, tmp_path / "hf")["train"]
    assert main(["export", str(cascade_run.folder), "-o", str(tmp_path / "run.eval")]) == 0
    samples = {s.id: s for s in log_module.read_eval_log(str(tmp_path / "run.eval")).samples}
    turns = {t.key: t for t in cascade_run.turns()}
    for row in loaded:
        turn = turns[row["key"]]
        assert row["messages"] == [
            {"role": "system", "content": "Be kind."}, {"role": "user", "content": turn.query},
            {"role": "assistant", "content": turn.answer},
            {"role": "user", "content": turn.user_turn}]
        assert [(m.role, m.text) for m in samples[row["key"]].messages] == [
            (m["role"], m["content"]) for m in row["messages"]]


def test_two_runs_exports_concatenate_with_one_fixed_schema(fake_run, cascade_run, tmp_path):
    first = export_hf(fake_run, tmp_path / "a")["train"]
    second = export_hf(cascade_run, tmp_path / "b")["train"]
    # fake_run has no thinking, error, label_error or probability anywhere: still typed
    assert first.features == second.features == features(RUN_COLUMNS)
    both = datasets.concatenate_datasets([first, second])
    assert both.num_rows == first.num_rows + second.num_rows
    probabilities = [lab["probability"] for row in both["labels"] for lab in row]
    assert None in probabilities and any(p is not None for p in probabilities)


def test_the_card_says_sources_licences_labellers_rates_and_version(fake_run, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", str(fake_run.folder), "--format", "hf", "-o", str(out)]) == 0
    card = read_card(out / "README.md")
    text = (out / "README.md").read_text(encoding="utf-8")
    for name, (_, meaning) in RUN_COLUMNS.items():  # every column, with its meaning
        assert f"| `{name}` |" in text and meaning in text
    assert [f["name"] for f in card["dataset_info"]["features"]] == list(RUN_COLUMNS)
    assert card["description"].startswith("User turns written by fake/probe")
    meta = card["userturn"]
    assert meta["version"] == userturn.__version__
    assert [m["name"] for m in meta["models"]] == ["fake/probe"]
    assert meta["models"][0]["license"] == "unknown"  # not a model userturn can vouch for
    assert card["license"] == "unknown"
    # The sources that labelled turns: the rules decide every turn of this run, so the cascade
    # never asked the classifier.
    assert set(meta["label_sources"]) == {lab.source for t in fake_run.turns() for lab in t.labels}
    assert "rules" in meta["label_sources"]
    summary = {(r.temperature, r.perturbation): r for r in fake_run.summary()}
    assert len(meta["rates"]) == len(summary)
    for rate in meta["rates"]:
        row = summary[(rate["temperature"], rate["perturbation"])]
        assert rate["follow_ups"] == row.follow_up.hits and rate["turns"] == row.follow_up.n
        assert rate["ci_low"] == pytest.approx(row.follow_up.low, abs=1e-6)
        assert rate["ci_high"] == pytest.approx(row.follow_up.high, abs=1e-6)
    assert card["configs"][0]["data_files"][0]["path"] == "data/train-*.parquet"


def test_an_existing_folder_is_replaced_only_with_force(fake_run, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert main(["export", str(fake_run.folder), "--format", "hf", "--out", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert (out / "mine.txt").exists()
    assert main(["export", str(fake_run.folder), "--format", "hf", "--out", str(out),
                 "--force"]) == 0
    assert not (out / "mine.txt").exists()


def test_the_corpus_exports_with_its_splits_and_card(tmp_path):
    out = tmp_path / "corpus"
    assert main(["corpus", "export", "-o", str(out)]) == 0
    loaded = datasets.load_dataset(str(out))
    assert sorted(loaded) == ["dev", "test", "train"]  # dev keeps its name
    for split in ("train", "dev", "test"):
        examples = corpus_examples(split)
        assert loaded[split].num_rows == len(examples)
        assert sorted(loaded[split]["label"]) == sorted(ex.label for ex in examples)
        assert loaded[split].features == features(CORPUS_COLUMNS)
    card = read_card(out / "README.md")
    text = (out / "README.md").read_text(encoding="utf-8")
    meta = card["userturn"]
    # every source with its licence: none unknown, and the card's licence is theirs
    licences = {s["license"] for s in [*meta["models"], *meta["datasets"]]}
    assert licences == {"apache-2.0"} and card["license"] == "apache-2.0"
    assert card["description"]
    # no generator named by a path on the machine that made the corpus
    names = [m["name"] for m in meta["models"]]
    assert "llamacpp/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" in names
    assert "work/" not in text and not any("work/" in (m or "") for m in loaded["train"]["model"])
    assert all(f"| `{name}` |" in text for name in CORPUS_COLUMNS)
    counts = meta["labels"]
    assert sum(sum(by.values()) for by in counts.values()) == sum(
        loaded[s].num_rows for s in loaded)


def test_without_datasets_one_line_says_what_to_install(fake_run, tmp_path, capsys,
                                                        monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    assert main(["export", str(fake_run.folder), "--format", "hf", "--out",
                 str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("userturn: error: the Hugging Face dataset export needs datasets: "
                           "pip install 'userturn[hub]'")
    assert not (tmp_path / "hf").exists()
