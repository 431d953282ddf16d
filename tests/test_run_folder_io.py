"""The run folder under the ways jobs really end and disks really fill: SIGTERM keeps every
verdict received, readers never write into the run folder (and see rows a killed writer left in
the WAL), the lock is taken before anything loads, and a different experiment in a used folder
is said out loud."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from helpers import GSM_ITEMS, GSM_SAMPLES, finished_run
from openai_fake import Answer, FakeOpenAI

CLI = [sys.executable, "-m", "userturn.cli.main"]
PROXIES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
           "OPENAI_API_KEY", "OPENAI_BASE_URL")


def offline_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in PROXIES}


def judge_labels(folder: Path) -> int:
    with sqlite3.connect(f"{(folder / 'userturn.db').as_uri()}?mode=ro", uri=True) as db:
        return db.execute("SELECT COUNT(*) FROM labels WHERE source LIKE 'judge:%' "
                          "AND error IS NULL").fetchone()[0]


def wait_for(condition, seconds: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sigterm_during_judge_keeps_every_verdict_received(gsm_file, tmp_path):
    folder = finished_run(gsm_file, tmp_path)
    with FakeOpenAI() as fake:
        # Five verdicts come back at once; the sixth request is still in flight at the signal.
        fake.then(*[Answer()] * 5)
        fake.always(Answer(delay=3.0))
        judging = subprocess.Popen(
            [*CLI, "judge", str(folder), "--judge", "openai/j", "--base-url", fake.url,
             "--scope", "all", "--concurrency", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=offline_env())
        wait_for(lambda: len(fake.requests) >= 6)
        # Committed as they arrive, before any signal: a SIGKILL now would lose none of them.
        wait_for(lambda: judge_labels(folder) == 5, seconds=10)
        judging.send_signal(signal.SIGTERM)
        _, err = judging.communicate(timeout=60)
    assert judging.returncode == 143, err
    assert "Traceback" not in err  # above the line: only the progress bar as it stopped
    assert err.strip().splitlines()[-1].startswith(
        "userturn: terminated (SIGTERM); everything received so far is stored")
    assert judge_labels(folder) == 5


# A writer killed with its rows still in the WAL: the run is complete in the WAL, the database
# file itself holds only the empty tables (nothing was checkpointed).
KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from helpers import undecided_script as script
from helpers import experiment
from userturn.backends.fake import ScriptedBackend
from userturn.probe.pipeline import run_experiment
exp = experiment(Path(sys.argv[2]), Path(sys.argv[3]))
store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(script)})
os.kill(os.getpid(), signal.SIGKILL)
"""
USER_TURNS = 6 * (1 + 3)  # test_pipeline's six items: one greedy and three sampled turns each


def killed_run(gsm_file: Path, tmp_path: Path) -> Path:
    tests = str(Path(__file__).resolve().parent)
    writer = subprocess.run([sys.executable, "-c", KILLED_WRITER, tests, str(gsm_file),
                             str(tmp_path)], env=offline_env(), capture_output=True, text=True)
    assert writer.returncode == -signal.SIGKILL, writer.stderr
    folder = tmp_path / "run"
    assert (folder / "userturn.db-wal").stat().st_size > 0
    with sqlite3.connect(f"{(folder / 'userturn.db').as_uri()}?immutable=1", uri=True) as db:
        assert db.execute("SELECT COUNT(*) FROM generations").fetchone()[0] == 0  # all in the WAL
    return folder


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}


def read_everything(folder: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Every reader on ``folder`` sees every user turn the killed writer stored."""
    from userturn.api import load_run
    from userturn.cli.main import main

    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "incomplete run" not in out  # it finished, in the WAL
    assert "user turns labelled by rules 6, classifier 18" in out  # all 24
    assert main(["doctor", str(folder)]) == 0
    assert f"user turns {USER_TURNS} of {USER_TURNS} stored" in capsys.readouterr().out
    exported = tmp_path / "elsewhere" / "turns.jsonl"
    assert main(["export", str(folder), "--out", str(exported), "--format", "jsonl"]) == 0
    assert len(exported.read_text().splitlines()) == USER_TURNS
    # compare refuses a run against itself: the other side is a copy (copying reads only)
    other = tmp_path / "elsewhere" / "copy"
    shutil.copytree(folder, other)
    assert main(["compare", str(folder), str(other)]) == 0
    assert len(load_run(folder).turns()) == USER_TURNS
    capsys.readouterr()


def test_readers_see_a_killed_writers_wal_and_write_nothing_into_the_run_folder(
        gsm_file, tmp_path, capsys):
    folder = killed_run(gsm_file, tmp_path)
    before = snapshot(folder)
    mode = folder.stat().st_mode
    folder.chmod(0o555)  # a read-only folder (root ignores it: the snapshot still checks)
    try:
        read_everything(folder, tmp_path, capsys)
    finally:
        folder.chmod(mode)
    assert snapshot(folder) == before


def test_a_wal_without_its_index_is_read_from_a_copy_not_hidden(gsm_file, tmp_path, capsys):
    # SQLite reads a WAL in place only through its -shm, which it would create beside it.
    folder = killed_run(gsm_file, tmp_path)
    (folder / "userturn.db-shm").unlink()
    before = snapshot(folder)
    read_everything(folder, tmp_path, capsys)
    assert snapshot(folder) == before


# A live writer: holds the lock, and has committed a change that is still in its WAL.
LIVE_WRITER = """
import sqlite3, sys, time
from userturn.store.lock import RunLock
with RunLock(sys.argv[1], "run"):
    db = sqlite3.connect(sys.argv[1] + "/userturn.db")
    db.execute("PRAGMA wal_autocheckpoint = 0")
    with db:
        db.execute("DELETE FROM labels WHERE source = 'rules'")
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_reader_sees_a_live_writers_newest_commit(gsm_file, tmp_path, capsys):
    from userturn.cli.main import main

    folder = finished_run(gsm_file, tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(folder)],
                              stdout=subprocess.PIPE, env=offline_env())
    try:
        assert writer.stdout.readline().strip() == b"held"
        database = (folder / "userturn.db").read_bytes()
        assert main(["report", str(folder)]) == 0
        out = capsys.readouterr().out
        assert f"run in progress (pid {writer.pid}" in out
        # The rules' labels are deleted, in the WAL: the classifier's (of the sampled turns,
        # which the rules left to it) are all that label the run; the greedy ones lose theirs.
        assert (f"labelled by nobody (undecided) {GSM_ITEMS}, classifier "
                f"{GSM_ITEMS * GSM_SAMPLES})") in out
        assert (folder / "userturn.db").read_bytes() == database
    finally:
        writer.kill()
        writer.wait()


