"""How fast the context reader reads user turns: one turn at a time beside batched, side by side.

The turns are the shipped corpus's test split (real turns of many generators after many answers,
in the corpus's order, as a run's turns after their items come), read by the context scorer the
default classifier uses (the embedded SmolLM2) on the chosen device. Each side starts from an
empty memo, the sides alternate over the repeats, and the best of each is kept. Prints the turns
per second of each side, their ratio, and the largest difference between the two sides' features
(reading in a batch must not change a reading).

    .venv/bin/python benchmarks/labelling_speed.py [--turns 64] [--batch-size 16] [--device cpu]
    .venv/bin/python benchmarks/labelling_speed.py --model tiny --turns 4 --repeats 1  # smoke
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np
import torch

from userturn.labels.context import ContextReading, ContextScorer
from userturn.labels.corpus import corpus_examples
from userturn.records import Case


def corpus_cases(turns: int) -> list[Case]:
    return [example.case for example in corpus_examples("test")[:turns]]


def time_reading(scorer: ContextScorer, cases: Sequence[Case], batch_size: int
                 ) -> tuple[float, list[ContextReading]]:
    """Seconds to read ``cases`` from an empty memo, ``batch_size`` turns at a time."""
    scorer.batch_size = batch_size
    scorer.forget()  # every side reads every turn
    if scorer.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    readings = scorer.read_many(cases)
    if scorer.device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, readings


def largest_difference(a: Sequence[ContextReading], b: Sequence[ContextReading]) -> float:
    return max(float(np.abs(x.features - y.features).max()) for x, y in zip(a, b))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="the scorer (tiny: smoke test)")
    parser.add_argument("--turns", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="the batched side's batch (default: the scorer's for the device)")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda when present)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    scorer = ContextScorer(args.model, device=args.device, batch_size=args.batch_size)
    batch = scorer.batch_size
    cases = corpus_cases(args.turns)
    time_reading(scorer, cases[:2], 2)  # warm-up
    print(f"scorer {scorer.name} on {scorer.device}, {len(cases)} corpus turns, "
          f"{torch.get_num_threads()} threads, batch {batch}, best of {args.repeats}")
    single, batched = [], []
    for _ in range(args.repeats):  # alternate, so drift in machine load hits both sides
        seconds, one = time_reading(scorer, cases, 1)
        single.append(seconds)
        seconds, many = time_reading(scorer, cases, batch)
        batched.append(seconds)
    n = len(cases)
    print(f"one at a time {n / min(single):7.2f} turns/s  batched {n / min(batched):7.2f} "
          f"turns/s  speed-up {min(single) / min(batched):.2f}x  "
          f"largest feature difference {largest_difference(one, many):.1e}")


if __name__ == "__main__":
    main()
