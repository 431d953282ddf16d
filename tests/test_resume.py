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

from helpers import count_generations, stored_generations

from userturn.backends.batching import QUEUE_WIDTHS
from userturn.cli.main import main

ARGS = ["--model", "tiny", "--dataset", "gsm_symbolic", "--limit", "16", "--temperatures", "0,1",
        "--samples", "3", "--max-tokens", "24", "--user-max-tokens", "24", "--batch-size", "2"]
TOTAL = 16 * (1 + 1 + 3)
# How long the killed run may take to reach its stall on a loaded machine (a hang, not a race).
WAIT_LIMIT_S = 1200


# The killed run: the real CLI run, whose model stops answering after STALL_AFTER chunks (the
# chunks before it are committed), so the kill always lands mid-run however fast the machine is.
STALL_AFTER = 3
# A call to the engine is a unit of QUEUE_WIDTHS batches' worth of prompts (refilled rows), so
# the stall lands after STALL_AFTER such units: the answers, the greedy turns, the first sampled.
UNIT = 2 * QUEUE_WIDTHS
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


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, tiny_backend):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    log = tmp_path / "log.txt"
    process = stalling_userturn(log, "--output", str(killed))
    # The stall, not the clock, decides when to kill: the run cannot get past its sixth chunk, so
    # however slow the machine, the kill lands with exactly those chunks committed. The limit
    # only stops a broken run from hanging the suite.
    limit = time.monotonic() + WAIT_LIMIT_S
    committed = UNIT * STALL_AFTER  # units of --batch-size 2 rows
    while (count_generations(killed) < committed and process.poll() is None
           and time.monotonic() < limit):
        time.sleep(0.05)
    assert process.poll() is None, log.read_text()  # still running: stalled, not finished
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = stored_generations(killed)
    assert len(partial) == committed, log.read_text()

    # Only the killed run needs a process of its own; the resume and the reference run here,
    # which spares two more torch imports.
    assert main(["run", *ARGS, "--output", str(killed)]) == 0
    assert main(["run", *ARGS, "--output", str(clean)]) == 0

    final, reference = stored_generations(killed), stored_generations(clean)
    assert len(final) == TOTAL
    assert final == reference
    # What was stored before the kill was kept, not generated again.
    assert all(final[key] == value for key, value in partial.items())
    with sqlite3.connect(killed / "userturn.db") as db:
        labelled = dict(db.execute("SELECT source, COUNT(*) FROM labels GROUP BY source"))
        abstained = db.execute("SELECT COUNT(*) FROM labels WHERE source = 'rules' "
                               "AND label IS NULL").fetchone()[0]
    # Every turn once by the rules, and once by the classifier where the rules abstain.
    assert labelled == {"rules": 16 * (1 + 3), "classifier": abstained} and abstained > 0
