"""Bad input gets one line (``userturn: error: ...``) and exit code 2, checked before any model
call; never a traceback, never a wrong answer printed as success."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import fake_probe_run, one_error

from userturn.cli.main import main

RUN = ["--model", "fake/probe", "--dataset", "gsm_symbolic", "--limit", "2", "--samples", "1"]




@pytest.fixture
def finished_run(tmp_path, capsys) -> Path:
    folder = tmp_path / "run"
    assert main(["run", *RUN, "-o", str(folder)]) == 0
    capsys.readouterr()
    return folder


@pytest.fixture
def turns_file(tmp_path) -> Path:
    path = tmp_path / "turns.jsonl"
    path.write_text(json.dumps({"query": "What is 2+2?", "answer": "4",
                                "user_turn": "Why is it 4?"}) + "\n")
    return path


def not_classifiers(tmp_path: Path) -> list[Path]:
    text = tmp_path / "text.npz"
    text.write_text("not numpy at all")
    other = tmp_path / "other.npz"
    np.savez(other, weights=np.zeros((2, 3)))  # an npz, but not the classifier's arrays
    wrong_shape = tmp_path / "shape.npz"
    np.savez(wrong_shape, weights=np.zeros((7, 5)), bias=np.zeros(7), scale=np.ones(3),
             temperature=np.float32(1), labels=np.array(["follow_up"] * 7),
             meta=np.array("{}"))
    return [text, other, wrong_shape]


def test_a_file_that_is_not_a_classifier_is_refused_before_any_model_call(
        tmp_path, capsys, finished_run, turns_file):
    for bad in not_classifiers(tmp_path):
        assert "not a classifier file" in one_error(capsys, "classify", str(turns_file),
                                                    "--classifier", str(bad))
        assert "not a classifier file" in one_error(capsys, "label", str(finished_run),
                                                    "--classifier", str(bad))
        # run: refused with the settings, so nothing is generated and no folder is made
        out = tmp_path / f"r-{bad.stem}"
        assert "not a classifier file" in one_error(capsys, "run", *RUN, "--classifier",
                                                    str(bad), "-o", str(out))
        assert not out.exists()


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("fault", ["{{ 1/0 }}", "{{ 1 + 'a' }}",
                                   "{% for i in range(999999999) %}{% endfor %}"])
def test_a_template_that_raises_is_one_line(fault, tmp_path, capsys):
    template = tmp_path / "bad.jinja"
    template.write_text(CHATML + fault)
    started = time.monotonic()
    err = one_error(capsys, "render", "--template", str(template))
    assert "bad.jinja failed: " in err
    assert "bad.jinja failed: " in one_error(
        capsys, "render", "--model", "fake/probe", "--variant", f"template:{template}")
    out = tmp_path / "r"
    assert "bad.jinja failed: " in one_error(
        capsys, "run", *RUN, "--user-turn-variant", f"template:{template}", "-o", str(out))
    assert time.monotonic() - started < 60  # the huge range is refused, not run


def test_numbers_out_of_range_are_one_line(capsys, finished_run, turns_file):
    for c in ("nan", "-1", "0", "inf"):
        assert "--c takes a number above 0" in one_error(
            capsys, "train-classifier", str(turns_file), "--c", c)
    for port in ("70000", "-1"):
        assert "--port takes a number from 0 to 65535" in one_error(
            capsys, "annotate", str(finished_run), "--annotator", "ana", "--port", port,
            "--no-browser")
    for threshold in ("nan", "-1", "1.5"):
        assert "judge_threshold" in one_error(
            capsys, "judge", str(finished_run), "--judge", "openai/j", "--base-url",
            "http://127.0.0.1:9/v1", "--threshold", threshold)


@pytest.mark.parametrize("url", ["http://[::1/v1", "htp:/x", "http://", "ftp://host/v1"])
def test_a_bad_server_address_is_refused_up_front(url, capsys, finished_run, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-0000")
    judge = ["judge", str(finished_run), "--judge", "openai/j", "--scope", "all"]
    assert "not a" in one_error(capsys, *judge, "--base-url", url)
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    started = time.monotonic()
    err = one_error(capsys, *judge)
    assert err.startswith("userturn: error: OPENAI_BASE_URL") and time.monotonic() - started < 10


def test_figures_into_a_file_is_one_line_before_the_tables(tmp_path, capsys, finished_run):
    target = tmp_path / "figures"
    target.write_text("a file")
    assert main(["report", str(finished_run), "--figures", str(target)]) == 2
    printed = capsys.readouterr()
    assert printed.out == ""  # refused before the tables
    assert printed.err.strip() == f"userturn: error: --figures {target}: {target} is a file, " \
        "not a folder"


def test_an_import_that_is_not_utf8_is_one_line(tmp_path, capsys, finished_run):
    for name, data in (("bad.csv", b"key,label\n\xff\xfe,generic\n"),
                       ("bad.jsonl", b'{"key": "\xff", "label": "generic"}\n')):
        path = tmp_path / name
        path.write_bytes(data)
        assert "UTF-8" in one_error(capsys, "annotate", str(finished_run), "--annotator", "ana",
                                    "--import", str(path)).replace("utf-8", "UTF-8")


@pytest.mark.parametrize("name", ["exp[seed=1]", "a[/b]", "x[bold]y"])
def test_a_folder_name_with_brackets_prints_as_written(name, tmp_path, capsys, monkeypatch):
    """Through a real run on the fake model, then every command that prints the folder."""
    monkeypatch.chdir(tmp_path)
    folder = f"runs/{name}"
    assert main(["run", *RUN, "-o", folder]) == 0
    out = capsys.readouterr().out
    assert f"run stored in {folder}/ (userturn report {folder})" in out
    assert (tmp_path / folder / "userturn.db").exists()
    assert main(["report", folder, "--html"]) == 0
    assert f"wrote {folder}/report.html (tables in {folder}/report_tables)" in \
        capsys.readouterr().out
    assert main(["export", folder]) == 0
    assert f"to {folder}/user_turns.jsonl" in capsys.readouterr().out
    assert main(["doctor", folder]) == 0
    assert capsys.readouterr().out.startswith(f"{folder}: ok")
    assert main(["compare", folder, "runs"]) == 2  # not a run: its error line, unharmed
    assert "runs is not a userturn run folder" in capsys.readouterr().err


def test_classify_of_an_empty_file_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "no rows (the file is empty)" in one_error(capsys, "classify", str(empty))
    assert not (tmp_path / "out.jsonl").exists()


def test_temperatures_space_separated_are_accepted(tmp_path, capsys):
    assert main(["run", *RUN, "--temperatures", "0", "1", "-o", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "fake/probe" in line and "%" in line]
    assert len(rows) == 2 and "greedy" in rows[0] and "│      1 │" in rows[1]
    assert main(["run", *RUN, "--temperatures", "0", "0.5,1", "-o", str(tmp_path / "b")]) == 0
    assert "│    0.5 │" in capsys.readouterr().out
    config = tmp_path / "exp.yaml"
    config.write_text("limit: 1\n")
    # a CONFIG after the list cannot be told from a value: the line says where it goes
    assert "a CONFIG file goes before the flags" in _usage_error(
        capsys, "run", "--temperatures", "0", "1", str(config))


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_file_with_query_and_answer_columns_is_read_without_skip_invalid(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"query": f"What is {n}+{n}?", "answer": f"#### {2 * n}"})
                            + "\n" for n in (1, 2)))
    assert main(["run", "--model", "fake/probe", "--dataset", str(data), "--samples", "1",
                 "-o", str(tmp_path / "r")]) == 0
    assert "│ qa " in capsys.readouterr().out
    # strict still: a row without the query is an error, not skipped
    data.write_text(data.read_text() + json.dumps({"answer": "#### 1"}) + "\n")
    assert "line 3" in one_error(capsys, "run", "--model", "fake/probe", "--dataset", str(data),
                                 "-o", str(tmp_path / "r2"))


@pytest.mark.parametrize("setting", ["limit: true", "samples: false", "judge_threshold: true"])
def test_a_boolean_for_a_number_is_refused(setting, tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(f"model: fake/probe\n{setting}\noutput: {tmp_path / 'r'}\n")
    name, value = setting.split(": ")
    assert f"{name} takes a number, not {value}" in one_error(capsys, "run", str(config))


def test_agreement_names_an_unknown_source(capsys, finished_run):
    err = one_error(capsys, "agreement", str(finished_run), "--sources", "rules,judge:typo")
    assert "--sources: no labels from judge:typo" in err and "it holds: rules" in err  # the rules decided every turn


def test_compare_of_a_run_with_itself_is_refused(capsys, finished_run):
    err = one_error(capsys, "compare", str(finished_run), f"{finished_run}/")
    assert "are the same run" in err


def test_an_unknown_hub_model_without_the_hub_is_one_line_at_once(tmp_path, capsys,
                                                                  monkeypatch):
    from huggingface_hub import constants

    # The hub out of reach (a closed local port, as the network is in CI) and the cache empty.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    started = time.monotonic()
    err = one_error(capsys, "run", "--model", "someone/no-such-model", "-o",
                    str(tmp_path / "r"))
    assert "cannot be reached" in err and "not in the local cache" in err
    assert time.monotonic() - started < 20


def test_doctor_on_a_truncated_database_reports_the_damage(tmp_path, capsys, finished_run):
    database = finished_run / "userturn.db"
    with open(database, "r+b") as handle:
        handle.truncate(database.stat().st_size // 2)
    err = one_error(capsys, "doctor", str(finished_run), code=1)
    assert err.startswith(f"userturn: doctor: {finished_run}: integrity: the database is "
                          "damaged")
    assert "userturn doctor" not in err


# -- untrusted files and settings (issue #39): one line, before anything is written ----------
DEEP = "[" * 100_000 + "]" * 100_000


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``folder`` with its modification time and bytes: a refused command
    leaves this unchanged."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def a_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_file_nested_too_deep_or_with_a_number_too_long_is_one_line_in_every_reader(
        tmp_path, capsys, finished_run):
    out = tmp_path / "out"
    deep_json = a_file(tmp_path, "deep.json", DEEP)
    calibration = a_file(tmp_path, "cal.json", '{"judge": "j", "labels": ' + DEEP + "}")
    refused = {
        "--dataset": (["run", "--model", "fake/probe", "--dataset", deep_json],
                      f"{deep_json}: invalid JSON (nested too deep to read)"),
        "conversations": (["run", "--model", "fake/probe", "--dataset",
                           f"conversations:{deep_json}"], "nested too deep to read"),
        "config": (["run", a_file(tmp_path, "deep.yaml", f"temperatures: {DEEP}\n"),
                    "--model", "fake/probe"], "deep.yaml is not valid YAML: nested too deep "
                   "to read"),
        "integer": (["run", a_file(tmp_path, "int.yaml", "limit: " + "1" * 5000 + "\n"),
                     "--model", "fake/probe"], "int.yaml is not valid YAML at line 1: a number "
                    "of 5000 digits"),
        "--backend-arg": (["run", "--model", "fake/probe", "--backend-arg", f"n_ctx={DEEP}"],
                          "nested too deep to read"),
        "--judge-calibration": (["run", *RUN, "--judge", "tiny", "--judge-calibration",
                                 calibration], "cal.json is not a judge calibration (nested too "
                                "deep to read)"),
    }
    for name, (argv, message) in refused.items():
        assert message in one_error(capsys, *argv, "-o", str(out)), name
        assert not out.exists(), name
    before = snapshot(finished_run)
    assert "cal.json is not a judge calibration (nested too deep to read)" in one_error(
        capsys, "judge", str(finished_run), "--judge", "tiny", "--calibration", calibration)
    assert snapshot(finished_run) == before


def yaml_bomb(levels: int = 9) -> str:
    """``levels`` anchors, each a list of ten aliases of the one before: 10**levels strings
    once expanded, a few hundred bytes as written."""
    lines = ["model: fake/probe", "backend_args:", "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def in_two_gigabytes() -> None:
    """A child that would expand the bomb fails at two gigabytes, not the test machine."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_yaml_anchor_bomb_is_refused_before_the_store_is_made(tmp_path):
    config = a_file(tmp_path, "bomb.yaml", yaml_bomb())
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "userturn.cli.main", "run", config, "--dataset",
                           "gsm_symbolic", "--limit", "1", "-o", str(out)],
                          capture_output=True, text=True, timeout=90,
                          preexec_fn=in_two_gigabytes)
    err = done.stderr.strip()
    assert done.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert err == (f"userturn: error: {config} is not valid YAML: more than 100,000 values "
                   "once its aliases are expanded (anchors repeated inside anchors): write the "
                   "values out")
    assert not out.exists()


