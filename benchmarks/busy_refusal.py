"""How fast `userturn run` into a busy run folder is refused: a second writer should hear at once
that the folder is in use, not after its libraries (or a model) have loaded.

    .venv/bin/python benchmarks/busy_refusal.py [--repeats 5]

A helper process holds the folder's lock (as a running `userturn run` does); the script then
starts `userturn run` into that folder as a user would (a fresh Python process, the real CLI)
and times it from start to exit. Each attempt must be refused with the "in use" line and exit
2; the median and the slowest are printed. Target: under 1 s (`python -X importtime` shows
where an import creeps back onto the refusal path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOLDER = """
import sys, time
from userturn.store.lock import RunLock
with RunLock(sys.argv[1], "run"):
    print("held", flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
"""
RUN = ("run", "--model", "fake/probe", "--dataset", "gsm_symbolic", "--limit", "2")


def refusal_seconds(folder: Path, env: dict[str, str]) -> float:
    """One `userturn run` into the busy ``folder``: its wall time, checked to be the refusal."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "userturn.cli.main", *RUN, "-o", str(folder)],
                            env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    if result.returncode != 2 or "is in use by another writer" not in result.stderr:
        raise SystemExit(f"not refused as busy (exit {result.returncode}): {result.stderr[-500:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="userturn-busy-") as tmp:
        folder = Path(tmp) / "run"
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            times = [refusal_seconds(folder, env) for _ in range(max(1, args.repeats))]
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=60)
    print(f"busy folder refused in {statistics.median(times):.2f}s (median of {len(times)}, "
          f"slowest {max(times):.2f}s; target < 1s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
