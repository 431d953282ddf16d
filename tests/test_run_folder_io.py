"""The run folder under the ways jobs really end and disks really fill: SIGTERM keeps every
verdict received, readers never write into the run folder (and see rows a killed writer left in
the WAL), the lock is taken before anything loads, and a different experiment in a used folder
is said out loud."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from openai_fake import Answer, FakeOpenAI
from test_run_folder import finished_run

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
