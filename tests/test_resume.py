"""A run killed with SIGKILL at an arbitrary moment restarts where it stopped, losing nothing
and duplicating nothing, and ends with exactly what an uninterrupted run produces."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ARGS = ["--model", "tiny", "--dataset", "gsm_symbolic", "--limit", "16", "--temperatures", "0,1",
        "--samples", "3", "--max-tokens", "24", "--user-max-tokens", "24", "--batch-size", "2"]
TOTAL = 16 * (1 + 1 + 3)


def userturn(log: Path, *args: str) -> subprocess.Popen:
    # Output goes to a file: an unread pipe fills up and blocks the child.
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "userturn.cli.main", "run", *ARGS, *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


# The killed run: the real CLI run, whose model stops answering after STALL_AFTER chunks (the
# chunks before it are committed), so the kill always lands mid-run however fast the machine is.
STALL_AFTER = 6
STALLING_RUN = f"""
import sys, time
from userturn.backends import BackendSpec
from userturn.cli.main import main

build = BackendSpec.build

class Stalling:
    def __init__(self, backend):
        self.backend, self.calls = backend, 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def complete(self, requests):
        self.calls += 1
        if self.calls > {STALL_AFTER}:
            time.sleep(3600)
        return self.backend.complete(requests)

BackendSpec.build = lambda spec: Stalling(build(spec))
sys.exit(main(sys.argv[1:]))
"""


def stalling_userturn(log: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-c", STALLING_RUN, "run", *ARGS, *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def stored(folder: Path) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(folder / "userturn.db") as db:
        rows = db.execute("SELECT key, text, raw_text FROM generations WHERE error IS NULL")
        return {key: (text, raw) for key, text, raw in rows}


def count(folder: Path) -> int:
    try:
        # Read-only: a plain connect would create an empty userturn.db before the run does,
        # which the run then (rightly) refuses as not a store.
        uri = f"{(folder / 'userturn.db').resolve().as_uri()}?mode=ro"
        with sqlite3.connect(uri, uri=True, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM generations").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, tiny_backend):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    log = tmp_path / "log.txt"
    process = stalling_userturn(log, "--output", str(killed))
    deadline = time.time() + 300
    while count(killed) < 12 and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, log.read_text()
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = stored(killed)
    assert 12 <= len(partial) < TOTAL

    resumed = userturn(log, "--output", str(killed))
    assert resumed.wait(timeout=300) == 0, log.read_text()
    uninterrupted = userturn(log, "--output", str(clean))
    assert uninterrupted.wait(timeout=300) == 0, log.read_text()

    final, reference = stored(killed), stored(clean)
    assert len(final) == TOTAL
    assert final == reference
    # What was stored before the kill was kept, not generated again.
    assert all(final[key] == value for key, value in partial.items())
    with sqlite3.connect(killed / "userturn.db") as db:
        labelled = dict(db.execute("SELECT source, COUNT(*) FROM labels GROUP BY source"))
    assert labelled == {"rules": 16 * (1 + 3), "classifier": 16 * (1 + 3)}  # every turn, once