def calibration_text(labels: list[str], weight: float = 0.0) -> str:
    return json.dumps({"judge": "j", "revision": "r", "rubric": "1-labels", "labels": labels,
                       "weights": [[weight] * 7 for _ in labels], "bias": [0.0] * len(labels)})


LABEL_SET = ["follow_up", "generic", "new_query", "restatement", "assistant_drift", "meta",
             "empty"]


@pytest.mark.parametrize("text, problem", [
    (calibration_text(LABEL_SET, 1e308), "weights[0][0] is 1e+308"),
    (calibration_text(["follow_up"] * 7), "labels must be labels of docs/labels.md, each at "
     "most once"),
    (calibration_text([*LABEL_SET[:6], "nope"]), "labels must be labels of docs/labels.md"),
])
def test_a_calibration_that_could_give_nan_is_refused_at_load(text, problem, tmp_path, capsys,
                                                             finished_run):
    calibration = a_file(tmp_path, "cal.json", text)
    before = snapshot(finished_run)
    err = one_error(capsys, "judge", str(finished_run), "--judge", "tiny", "--calibration",
                    calibration)
    assert f"{calibration} is not a judge calibration: {problem}" in err
    assert snapshot(finished_run) == before
    out = tmp_path / "out"
    assert problem in one_error(capsys, "run", *RUN, "--judge", "tiny", "--judge-calibration",
                                calibration, "-o", str(out))
    assert not out.exists()


