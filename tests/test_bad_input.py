"""Bad input gets one line (``userturn: error: ...``) and exit code 2, checked before any model
call; never a traceback, never a wrong answer printed as success."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import one_error

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
