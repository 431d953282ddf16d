"""A ``userturn run --executor ray`` driver killed with SIGKILL mid-run (with its process group,
as a scheduler ends a job: its local Ray cluster and actors go too) is resumed, here by the local
executor (the keys are the same), and ends with exactly what an uninterrupted local run stores.
Skipped without ray; about 4 minutes on 2 busy cores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import count_generations, stored_generations

pytest.importorskip("ray", reason="pip install 'userturn[ray]'")
pytestmark = pytest.mark.ray

ARGS = ["--model", "tiny", "--dataset", "gsm_symbolic", "--limit", "8", "--temperatures", "0,1",
        "--samples", "3", "--max-tokens", "16", "--user-max-tokens", "16", "--batch-size", "2"]
TOTAL = 8 * (1 + 1 + 3)


def userturn(log: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "userturn.cli.main", "run", *ARGS, *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def test_a_killed_ray_driver_resumes(tmp_path):
    config = tmp_path / "ray.yaml"
    config.write_text("executor: ray\nreplicas: 2\nunit_size: 4\n")
    killed, clean, log = tmp_path / "killed", tmp_path / "clean", tmp_path / "log.txt"
    driver = userturn(log, str(config), "--output", str(killed))
    deadline = time.time() + 400
    while count_generations(killed) < 12 and driver.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert driver.poll() is None, log.read_text()[-3000:]
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and every process it started
    driver.wait()
    partial = stored_generations(killed)
    assert 12 <= len(partial) < TOTAL

    resumed = userturn(log, str(config), "--executor", "local", "--output", str(killed))
    assert resumed.wait(timeout=400) == 0, log.read_text()[-3000:]
    uninterrupted = userturn(log, "--output", str(clean))
    assert uninterrupted.wait(timeout=400) == 0, log.read_text()[-3000:]
    final = stored_generations(killed)
    assert len(final) == TOTAL and final == stored_generations(clean)
    assert all(final[key] == value for key, value in partial.items())
