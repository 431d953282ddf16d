"""Throughput of executor: ray with 1 and 2 CPU actors on the tiny model, and their ratio.

    RAY_AUTH_MODE=disabled PYTHONPATH=src python benchmarks/ray_scaling.py [--limit 16]

One local Ray cluster (num_cpus=2); for each replica count, the actors are built first (not
timed), then one experiment (greedy answers, greedy and sampled user turns) runs into a fresh
folder and is timed. On a machine with as many free cores as actors the ratio approaches 2;
where other work shares the cores it is lower.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=16, help="items")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--unit-size", type=int, default=8)
    args = parser.parse_args()

    import ray

    from userturn.backends import BackendSpec
    from userturn.config import Experiment
    from userturn.probe.pipeline import run_experiment
    from userturn.probe.ray_executor import RayExecutor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    root = Path(tempfile.mkdtemp(prefix="userturn-ray-scaling-"))
    rates = {}
    try:
        for replicas in (1, 2):
            exp = Experiment(models=["tiny"], datasets=["gsm_symbolic"], limit=args.limit,
                             temperatures=[0.0, 1.0], samples=args.samples,
                             max_tokens=args.max_tokens, user_max_tokens=args.max_tokens,
                             batch_size=4, output=root / f"replicas{replicas}")
            with RayExecutor([BackendSpec("tiny", batch_size=4)], replicas=replicas,
                             unit_size=args.unit_size) as executor:
                start = time.perf_counter()
                run_experiment(exp, backends=executor.backends, executor=executor).close()
                seconds = time.perf_counter() - start
            with sqlite3.connect(exp.plan.output / "userturn.db") as db:
                made = db.execute("SELECT COUNT(*) FROM generations WHERE error IS NULL "
                                  "AND model = 'tiny'").fetchone()[0]
            rates[replicas] = made / seconds
            print(f"{replicas} actor(s): {made} generations in {seconds:.1f} s = "
                  f"{rates[replicas]:.2f} generations/s")
    finally:
        ray.shutdown()
    print(f"ratio 2 actors / 1 actor: {rates[2] / rates[1]:.2f}")


if __name__ == "__main__":
    main()
