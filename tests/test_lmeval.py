"""The user-turn pass as an lm-evaluation-harness task, and its samples back into a run.

Offline: the task folder's shape, and the importer on samples written in lm-eval's
--log_samples format (and its refusals). Marked ``lmeval``: the round trip on the real harness
(.venv-lmeval, `make lmeval`), its HF backend on the embedded SmolLM2, greedy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import fake_probe_run

import userturn
from userturn.cli.main import main
from userturn.integrations.lmeval import MANIFEST

ROOT = Path(__file__).resolve().parents[1]
LM_EVAL = Path(os.environ.get("USERTURN_LMEVAL", ROOT / ".venv-lmeval" / "bin" / "lm-eval"))


class TaskLoader(yaml.SafeLoader):
    """lm-eval's task YAML tag ``!function module.name`` read as its text."""


TaskLoader.add_constructor("!function", lambda loader, node: f"!function {node.value}")


def task_configs(folder: Path) -> dict[str, dict]:
    return {path.stem: yaml.load(path.read_text(), Loader=TaskLoader)  # noqa: S506
            for path in sorted(folder.glob("*.yaml"))}


def read_docs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lmeval")
    return fake_probe_run(folder, temperatures=[0.0, 0.7], top_p=0.9, user_max_tokens=40,
                          perturbations=["truncate"])


@pytest.fixture(scope="module")
def task_dir(fake_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("task") / "task"
    assert main(["export-task", str(fake_run.folder), "--harness", "lm-eval", "-o",
                 str(out)]) == 0
    return out


def lm_eval_samples(task_dir: Path, out: Path, response=lambda doc, turn: turn.user_turn,
                    run=None, edit=lambda record: record,
                    ran: tuple | None = ("hf", "pretrained=fake/probe,dtype=float32")
                    ) -> list[Path]:
    """Samples files as lm-eval writes them with --log_samples (lm_eval/loggers/
    evaluation_tracker.py): one record per document, the arguments flattened to
    gen_args_0.arg_0 (the context sent) and arg_1 (the generation settings, the tokenizer's
    end-of-sequence text added to until), resps the generated texts; beside them the run's
    results file with the model and model_args lm-eval ran (``ran``; None: no results file)."""
    if ran is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results_2026-01-01T00-00-00.json").write_text(json.dumps(
            {"results": {}, "config": {"model": ran[0], "model_args": ran[1]},
             "lm_eval_version": "0.4.13"}), encoding="utf-8")
    turns = {t.key: t for t in (run.turns() if run else [])}
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name, config in task_configs(task_dir).items():
        settings = dict(config["generation_kwargs"])
        settings["until"] = [*settings["until"], "<|endoftext|>"]
        records = []
        for index, doc in enumerate(read_docs(task_dir / f"{name}.jsonl")):
            text = response(doc, turns.get(doc["key"]))
            records.append(edit({
                "doc_id": index, "doc": doc, "target": "",
                "arguments": {"gen_args_0": {"arg_0": doc["prompt"], "arg_1": settings}},
                "resps": [[text]], "filtered_resps": [text], "filter": "none",
                "metrics": ["exact_match"], "exact_match": float(text == "")}))
        path = out / f"samples_{name}_2026-01-01T00-00-00.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        files.append(path)
    return files


