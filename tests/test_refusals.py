"""Nothing is touched before a refusal: every command checks all it was given, then takes the
folder's lock, then writes. A refusal (one line, exit 2) leaves the run folder byte for byte and
mtime for mtime as it was, a killed writer's WAL included, and makes no ``userturn.lock``; the
exports only read. A damaged store is one line naming the damaged part, from every command."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import hold_lock, one_error

from userturn.cli.main import main
from userturn.labels.plan import JudgeSpec
from userturn.store import atomic

RUN = ["--model", "fake/probe", "--dataset", "gsm_symbolic", "--limit", "2", "--samples", "1"]
JUDGE = ["--judge", "openai/j", "--scope", "all"]

# A writer killed after a commit that is still in its WAL (nothing checkpointed it): the folder
# then holds userturn.db, userturn.db-wal and userturn.db-shm, as after a SIGKILL.
KILLED_AFTER_A_COMMIT = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA wal_autocheckpoint=0")
with db:
    db.execute("INSERT OR REPLACE INTO meta VALUES ('note', '\\"kept in the WAL\\"')")
os._exit(0)
"""


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}




@pytest.fixture
def run_with_wal(tmp_path, capsys) -> Path:
    """A finished run whose last commit a killed writer left in the WAL."""
    folder = tmp_path / "run"
    assert main(["run", *RUN, "-o", str(folder)]) == 0
    capsys.readouterr()
    (folder / "userturn.lock").unlink()  # the folder as a copied or older run has it
    subprocess.run([sys.executable, "-c", KILLED_AFTER_A_COMMIT, str(folder / "userturn.db")],
                   check=True)
    assert (folder / "userturn.db-wal").stat().st_size > 0
    return folder


def test_the_exports_leave_the_run_folder_byte_identical_wal_included(run_with_wal, tmp_path,
                                                                        capsys):
    before = snapshot(run_with_wal)
    out = tmp_path / "out"
    run = str(run_with_wal)
    assert main(["export", run, "--format", "hf", "--out", str(out / "hf")]) == 0
    assert main(["export", run, "--format", "inspect", "--out", str(out / "x.eval")]) == 0
    assert main(["export-task", run, "-o", str(out / "task")]) == 0
    assert snapshot(run_with_wal) == before
    assert (out / "hf" / "README.md").exists() and (out / "x.eval").exists()
    capsys.readouterr()
    # export-task refusing (its folder exists) reads only, too
    assert "exists" in one_error(capsys, "export-task", run, "-o", str(out / "task"))
    assert snapshot(run_with_wal) == before


def refusals(folder: Path, tmp_path: Path) -> list[tuple[list[str], str]]:
    """(argv, a piece of the one error line) of bad input to every command on a good run."""
    run = str(folder)
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("key,label\nno-such-key,follow_up\n")
    bad_npz = tmp_path / "bad.npz"
    bad_npz.write_text("not numpy at all")
    empty_npz = tmp_path / "shape.npz"
    np.savez(empty_npz, weights=np.zeros((2, 3)))
    taken = tmp_path / "taken.jsonl"
    taken.write_text("mine\n")
    return [
        (["judge", run, *JUDGE, "--base-url", "htp:/x"], "not an http(s) address"),
        (["judge", run, *JUDGE, "--base-url", "http://127.0.0.1:0/v1"], "port 0 or a space"),
        (["judge", run, *JUDGE, "--base-url", "http://a b/v1"], "port 0 or a space"),
        (["judge", run, *JUDGE, "--base-url", "http://me:pw@127.0.0.1:8/v1"], "user name"),
        (["judge", run, *JUDGE, "--base-url", "http://127.0.0.1:9/v1", "--threshold", "nan"],
         "judge_threshold"),
        (["annotate", run, "--annotator", "ana", "--import", str(bad_csv)], "unknown key"),
        (["annotate", run, "--annotator", "ana", "--port", "70000", "--no-browser"], "--port"),
        (["label", run, "--classifier", str(bad_npz)], "not a classifier file"),
        (["label", run, "--classifier", str(empty_npz)], "not a classifier file"),
        (["run", *RUN, "--classifier", str(bad_npz), "-o", run], "not a classifier file"),
        (["report", run, "--labels", "nosuch"], "no labels from nosuch"),
        (["report", run, "--labels", ""], "names no label source"),
        (["report", run, "--labels", ",,,"], "names no label source"),
        (["agreement", run, "--sources", ""], "names no label source"),
        (["compare", run, run], "same run"),
        (["export", run, "--format", "jsonl", "--out", str(taken)], "exists"),
        (["export", run, "--format", "hf", "--out", str(taken)], ""),
        (["export-task", run, "-o", str(tmp_path)], "exists"),
    ]


