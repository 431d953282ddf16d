"""The run folder is owned and its store cannot be destroyed: one writer at a time (the second
gets one line naming the first's PID), a store that is checked at open, a database that vanishes
mid-run is an error, and no file userturn writes can go over a database or be left half-written."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sqlite3

import numpy as np
import pytest
from helpers import experiment, finished_run, hold_lock, undecided_script

from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.errors import StoreError
from userturn.probe.pipeline import run_experiment
from userturn.store import atomic
from userturn.store import database as store_module
from userturn.store.turns import read_turns


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_second_writer_fails_naming_the_first_and_readers_see_it_in_progress(
        gsm_file, tmp_path, capsys):
    folder = finished_run(gsm_file, tmp_path)
    holder = hold_lock(folder)
    try:
        exp = experiment(gsm_file, tmp_path, temperatures=[0.0])  # another config, same folder
        with pytest.raises(StoreError, match=f"in use by another writer: pid {holder.pid}, "
                                             "userturn run"):
            run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
        assert main(["judge", str(folder), "--judge", "openai/j", "--base-url",
                     "http://127.0.0.1:9/v1"]) == 2
        assert f"pid {holder.pid}" in one_line(capsys.readouterr().err)
        assert main(["label", str(folder), "--labeller", "rules"]) == 2  # re-labelling writes
        assert f"pid {holder.pid}" in one_line(capsys.readouterr().err)
        assert main(["report", str(folder)]) == 0  # readers work during a run
        assert f"run in progress (pid {holder.pid}, userturn run)" in capsys.readouterr().out
    finally:
        holder.send_signal(signal.SIGKILL)  # the OS releases the lock of a killed process
        holder.wait()
    exp = experiment(gsm_file, tmp_path, temperatures=[0.0])
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    assert main(["report", str(folder)]) == 0
    assert "in progress" not in capsys.readouterr().out


@pytest.mark.parametrize("damage, words", [
    (lambda db: db.write_bytes(b""), "is empty (0 bytes), not a userturn store"),
    (lambda db: db.write_text("hello"), "is not a userturn store (not a SQLite database)"),
    (lambda db: db.write_bytes(db.read_bytes()[:6000]), "is damaged"),
    (lambda db: sqlite3.connect(db).executescript("DROP TABLE plan"), "not a userturn store"),
    (lambda db: sqlite3.connect(db).executescript(
        "UPDATE meta SET value = '99' WHERE key = 'schema_version'"), "schema 99"),
])
def test_a_store_that_is_not_a_whole_userturn_store_is_one_line(damage, words, gsm_file,
                                                                 tmp_path, capsys):
    folder = finished_run(gsm_file, tmp_path)
    with sqlite3.connect(folder / "userturn.db") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    damage(folder / "userturn.db")
    for command in (["report", str(folder)], ["doctor", str(folder)],
                    ["export", str(folder)]):
        code = main(command)
        err = capsys.readouterr().err
        assert code in (1, 2) and words in err, (command, err)
        assert "Traceback" not in err
    exp = experiment(gsm_file, tmp_path)  # nor is it taken for a new run
    with pytest.raises(StoreError, match=words.split("(")[0].split(",")[0]):
        run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})


@pytest.mark.parametrize("seed", range(6))  # each seed scribbles other bytes: other damage
def test_doctor_passes_a_whole_run_and_fails_a_corrupted_one(seed, gsm_file, tmp_path, capsys):
    folder = finished_run(gsm_file, tmp_path)
    assert main(["doctor", str(folder)]) == 0
    assert "ok (userturn store, schema 1, integrity ok)" in capsys.readouterr().out
    with sqlite3.connect(folder / "userturn.db") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = db.execute("PRAGMA page_size").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
    data = bytearray((folder / "userturn.db").read_bytes())
    scribble = np.random.default_rng(seed)
    for page_number in range(2, pages):  # scribble over every page but the schema's
        start = page_number * page + 100
        data[start:start + 200] = scribble.bytes(200)
    (folder / "userturn.db").write_bytes(bytes(data))
    for command in (["doctor", str(folder)], ["report", str(folder)]):
        code = main(command)
        err = capsys.readouterr().err
        assert code in (1, 2) and "Traceback" not in err, err
        assert "integrity" in err or "is damaged" in err, err


def test_a_run_whose_database_is_deleted_fails_loudly(gsm_file, tmp_path):
    exp = experiment(gsm_file, tmp_path)

    def deleting(request):
        database = exp.plan.output / "userturn.db"
        if database.exists() and request.prompt.endswith("user\n"):
            database.unlink()
        return undecided_script(request)

    with pytest.raises(StoreError, match="was deleted or replaced while this command ran"):
        run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(deleting)})


def test_export_never_writes_over_the_database_nor_an_existing_file(gsm_file, tmp_path, capsys):
    folder = finished_run(gsm_file, tmp_path)
    database = folder / "userturn.db"

    def rows() -> list:
        with sqlite3.connect(database) as db:
            return db.execute("SELECT * FROM generations ORDER BY key").fetchall()

    before = rows()
    for out in (database, tmp_path / "copy.db"):
        if out != database:
            shutil.copy(database, out)
        code = main(["export", str(folder), "--out", str(out), "--format", "csv", "--force"])
        assert code == 2 and "it is a run's database" in one_line(capsys.readouterr().err)
    assert rows() == before and len(before) > 0
    mine = tmp_path / "mine.csv"
    mine.write_text("my own notes")
    assert main(["export", str(folder), "--out", str(mine), "--format", "csv"]) == 2
    assert "exists: give --force" in one_line(capsys.readouterr().err)
    assert mine.read_text() == "my own notes"
    assert main(["export", str(folder), "--out", str(mine), "--format", "csv", "--force"]) == 0
    assert mine.read_text().startswith("model,")
    assert main(["export", str(folder), "--out", str(tmp_path), "--format", "csv"]) == 2
    assert "is a directory" in one_line(capsys.readouterr().err)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".partial"))]


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "no space left on the device"),
                                         (errno.EACCES, "permission denied")])
def test_a_full_disk_or_a_refusal_while_writing_is_one_line_and_leaves_nothing(
        code, words, gsm_file, tmp_path, capsys, monkeypatch):
    folder = finished_run(gsm_file, tmp_path)
    main(["report", str(folder), "--html"])
    capsys.readouterr()
    pages = {p: p.read_bytes() for p in folder.rglob("*") if p.suffix in (".html", ".csv")}

    def full(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(atomic, "sync_to_disk", full)
    for command in (["export", str(folder), "--format", "csv"], ["report", str(folder),
                                                                  "--html"]):
        assert main(command) == 2
        err = one_line(capsys.readouterr().err)
        assert words in err and str(folder) in err
    after = {p: p.read_bytes() for p in folder.rglob("*") if p.suffix in (".html", ".csv")}
    assert after == pages  # the earlier report is whole, no 0-byte or half file
    assert not (folder / "user_turns.csv").exists()
    assert not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_a_full_disk_during_a_run_is_one_line_and_the_run_resumes(gsm_file, tmp_path,
                                                                  monkeypatch):
    connect = store_module.connect

    def small_disk(path, writable):  # SQLite's own "database or disk is full" (SQLITE_FULL)
        db = connect(path, writable)
        db.execute("PRAGMA max_page_count = 30")
        return db

    monkeypatch.setattr(store_module, "connect", small_disk)
    exp = experiment(gsm_file, tmp_path, samples=40)
    with pytest.raises(StoreError, match="the disk is full; free some space"):
        run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
    monkeypatch.setattr(store_module, "connect", connect)
    store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
    assert all(t.error is None for t in read_turns(store))


def test_classify_and_train_never_write_over_a_database(gsm_file, tmp_path, capsys):
    folder = finished_run(gsm_file, tmp_path)
    db = folder / "userturn.db"
    before = db.read_bytes()
    turns = tmp_path / "turns.jsonl"
    turns.write_text('{"query": "q?", "answer": "a", "user_turn": "Why a?"}\n')
    for argv in (["classify", str(turns), "-o", str(db), "--force"],
                 ["train-classifier", str(turns), "-o", str(db), "--force"]):
        assert main(argv) == 2
        assert "refusing to write over" in one_line(capsys.readouterr().err)
    assert db.read_bytes() == before
    assert not list(tmp_path.glob("**/*.tmp"))


def test_output_that_is_a_file_is_one_line(gsm_file, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("x")
    exp = experiment(gsm_file, tmp_path, output=target)
    with pytest.raises(StoreError, match="is a file, not a folder"):
        run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
    assert target.read_text() == "x"