def test_one_document_per_user_turn_with_the_stored_prompt_and_settings(fake_run, task_dir):
    turns = {t.key: t for t in fake_run.turns()}
    configs = task_configs(task_dir)
    assert sorted(configs) == ["userturn_fake_probe_t0", "userturn_fake_probe_t0_7"]
    docs = {}
    for name, config in configs.items():
        assert config["task"] == name and config["tag"] == ["userturn_fake_probe"]
        assert config["custom_dataset"] == "!function userturn_docs.load"
        assert config["output_type"] == "generate_until" and config["doc_to_text"] == "prompt"
        assert config["num_fewshot"] == 0 and config["target_delimiter"] == ""
        for doc in read_docs(task_dir / config["dataset_kwargs"]["docs"]):
            turn = turns[doc["key"]]
            assert doc["prompt"] == turn.prompt  # exactly what the run generated from
            settings = config["generation_kwargs"]
            assert settings["max_gen_toks"] == 40
            assert settings["until"] == ["<|im_end|>", "<|im_start|>assistant"]
            assert settings["temperature"] == turn.temperature
            if turn.temperature == 0:
                assert settings["do_sample"] is False and "top_p" not in settings
            else:
                assert settings["do_sample"] is True and settings["top_p"] == 0.9
            docs[doc["key"]] = doc
    assert set(docs) == set(turns)  # one document per (item, condition, sample)
    assert {(d["perturbation"], d["temperature"]) for d in docs.values()} == {
        ("none", 0.0), ("none", 0.7), ("truncate", 0.0), ("truncate", 0.7)}
    manifest = json.loads((task_dir / MANIFEST).read_text())
    assert sum(task["docs"] for task in manifest["tasks"]) == len(turns)
    assert "lm-eval run --model hf" in (task_dir / "README.md").read_text()