def test_every_refusal_leaves_the_run_folder_as_it_was(run_with_wal, tmp_path, capsys,
                                                       monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-0000")
    before = snapshot(run_with_wal)
    for argv, said in refusals(run_with_wal, tmp_path):
        err = one_error(capsys, *argv)
        assert said in err, (argv, err)
        assert snapshot(run_with_wal) == before, argv  # no byte, no mtime, no lock file


def not_whole_stores(tmp_path: Path) -> dict[str, Path]:
    """A folder each of a 0-byte, a foreign and a newer-schema ``userturn.db``."""
    made = {name: tmp_path / name for name in ("empty", "foreign", "newer")}
    for folder in made.values():
        folder.mkdir()
    (made["empty"] / "userturn.db").write_bytes(b"")
    (made["foreign"] / "userturn.db").write_text("my notes, not a database\n")
    with sqlite3.connect(made["newer"] / "userturn.db") as db:
        for table in ("meta", "generations", "plan", "labels"):
            db.execute(f"CREATE TABLE {table} (key TEXT, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    db.close()
    return made


def test_a_store_that_is_not_whole_is_refused_by_every_writer_leaving_no_lock(tmp_path, capsys,
                                                                              monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-0000")
    labels = tmp_path / "labels.csv"
    labels.write_text("key,label\nk,follow_up\n")
    for kind, folder in not_whole_stores(tmp_path).items():
        before = snapshot(folder)
        for argv in (["run", *RUN, "-o", str(folder)], ["label", str(folder)],
                     ["judge", str(folder), *JUDGE, "--base-url", "http://127.0.0.1:9/v1"],
                     ["annotate", str(folder), "--annotator", "ana", "--import", str(labels)]):
            err = one_error(capsys, *argv)
            assert {"empty": "0 bytes", "foreign": "not a SQLite database",
                    "newer": "schema 99"}[kind] in err, (argv, err)
            assert snapshot(folder) == before, (kind, argv)


def damage_config(folder: Path) -> None:
    with sqlite3.connect(folder / "userturn.db") as db:
        db.execute("UPDATE meta SET value = '{not json' WHERE key = 'config'")
    db.close()


def test_a_meta_value_that_is_not_json_is_one_line_everywhere_and_doctor_says_what_reads(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-0000")
    folder, other = tmp_path / "run", tmp_path / "other"
    for path in (folder, other):
        assert main(["run", *RUN, "-o", str(path)]) == 0
    capsys.readouterr()
    damage_config(folder)
    before = snapshot(folder)
    run = str(folder)
    for argv in (["report", run], ["export", run, "--out", str(tmp_path / "t.jsonl")],
                 ["export", run, "--format", "hf", "--out", str(tmp_path / "hf")],
                 ["export-task", run, "-o", str(tmp_path / "task")],
                 ["compare", run, str(other)], ["agreement", run], ["label", run],
                 ["judge", run, *JUDGE, "--base-url", "http://127.0.0.1:9/v1"],
                 ["run", *RUN, "-o", run]):
        err = one_error(capsys, *argv)
        assert "its metadata 'config' is not JSON" in err and "userturn doctor" in err, argv
        assert snapshot(folder) == before, argv
    assert main(["doctor", run]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith(f"userturn: doctor: {run}: meta: 'config' is not JSON")
    assert "the tables are whole and can be recovered" in err
    with sqlite3.connect(folder / "userturn.db") as db:  # and what it says can be recovered, is
        generations = db.execute("SELECT COUNT(*) FROM generations").fetchone()[0]
    db.close()
    assert f"{generations} generations" in err


def test_a_meta_value_of_the_wrong_shape_is_one_line(tmp_path, capsys):
    folder = tmp_path / "run"
    assert main(["run", *RUN, "-o", str(folder)]) == 0
    capsys.readouterr()
    with sqlite3.connect(folder / "userturn.db") as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'label_sources'", (json.dumps(7),))
    db.close()
    assert "its metadata 'label_sources' has the wrong shape" in one_error(
        capsys, "report", str(folder))


@pytest.fixture
def finished(tmp_path, capsys) -> Path:
    """A finished run of the scripted model, its lock file as the run left it."""
    folder = tmp_path / "run"
    assert main(["run", *RUN, "-o", str(folder)]) == 0
    capsys.readouterr()
    return folder


def read_only(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def test_a_read_only_file_system_is_one_line_from_every_single_file_write(finished, tmp_path,
                                                                          capsys, monkeypatch):
    other = tmp_path / "other"
    assert main(["run", *RUN, "-o", str(other)]) == 0
    turns = tmp_path / "turns.jsonl"
    turns.write_text('{"query": "2+2?", "answer": "4", "user_turn": "Why?"}\n')
    capsys.readouterr()
    before = snapshot(finished)
    out = tmp_path / "out"
    out.mkdir()
    # The write fails, and so does removing its temporary (EROFS both): the second failure
    # must not bury the first under two tracebacks.
    monkeypatch.setattr(atomic, "sync_to_disk", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    for argv, path in (
            (["export", str(finished), "--out", str(out / "turns.jsonl")], out / "turns.jsonl"),
            (["classify", str(turns), "--labeller", "rules", "-o", str(out / "labelled.jsonl")],
             out / "labelled.jsonl"),
            (["compare", str(finished), str(other), "--html", str(out / "compare.html")],
             out / "compare.html")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        # classify draws its progress bar on stderr first: the error is the last line
        assert err.strip().splitlines()[-1] == (f"userturn: error: cannot write {path}: "
                                                "permission denied (a read-only folder?); "
                                                "choose a writable place"), argv
        assert not path.exists()
    assert snapshot(finished) == before


def test_a_run_refused_after_taking_the_lock_leaves_the_lock_file_as_it_was(finished,
                                                                             tmp_path, capsys):
    lock = finished / "userturn.lock"
    os.utime(lock, ns=(10**18, 10**18))  # an old lock: a rewrite would show in its mtime
    template = tmp_path / "fails.jinja"
    template.write_text("{{ raise_exception('this template refuses every conversation') }}")
    before = snapshot(finished)
    for argv, said in (
            (["run", "--model", "fake/probe", "--dataset", str(tmp_path / "missing.jsonl"),
              "-o", str(finished)], "missing.jsonl"),
            (["run", *RUN, "--user-turn-variant", f"template:{template}", "-o", str(finished)],
             "refuses every conversation")):
        assert said in one_error(capsys, *argv), argv
        assert snapshot(finished) == before, argv  # the lock file byte and mtime included
    assert main(["label", str(finished), "--labeller", "rules"]) == 0  # and it is free


def test_a_run_database_that_is_a_symbolic_link_is_refused_by_every_writer(finished, tmp_path,
                                                                           capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-0000")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "userturn.db").symlink_to(finished / "userturn.db")  # two folders, one store
    with sqlite3.connect(finished / "userturn.db") as db:
        key = db.execute("SELECT key FROM generations WHERE role = 'user'").fetchone()[0]
    db.close()
    labels = tmp_path / "labels.csv"
    labels.write_text(f"key,label\n{key},follow_up\n")
    before, before_linked = snapshot(finished), snapshot(linked)
    for argv in (["run", *RUN, "-o", str(linked)], ["label", str(linked), "--labeller", "rules"],
                 ["judge", str(linked), *JUDGE, "--base-url", "http://127.0.0.1:9/v1"],
                 ["annotate", str(linked), "--annotator", "ana", "--import", str(labels)]):
        err = one_error(capsys, *argv)
        assert f"{linked / 'userturn.db'} is a symbolic link" in err, (argv, err)
        assert snapshot(linked) == before_linked and snapshot(finished) == before, argv


def test_models_path_refuses_what_run_refuses_in_the_same_line(tmp_path, capsys):
    out = tmp_path / "run"
    for spec in ("nosuch", "/dev/null", str(tmp_path)):
        refused = one_error(capsys, "run", "--model", spec, "--dataset", "gsm_symbolic",
                            "--limit", "1", "-o", str(out))
        assert one_error(capsys, "models", "--path", spec) == refused
        assert not out.exists()
    assert "unknown model 'nosuch'" in one_error(capsys, "models", "--path", "nosuch")
    assert "/dev/null has no config.json" in one_error(capsys, "models", "--path", "/dev/null")


def test_an_empty_run_is_refused_by_the_hf_export_and_a_card_reads_without_a_warning(
        finished, tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "hf"
    assert main(["export", str(finished), "--format", "hf", "--out", str(out)]) == 0
    warned: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warned.append  # type: ignore[method-assign]
    logging.getLogger("datasets").addHandler(handler)  # its loggers write to it, not the root
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = datasets.load_dataset(str(out))
    finally:
        logging.getLogger("datasets").removeHandler(handler)
    assert [record.getMessage() for record in warned] == []  # the card's YAML reads whole
    assert loaded["train"].info.splits["train"].num_examples == loaded["train"].num_rows == 4
    with sqlite3.connect(finished / "userturn.db") as db:  # the run as it stood before its turns
        db.execute("DELETE FROM labels")
        db.execute("DELETE FROM generations WHERE role = 'user'")
    db.close()
    before = snapshot(finished)
    empty = tmp_path / "empty"
    assert f"{finished} holds no user turns: nothing to export" in one_error(
        capsys, "export", str(finished), "--format", "hf", "--out", str(empty))
    assert not empty.exists() and snapshot(finished) == before


def test_judge_into_a_busy_folder_is_refused_before_a_judge_model_loads(finished, capsys,
                                                                        monkeypatch):
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a judge was built for a folder another writer holds")

    monkeypatch.setattr(JudgeSpec, "build_judges", never)
    holder = hold_lock(finished)
    try:
        before = snapshot(finished)
        started = time.monotonic()
        err = one_error(capsys, "judge", str(finished), "--judge", "tiny")
        assert time.monotonic() - started < 5  # not the model's load (6.5 s)
        assert f"is in use by another writer: pid {holder.pid}, userturn run" in err
        assert snapshot(finished) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.mark.parametrize("setting, words", [
    ("limit", "does not read (limit: Input should be a valid integer"),
    ("models", "names no models (every run stores them"),
])
def test_doctor_finds_a_stored_experiment_that_does_not_read(setting, words, finished, capsys):
    with sqlite3.connect(finished / "userturn.db") as db:
        config = json.loads(db.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
        if setting == "limit":
            config["limit"] = "banana"
        else:
            del config[setting]
        db.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps(config),))
    db.close()
    before = snapshot(finished)
    err = one_error(capsys, "doctor", str(finished), code=1)
    assert err.startswith(f"userturn: doctor: {finished}: config: the run's stored experiment "
                          f"{words}"), err
    assert snapshot(finished) == before
