"""The command line as a user meets it: misuse gets one clear line and exit 2, nothing half-done."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_cli

from userturn import load_run
from userturn.backends.models import resolve_model
from userturn.config import Experiment, load_experiment
from userturn.errors import ConfigError
from userturn.report.numbers import rate_interval, temperature

TINY = ["--model", "tiny", "--limit", "2", "--samples", "1", "--max-tokens", "8",
        "--user-max-tokens", "8"]


def test_unknown_model_is_one_line_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", "--model", "no-such-model", "--output", str(out))
    assert_one_line_error(code, err, "unknown model 'no-such-model'")
    assert not out.exists()


def test_missing_dataset_file_is_one_line_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", *TINY, "--dataset", str(tmp_path / "nope.jsonl"),
                           "--output", str(out))
    assert_one_line_error(code, err, "nope.jsonl")
    assert not out.exists()


def test_missing_and_malformed_config_files(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", str(tmp_path / "absent.yaml"))
    assert_one_line_error(code, err, "config file not found")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [tiny\nlimit: 3\n")
    code, _, err = run_cli(capsys, "run", str(bad))
    assert_one_line_error(code, err, "not valid YAML")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("model: tiny\nsamples: 0\n")
    code, _, err = run_cli(capsys, "run", str(wrong))
    assert_one_line_error(code, err, "samples")
    typo = tmp_path / "typo.yaml"
    typo.write_text("model: tiny\ntemperature: [0.7]\n")
    code, _, err = run_cli(capsys, "run", str(typo))
    assert_one_line_error(code, err, "temperature")


def test_template_that_cannot_open_a_user_turn(capsys, tmp_path, tiny_backend):
    folder = tmp_path / "broken-model"
    shutil.copytree(resolve_model("tiny").path, folder)
    # A template that renders only up to the last assistant message.
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'assistant' or loop.index0 == 0 %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", "--model", str(folder), *TINY[2:], "--output", str(out))
    assert_one_line_error(code, err, str(folder))
    assert "chat template" in err
    assert not out.exists()


def test_config_file_with_flags_on_top(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("model: tiny\ndataset: gsm_symbolic\nlimit: 5\ntemperatures: [1.0, 0, 0.7]\n")
    exp = load_experiment(path, {"limit": 3, "samples": None, "models": ["smollm2"]})
    assert exp.plan.models == ["smollm2"] and exp.plan.datasets == ["gsm_symbolic"]
    assert exp.plan.limit == 3 and exp.plan.samples == Experiment().plan.samples
    assert exp.plan.temperatures == [0.0, 0.7, 1.0]
    assert exp.plan.samples_at(0.0) == 1 and exp.plan.samples_at(0.7) == exp.plan.samples
    with pytest.raises(ConfigError, match="temperatures"):
        load_experiment(None, {"temperatures": [-1.0]})
    with pytest.raises(ConfigError, match="either model or models"):
        load_experiment(_yaml(tmp_path, "model: a\nmodels: [b]\n"), {})


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def test_render_shows_the_exact_prompt_stop_markers_and_hash(capsys, tiny_backend):
    code, out, _ = run_cli(capsys, "render", "--model", "tiny", "--query", "What is 6 x 7?",
                           "--answer", "6 x 7 = 42.")
    assert code == 0
    prompt = out.split("-----\n", 1)[1].split("\n----- end of prompt", 1)[0]
    assert prompt == ("<|im_start|>user\nWhat is 6 x 7?<|im_end|>\n<|im_start|>assistant\n"
                      "6 x 7 = 42.<|im_end|>\n<|im_start|>user\n")
    assert "stop markers (end of the user turn): ['<|im_end|>', '<|im_start|>assistant']" in out
    assert f"template hash: {tiny_backend.template.hash}" in out


def test_run_report_and_export_end_to_end(capsys, tmp_path, tiny_backend):
    out = tmp_path / "run"
    code, printed, _ = run_cli(capsys, "run", *TINY, "--output", str(out))
    assert code == 0
    assert "Genuine follow-up rate" in printed and "greedy" in printed
    code, reported, _ = run_cli(capsys, "report", str(out))
    assert code == 0
    # Every row of the API's summary is printed whole, cell for cell, in the report's table.
    printed_rows = [[cell.strip() for cell in line.strip().strip("│").split("│")]
                    for line in reported.splitlines() if line.count("│") > 2]
    rows = load_run(out).summary()
    assert {row.temperature for row in rows} == {0.0, 1.0}
    for row in rows:
        assert [row.model, row.dataset, temperature(row.temperature), str(row.items),
                str(row.turns), rate_interval(row.follow_up), str(row.undecided),
                str(row.label_errors), str(row.errors), rate_interval(row.accuracy)] in printed_rows
    code, exported, _ = run_cli(capsys, "export", str(out), "--format", "jsonl")
    assert code == 0 and "wrote 4 user turns" in exported
    assert len((out / "user_turns.jsonl").read_text().splitlines()) == 4


def test_report_on_a_folder_that_is_not_a_run(capsys, tmp_path):
    code, _, err = run_cli(capsys, "report", str(tmp_path))
    assert_one_line_error(code, err, "not a userturn run folder")


def test_help_explains_the_commands():
    result = subprocess.run([sys.executable, "-m", "userturn.cli.main", "--help"],
                            capture_output=True, text=True, check=True)
    for word in ("run", "render", "report", "export", "smollm2"):
        assert word in result.stdout


def test_unreachable_hub_model_is_one_line_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "run", "--model", "userturn-tests/no-such-model", "--limit",
                           "1", "--output", str(out))
    assert_one_line_error(code, err, "cannot load model 'userturn-tests/no-such-model'")
    assert not out.exists()


def test_the_example_experiment_file_is_valid():
    exp = load_experiment(Path(__file__).parent.parent / "examples" / "experiment.yaml", {})
    assert exp.plan.models == ["smollm2", "tiny"] and exp.plan.temperatures == [0.0, 0.7, 1.0]
    assert [p.spec for p in exp.plan.perturbations] == ["truncate:0.5", "append_question:specific",
                                                   "wrong_answer"]


def test_perturbation_and_answerer_flags(tmp_path):
    exp = load_experiment(None, {"perturbations": ["empty", "truncate:0.3"],
                                 "answerers": ["self", "reference"]})
    assert [p.spec for p in exp.plan.perturbations] == ["empty", "truncate:0.3"]
    assert exp.plan.answerers == ["self", "reference"]
    with pytest.raises(ConfigError, match="unknown perturbation"):
        load_experiment(None, {"perturbations": ["shuffle"]})


def test_an_ndjson_dataset_runs_like_jsonl(capsys, tmp_path, gsm_file):
    ndjson = tmp_path / "mini_gsm.ndjson"
    shutil.copy(gsm_file, ndjson)
    out = tmp_path / "run"
    code, printed, err = run_cli(capsys, "run", "--model", "fake/probe", "--dataset", str(ndjson),
                                 "--limit", "2", "--samples", "1", "--output", str(out))
    assert code == 0, err
    row = next(line for line in printed.splitlines() if "fake/probe" in line and "greedy" in line)
    assert row.split("│")[1:6] == [" fake/probe ", " mini_gsm ", " greedy ", "     2 ", "     2 "]


def test_datasets_lists_every_registered_dataset(capsys):
    code, printed, _ = run_cli(capsys, "datasets")
    rows: list[list[str]] = []
    for line in printed.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0]:
            rows.append(cells)
        elif cells:  # a cell wrapped onto the next line: join it to its row
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    assert code == 0
    assert [cells[0] for cells in rows] == [
        "gsm_symbolic", "gsm8k[:FILE]", "ifeval[:FILE]", "ifbench", "math500[:FILE]",
        "mtbench[:FILE]", "conversations:FILE", "healthbench:FILE", "coval:FILE", "FILE"]
    assert rows[-1] == [
        "FILE", ".jsonl .ndjson .json .parquet .csv .tsv; --field query=COL answer=COL", "file",
        "GSM8K numeric match when it has an answer column", "yes"]


def test_fake_backend_runs_every_reading_command_without_a_model(capsys, tmp_path, gsm_file):
    """fake/NAME is the scripted backend: the whole command line runs with no model and no torch."""
    out = tmp_path / "run"
    code, printed, _ = run_cli(capsys, "run", "--model", "fake/probe", "--dataset", str(gsm_file),
                               "--limit", "2", "--samples", "1", "--output", str(out))
    assert code == 0
    # Its user turn asks about a step of the answer: the rules call it a follow-up, every time.
    table = next(line for line in printed.splitlines() if "fake/probe" in line and "greedy" in line)
    # Two of two turns: the clustered Wilson interval of 2/2, not a zero-width 100-100.
    assert "100% [34-100]" in table
    code, reported, _ = run_cli(capsys, "report", str(out))
    assert code == 0 and table in reported
    code, _, _ = run_cli(capsys, "export", str(out), "--format", "jsonl")
    rows = [json.loads(line) for line in (out / "user_turns.jsonl").read_text().splitlines()]
    assert code == 0 and len(rows) == 4 and {r["status"] for r in rows} == {"follow_up"}
    code, rendered, _ = run_cli(capsys, "render", "--model", "fake/probe")
    assert code == 0 and "stop markers (end of the user turn): ['<|im_end|>', " \
        "'<|im_start|>assistant']\n" in rendered
    assert rendered.rstrip().endswith("assistant header: '<|im_start|>assistant\\n'")