def test_the_docs_loader_works_from_a_moved_folder(task_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    moved = tmp_path / "elsewhere"
    shutil.copytree(task_dir, moved)
    loader = {"__file__": str(moved / "userturn_docs.py")}
    exec((moved / "userturn_docs.py").read_text(), loader)
    loaded = loader["load"]("userturn_fake_probe_t0.jsonl", version=1)
    assert isinstance(loaded, datasets.DatasetDict)
    assert loaded["test"]["prompt"] == [d["prompt"] for d in read_docs(
        moved / "userturn_fake_probe_t0.jsonl")]


def test_imported_samples_are_a_run_with_the_same_keys_turns_and_tables(fake_run, task_dir,
                                                                        tmp_path, capsys):
    # lm-eval keeps whitespace around the text; userturn's backends strip it.
    files = lm_eval_samples(task_dir, tmp_path / "out",
                            response=lambda doc, turn: f" {turn.user_turn}\n", run=fake_run)
    imported = tmp_path / "imported"
    assert main(["import", "--from", "lm-eval", str(tmp_path / "out"), "-o",
                 str(imported)]) == 0
    assert f"imported {len(fake_run.turns())} user turns from {len(files)} file(s)" in \
        capsys.readouterr().out
    run = userturn.load_run(imported)
    original = {t.key: t for t in fake_run.turns()}
    again = {t.key: t for t in run.turns()}
    assert set(again) == set(original)
    for key, turn in again.items():
        before = original[key]
        for field in ("model", "dataset", "item_id", "context", "perturbation", "temperature",
                      "sample_index", "answerer", "query", "answer", "answer_correct",
                      "user_turn", "prompt", "label", "label_source"):
            assert getattr(turn, field) == getattr(before, field), field
    assert [(a.key, a.correct, a.text) for a in run.answers()] == [
        (a.key, a.correct, a.text) for a in fake_run.answers()]
    assert [(r.follow_up.hits, r.follow_up.n) for r in run.summary()] == [
        (r.follow_up.hits, r.follow_up.n) for r in fake_run.summary()]
    imported_from = (run.meta.model_extra or {})["imported_from"]
    assert imported_from["harness"] == "lm-eval"
    assert [(m["model"], m["model_args"]) for m in imported_from["lm_eval"]] == [
        ("hf", "pretrained=fake/probe,dtype=float32")]
    assert imported_from["model_mismatch_allowed"] is False
    assert main(["report", str(imported)]) == 0
    assert main(["compare", str(fake_run.folder), str(imported)]) == 0


def _edit_doc(record, **changes):
    payload = json.loads(record["doc"]["userturn"])
    payload.update(changes)
    record["doc"]["userturn"] = json.dumps(payload)
    return record


def _chat_wrapped(record):
    record["arguments"]["gen_args_0"]["arg_0"] = "<|im_start|>user\n" + record["doc"]["prompt"]
    return record


def _longer_budget(record):
    record["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"] = 256
    return record


def _repeats(record):
    record["resps"] = [["a", "b"]]
    return record


def _changed_prompt(record):
    payload = json.loads(record["doc"]["userturn"])
    payload["request"]["prompt"] += " "
    record["doc"]["userturn"] = json.dumps(payload)
    return record


def _plan_with_unknown_field(record):
    payload = json.loads(record["doc"]["userturn"])
    payload["plan"]["colour"] = "red"
    record["doc"]["userturn"] = json.dumps(payload)
    return record


def _versions_not_text(record):
    payload = json.loads(record["doc"]["userturn"])
    payload["run"]["versions"] = {"userturn": 3}
    record["doc"]["userturn"] = json.dumps(payload)
    return record


@pytest.mark.parametrize("edit, message", [
    (_chat_wrapped, "lm-eval sent another prompt than the exported one"),
    (_longer_budget, "generated with max_gen_toks=256, exported with 40"),
    (_repeats, "2 generations for one document (repeats)"),
    (_changed_prompt, "the document was changed after export"),
    (lambda r: _edit_doc(r, format="userturn-lm-eval/0"), "a userturn task of format "
     "'userturn-lm-eval/0'; this userturn reads 'userturn-lm-eval/1'"),
    (lambda r: {**r, "doc": {k: v for k, v in r["doc"].items() if k != "userturn"}},
     "not a document of a userturn task"),
    (lambda r: {k: v for k, v in r.items() if k != "resps"},
     "not an lm-eval --log_samples record"),
    (_plan_with_unknown_field, "the document's userturn field is damaged"),
    (_versions_not_text, "the exported run's metadata is damaged (versions.userturn:"),
])
def test_a_mismatched_sample_is_refused_in_one_line(fake_run, task_dir, tmp_path, capsys,
                                                    edit, message):
    lm_eval_samples(task_dir, tmp_path / "out", run=fake_run, edit=edit)
    imported = tmp_path / "imported"
    assert main(["import", "--from", "lm-eval", str(tmp_path / "out"), "-o",
                 str(imported)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("userturn: error: ") and message in err
    assert not imported.exists()  # refused before anything is written


def test_bad_files_and_folders_are_refused_in_one_line(fake_run, task_dir, tmp_path, capsys):
    cases = []
    not_json = tmp_path / "samples_x.jsonl"
    not_json.write_text("{oops\n")
    cases.append(([str(not_json)], "not JSON"))
    cases.append(([str(tmp_path / "missing.jsonl")], "no such file or folder"))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append(([str(empty)], "no lm-eval samples_*.jsonl files in it"))
    files = lm_eval_samples(task_dir, tmp_path / "twice", run=fake_run)
    cases.append(([str(files[0]), str(files[0])], "(a task's samples given twice?)"))
    for paths, message in cases:
        assert main(["import", "--from", "lm-eval", *paths, "-o", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    assert main(["import", "--from", "lm-eval", str(files[0]), "-o", str(existing)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_samples_of_two_exports_are_not_mixed(fake_run, task_dir, tmp_path, capsys):
    other = tmp_path / "other-task"
    assert main(["export-task", str(fake_run.folder), "-o", str(other)]) == 0
    manifest = json.loads((other / MANIFEST).read_text())
    assert manifest["export"] == json.loads((task_dir / MANIFEST).read_text())["export"]
    a = lm_eval_samples(task_dir, tmp_path / "a", run=fake_run)
    b = lm_eval_samples(task_dir, tmp_path / "b", run=fake_run, edit=lambda r: _edit_doc(
        r, run={**json.loads(r["doc"]["userturn"])["run"], "export": "0" * 16}))
    assert main(["import", "--from", "lm-eval", str(a[0]), str(b[1]), "-o",
                 str(tmp_path / "run")]) == 2
    assert "different userturn exports" in capsys.readouterr().err


def test_a_run_without_user_turns_and_a_missing_source_are_one_line(tmp_path, capsys):
    assert main(["export-task", str(tmp_path / "nothing"), "-o", str(tmp_path / "t")]) == 2
    assert "no such run folder or experiment file" in capsys.readouterr().err
    (tmp_path / "folder").mkdir()
    assert main(["export-task", str(tmp_path / "folder"), "-o", str(tmp_path / "t")]) == 2
    assert "is not a userturn run folder" in capsys.readouterr().err


@pytest.mark.parametrize("ran, message", [
    (("dummy", ""), "lm-eval ran --model dummy --model_args (none), not the run's model "
     "fake/probe"),
    (("hf", "pretrained=HuggingFaceTB/SmolLM2-135M-Instruct"), "not the run's model"),
    (None, "no lm-eval results_*.json beside it"),
])
def test_turns_of_another_model_are_refused_unless_allowed(fake_run, task_dir, tmp_path,
                                                           capsys, ran, message):
    lm_eval_samples(task_dir, tmp_path / "out", run=fake_run, ran=ran,
                    response=lambda doc, turn: "lol")
    imported = tmp_path / "imported"
    assert main(["import", "--from", "lm-eval", str(tmp_path / "out"), "-o",
                 str(imported)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "--allow-model-mismatch" in err, err
    assert not imported.exists()
    assert main(["import", "--from", "lm-eval", str(tmp_path / "out"), "-o", str(imported),
                 "--allow-model-mismatch"]) == 0
    imported_from = (userturn.load_run(imported).meta.model_extra or {})["imported_from"]
    assert imported_from["model_mismatch_allowed"] is True
    assert [m["model"] for m in imported_from["lm_eval"]] == [ran[0] if ran else None]


def test_the_task_readme_says_where_the_embedded_model_lives(tmp_path, capsys):
    """A run of the embedded tiny model: the README names its folder (what `userturn models
    --path tiny` prints), and lm-eval's samples of that folder import; a dict of model_args, as
    newer lm-eval writes it, is read too."""
    run = userturn.run(models=["tiny"], datasets=[str(_one_item(tmp_path))], limit=1,
                       temperatures=[0.0], max_tokens=8, user_max_tokens=8, labeller="rules",
                       output=tmp_path / "run")
    task = tmp_path / "task"
    assert main(["export-task", str(run.folder), "-o", str(task)]) == 0
    capsys.readouterr()
    assert main(["models", "--path", "tiny"]) == 0
    location = capsys.readouterr().out.strip()
    assert Path(location, "config.json").is_file()
    readme = (task / "README.md").read_text()
    assert f"pretrained={location} " in readme and "PATH_OR_ID" not in readme
    assert f"--include_path {task.resolve()} " in readme  # runs from any folder
    # The command export-task prints is the README's, float32 included (the docs' command,
    # which writes the run's own greedy turns), on one line.
    assert main(["export-task", str(run.folder), "-o", str(task), "--force"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    command = " ".join(next(block for block in readme.split("```bash\n")[1:])
                       .split("\nuserturn import")[0].replace("\\\n", " ").split())
    assert command.startswith(f"lm-eval run --model hf --model_args pretrained={location} "
                              "dtype=float32 --include_path")
    assert f"run: {command}; then: userturn import --from lm-eval lmeval-out" in printed
    lm_eval_samples(task, tmp_path / "out", run=run,
                    ran=("hf", {"pretrained": location + "/", "dtype": "float32"}))
    assert main(["import", "--from", "lm-eval", str(tmp_path / "out"), "-o",
                 str(tmp_path / "imported")]) == 0


def test_the_docs_loader_refuses_an_lm_eval_older_than_it_was_tested_on(task_dir,
                                                                       monkeypatch):
    pytest.importorskip("datasets")
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.4.8")
    loader = {"__file__": str(task_dir / "userturn_docs.py")}
    exec((task_dir / "userturn_docs.py").read_text(), loader)
    with pytest.raises(RuntimeError, match=r"needs lm-eval >= 0\.4\.13 \(this is 0\.4\.8\)"):
        loader["load"]("userturn_fake_probe_t0.jsonl")


def _one_item(folder: Path) -> Path:
    data = folder / "one.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "x\\n#### 5"}\n')
    return data


def test_an_experiment_is_run_first_then_exported(tmp_path, capsys):
    data = tmp_path / "mini.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "x\\n#### 5"}\n')
    config = tmp_path / "experiment.yaml"
    config.write_text(f"models: [fake/probe]\ndatasets: [{data}]\nlimit: 1\n"
                      f"temperatures: [0.0]\noutput: {tmp_path / 'run'}\n")
    assert main(["export-task", str(config), "-o", str(tmp_path / "task")]) == 0
    assert "running" in capsys.readouterr().out
    docs = read_docs(tmp_path / "task" / "userturn_fake_probe_t0.jsonl")
    assert [d["key"] for d in docs] == [t.key for t in userturn.load_run(tmp_path / "run").turns()]


@pytest.mark.lmeval
@pytest.mark.skipif(not LM_EVAL.exists(), reason=f"no {LM_EVAL}: `make lmeval` builds it")
def test_lm_eval_on_smollm2_writes_the_user_turns_userturn_stored(tmp_path):
    """The round trip on the real harness: the run's greedy SmolLM2 user turns, exported,
    generated again by lm-eval's HF backend, imported: the same texts under the same keys."""
    from userturn.backends.models import resolve_model

    run = userturn.run(models=["smollm2"], datasets=["gsm_symbolic"], limit=3,
                       temperatures=[0.0], max_tokens=96, user_max_tokens=48, batch_size=1,
                       output=tmp_path / "run")
    task = tmp_path / "task"
    assert main(["export-task", str(run.folder), "-o", str(task)]) == 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [str(LM_EVAL), "run", "--model", "hf", "--model_args",
         f"pretrained={resolve_model('smollm2').path}", "dtype=float32", "--device", "cpu",
         "--batch_size", "1", "--include_path", str(task), "--tasks", "userturn_smollm2",
         "--log_samples", "--output_path", str(tmp_path / "lmeval")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["import", "--from", "lm-eval", str(tmp_path / "lmeval"), "-o",
                 str(tmp_path / "imported")]) == 0
    stored = {t.key: t.user_turn for t in run.turns()}
    harness = {t.key: t.user_turn for t in userturn.load_run(tmp_path / "imported").turns()}
    assert len(stored) == 3 and harness == stored


def test_a_user_turn_variant_round_trips_with_its_typed_field_and_key(tmp_path, capsys):
    """A variant's documents carry its plan row with the typed field: lm-eval's samples come
    back as the same turns under the same keys, the variant in its own field, and each variant
    is a task of its own, named as the tables name it."""
    run = fake_probe_run(tmp_path, temperatures=[0.0], user_turn_variants=["prefill:So"])
    out = tmp_path / "task"
    assert main(["export-task", str(run.folder), "--harness", "lm-eval", "-o", str(out)]) == 0
    assert sorted(task_configs(out)) == ["userturn_fake_probe_t0",
                                         "userturn_fake_probe_user_prefill_so_t0"]
    lm_eval_samples(out, tmp_path / "samples", run=run)
    imported = tmp_path / "imported"
    assert main(["import", "--from", "lm-eval", str(tmp_path / "samples"), "-o",
                 str(imported)]) == 0
    capsys.readouterr()
    again = {t.key: t for t in userturn.load_run(imported).turns()}
    original = {t.key: t for t in run.turns() if t.model != "human"}
    assert set(again) == set(original)
    assert {(t.model, t.user_variant) for t in again.values()} == {
        ("fake/probe", "native"), ("fake/probe", "prefill:So")}
    assert all(again[key].user_variant == turn.user_variant for key, turn in original.items())