def test_report_html_on_a_nearly_full_disk_leaves_no_partial_tables(gsm_file, tmp_path, capsys,
                                                                     monkeypatch):
    import errno

    from userturn.cli.main import main
    from userturn.store import atomic

    folder = finished_run(gsm_file, tmp_path)
    synced: list[int] = []

    def nearly_full(fd: int) -> None:  # two files fit, the third does not
        synced.append(fd)
        if len(synced) > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "sync_to_disk", nearly_full)
    assert main(["report", str(folder), "--html"]) == 2
    err = capsys.readouterr().err
    assert "no space left on the device" in err and "Traceback" not in err
    assert sorted(p.name for p in folder.iterdir()) == ["userturn.db", "userturn.lock"]


def test_compare_html_on_a_full_disk_blames_the_page(gsm_file, tmp_path, capsys, monkeypatch):
    import errno

    from userturn.cli.main import main
    from userturn.store import atomic

    folder = finished_run(gsm_file, tmp_path)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "sync_to_disk", full)
    other = tmp_path / "other"
    shutil.copytree(folder, other)  # compare refuses a run against itself
    page = tmp_path / "compare.html"
    assert main(["compare", str(folder), str(other), "--html", str(page)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"userturn: error: cannot write {page}: no space left")
    assert "userturn.db" not in line and not page.exists()


def test_a_busy_folder_is_refused_before_any_dataset_or_model_loads(gsm_file, tmp_path, capsys,
                                                                    monkeypatch):
    from helpers import hold_lock

    from userturn.backends import BackendSpec
    from userturn.cli.main import main
    from userturn.probe import pipeline

    folder = tmp_path / "busy"
    holder = hold_lock(folder)

    def loader(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("loaded before the lock was taken")

    monkeypatch.setattr(pipeline, "load_dataset", loader)
    monkeypatch.setattr(BackendSpec, "build", loader)
    try:
        started = time.monotonic()
        assert main(["run", "--model", "tiny", "--dataset", str(gsm_file), "-o",
                     str(folder)]) == 2
        assert time.monotonic() - started < 5.0
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"userturn: error: {folder} is in use by another writer: "
                                  f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()


def test_a_full_disk_at_the_lock_is_one_line_and_leaves_no_lock_file(gsm_file, tmp_path, capsys,
                                                                     monkeypatch):
    import builtins
    import errno

    from userturn.cli.main import main
    from userturn.store import lock

    class FullDisk:
        """The lock file opens (a directory entry fits) but its first write does not."""

        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.file = builtins.open(*args, **kwargs)

        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(self.file, name)

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(lock, "open", FullDisk, raising=False)
    folder = tmp_path / "new"
    assert main(["run", "--model", "tiny", "--dataset", str(gsm_file), "-o", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"userturn: error: cannot write {folder / 'userturn.lock'}: no space left on the device; "
        "free some space and run the same command again (nothing half-written was left)")
    assert not folder.exists()  # no 0-byte userturn.lock, no empty folder


def test_a_different_experiment_into_a_used_folder_says_what_it_replaced(gsm_file, tmp_path):
    import warnings

    from userturn.cli.main import main

    folder = tmp_path / "demo"
    first = ["run", "--model", "fake/scripted", "--dataset", str(gsm_file), "--limit", "3",
             "--temperatures", "0,1", "--samples", "1", "-o", str(folder)]
    other = [("0" if arg == "0,1" else arg) for arg in first]  # the same at greedy only
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert main(first) == 0
        assert main(other) == 0
        assert main(other) == 0  # resuming the same experiment: silent
    assert [str(w.message) for w in said] == [
        f"{folder} held another experiment (temperatures [0.0, 1.0] -> [0.0]): its plan is "
        "replaced by this one, so reports show this one; everything it generated stays stored, "
        "and running it again here shows it again with no model calls (give another --output "
        "to keep both)"]
