"""A run, and the shipped corpus, as Hugging Face dataset folders: opened by `datasets` itself
(load_from_disk and the Parquet loader), with a card whose YAML the hub can read."""

from __future__ import annotations

import sys

import pytest
from helpers import fake_probe_run

import userturn
from userturn.cli.main import main
from userturn.integrations.hf import read_card
from userturn.labels.corpus import corpus_examples

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    return fake_probe_run(folder)


def test_the_run_folder_opens_in_datasets_with_every_turn_and_label(fake_run, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(fake_run.folder), "--format", "hf", "--out", str(out)]) == 0
    assert "wrote 9 user turns" in capsys.readouterr().out
    turns = fake_run.turns()
    loaded = datasets.load_from_disk(str(out))
    assert loaded.num_rows == len(turns) == 9
    assert loaded["key"] == [t.key for t in turns]
    assert loaded["user_turn"] == [t.user_turn for t in turns]
    assert loaded["label"] == [t.label for t in turns]
    first = loaded[0]
    assert {lab["source"] for lab in first["labels"]} == {lab.source for lab in turns[0].labels}
    assert first["messages"][-1]["content"] == turns[0].query
    parquet = datasets.load_dataset("parquet", data_dir=str(out / "data"))
    assert parquet["train"]["key"] == loaded["key"]


def test_the_card_says_sources_licences_labellers_rates_and_version(fake_run, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", str(fake_run.folder), "--format", "hf", "-o", str(out)]) == 0
    card = read_card(out / "README.md")
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
    assert card["configs"][0]["data_files"][0]["path"] == "data/*.parquet"


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
    loaded = datasets.load_from_disk(str(out))
    for split in ("train", "dev", "test"):
        examples = corpus_examples(split)
        assert loaded[split].num_rows == len(examples)
        assert sorted(loaded[split]["label"]) == sorted(ex.label for ex in examples)
    card = read_card(out / "README.md")
    assert card["license"] == "apache-2.0"
    counts = card["userturn"]["labels"]
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