def test_a_calibration_that_gives_nan_anyway_is_an_error_label_never_a_label():
    from userturn.labels.local_judge import JudgeCalibration, calibrated_verdict
    from userturn.records import LABELS

    huge = JudgeCalibration("j", "r", "1-labels", tuple(LABELS),
                            tuple((1e308,) * len(LABELS) for _ in LABELS), (0.0,) * len(LABELS))
    logprobs = [-0.2] + [-3.0] * (len(LABELS) - 1)
    label = calibrated_verdict(logprobs, "judge:j", huge)
    assert label.label is None and label.probability is None
    assert "not a probability" in (label.error or "")


def classifier_file(tmp_path: Path, name: str, **changes) -> str:
    """The shipped form-only parameters with ``changes``: right shapes, wrong numbers."""
    from userturn.labels.classifier import FORM_MODEL_FILE

    with np.load(FORM_MODEL_FILE, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    arrays.update(changes)
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


def test_classifier_parameters_that_could_give_nan_are_refused(tmp_path, capsys, turns_file):
    from userturn.labels.classifier import FORM_MODEL_FILE

    with np.load(FORM_MODEL_FILE, allow_pickle=False) as data:
        weights, labels = data["weights"], data["labels"]
    bad = {"huge.npz": ({"weights": np.full_like(weights, 1e30)}, "weights: a value that is not "
                        "a number from -10000 to 10000"),
           "repeated.npz": ({"labels": np.array([str(labels[0])] * len(labels))},
                            "are not labels of docs/labels.md, each once"),
           "cold.npz": ({"temperature": np.float64(1e-300)}, "temperature: a value that is not "
                        "a number from 0.01 to 100")}
    for name, (changes, problem) in bad.items():
        path = classifier_file(tmp_path, name, **changes)
        assert f"{path} is not a classifier file from `userturn train-classifier`: " in one_error(
            capsys, "classify", str(turns_file), "--classifier", path), name
        assert problem in one_error(capsys, "classify", str(turns_file), "--classifier", path)


def test_classifier_parameters_that_give_nan_anyway_make_an_error_label_never_a_label():
    from userturn.labels.classifier import FORM_MODEL_FILE, LearnedClassifier, LinearModel
    from userturn.records import Case

    with np.load(FORM_MODEL_FILE, allow_pickle=False) as data:
        model = LinearModel(np.full(data["weights"].shape, 1e308), data["bias"], data["scale"],
                            float(data["temperature"]), tuple(map(str, data["labels"])), {})
    with np.errstate(over="ignore"):  # the overflow is the point
        label = LearnedClassifier(model).classify(Case("What is 2+2?", "4", "Hmm, so what now?"))
    assert label.label is None and label.probability is None
    assert "are not all numbers" in (label.error or "")


@pytest.mark.parametrize("value", ["careful\udcff tutor", "careful \ud800 tutor"])
def test_a_system_prompt_that_is_not_text_is_refused_before_any_folder_is_touched(
        value, tmp_path, capsys, finished_run):
    before = snapshot(finished_run)
    err = one_error(capsys, "run", *RUN, "--system-prompt", value, "-o", str(finished_run))
    assert "system_prompt" in err and "invalid UTF-8" in err
    assert snapshot(finished_run) == before
    fresh = tmp_path / "fresh"
    assert "system_prompt" in one_error(capsys, "run", *RUN, "--system-prompt", value, "-o",
                                        str(fresh))
    assert not fresh.exists()
    escaped = json.dumps(value)  # "\udcff" or "\ud800": a YAML escape gives the same text
    config = a_file(tmp_path, "exp.yaml", f"system_prompt: {escaped}\n")
    assert "system_prompt" in one_error(capsys, "run", config, *RUN, "-o", str(fresh))
    assert not fresh.exists()


@pytest.fixture(scope="module")
def lm_eval_task(tmp_path_factory) -> Path:
    """An lm-eval task folder exported from a run of ``fake/probe``."""
    folder = tmp_path_factory.mktemp("lmeval")
    fake_probe_run(folder)
    task = folder / "task"
    assert main(["export-task", str(folder / "run"), "--harness", "lm-eval", "-o",
                 str(task)]) == 0
    return task


RESULTS = {"results": {}, "config": {"model": "hf", "model_args": "pretrained=fake/probe"},
           "lm_eval_version": "0.4.13"}


def lm_eval_output(task: Path, out: Path, edit=lambda record: record,
                   results: str | None = None) -> Path:
    """What ``lm-eval --log_samples --output_path out`` writes for ``task`` (a results file, a
    samples file per task, each user turn answered "Why?"), each record through ``edit`` and
    the results file's text ``results`` where given."""
    out.mkdir(parents=True)
    (out / "results_2026-01-01T00-00-00.json").write_text(results or json.dumps(RESULTS),
                                                           encoding="utf-8")
    for docs in sorted(task.glob("*.jsonl")):
        lines = []
        for index, line in enumerate(docs.read_text(encoding="utf-8").splitlines()):
            doc = json.loads(line)
            request = json.loads(doc["userturn"])["request"]
            settings = {"until": request["stop"], "max_gen_toks": request["max_tokens"],
                        "temperature": request["temperature"]}
            record = {"doc_id": index, "doc": doc, "resps": [["Why?"]],
                      "arguments": {"gen_args_0": {"arg_0": doc["prompt"], "arg_1": settings}}}
            edited = edit(record)
            lines.append(edited if isinstance(edited, str) else json.dumps(edited))
        (out / f"samples_{docs.stem}_2026-01-01T00-00-00.jsonl").write_text(
            "".join(line + "\n" for line in lines), encoding="utf-8")
    return out


def exported(edit):
    """A record edit of the document's userturn payload (what the export wrote)."""
    def on_record(record):
        payload = json.loads(record["doc"]["userturn"])
        edit(payload)
        record["doc"]["userturn"] = json.dumps(payload)
        return record
    return on_record


def with_resps(record):
    record["resps"] = [["Why \ud800?"]]
    return record


def nan_temperatures(payload):
    payload["run"]["config"]["temperatures"] = [float("nan")]


def nan_request(record):
    """A NaN temperature under a key made to match it, as a hostile edit would."""
    from userturn.records import GenerationParams, Request
    from userturn.store.sqlite import generation_key

    payload = json.loads(record["doc"]["userturn"])
    request = payload["request"]
    request["temperature"] = float("nan")
    key = generation_key(request["role"], request["model"], request["revision"],
                         request["template_hash"], Request(
                             request["prompt"], GenerationParams(request["temperature"],
                                                                 request["top_p"],
                                                                 request["max_tokens"]),
                             tuple(request["stop"]), request["seed"]), request["sample_index"])
    payload["key"] = payload["plan"]["key"] = record["doc"]["key"] = key
    record["doc"]["userturn"] = json.dumps(payload)
    del record["arguments"]["gen_args_0"]["arg_1"]["temperature"]
    return record


def temperatures_out_of_range(payload):
    payload["run"]["config"]["temperatures"] = [50]


def deep_doc(record):
    record["doc"]["userturn"] = DEEP
    return record


RAN = {"model_args as a list": json.dumps({**RESULTS, "config": {
           "model": "hf", "model_args": ["pretrained=fake/probe"]}}),
       "a NUL in pretrained=": json.dumps({**RESULTS, "config": {
           "model": "hf", "model_args": "pretrained=fake/probe\x00x"}}),
       "a results file nested too deep": DEEP}


@pytest.mark.parametrize("edit, results, message", [
    (lambda record: record, RAN["model_args as a list"],
     "model_args is a list, not text"),
    (lambda record: record, RAN["a NUL in pretrained="], "model_args holds a control character"),
    (lambda record: record, RAN["a results file nested too deep"], "nested too deep to read"),
    (with_resps, None, "resps[0][0]: invalid UTF-8 (a lone surrogate)"),
    (exported(nan_temperatures), None, "doc.userturn.run.config.temperatures[0] is nan: the "
     "document's userturn field is damaged"),
    (nan_request, None, "doc.userturn.request.temperature is nan"),
    (exported(temperatures_out_of_range), None, "the exported run's settings are damaged: the "
     "run's stored experiment does not read (temperatures: "),
    (lambda record: DEEP, None, "not JSON (nested too deep to read)"),
    (deep_doc, None, "the document's userturn field is damaged (nested too deep to read)"),
])
def test_an_lm_eval_import_refuses_what_it_cannot_store_before_making_the_folder(
        edit, results, message, lm_eval_task, tmp_path, capsys):
    found = lm_eval_output(lm_eval_task, tmp_path / "lm-eval", edit, results)
    out = tmp_path / "imported"
    err = one_error(capsys, "import", "--from", "lm-eval", str(found), "-o", str(out),
                    "--allow-model-mismatch")
    assert err.startswith("userturn: error: ") and message in err
    assert not out.exists()
