"""Coverage of the "95%" rate intervals on simulated designs: the percentile bootstrap over items
that userturn used before, and the clustered Wilson interval it uses now (src/userturn/intervals.py).

    PYTHONPATH=src python benchmarks/coverage.py [--runs 1000] [--resamples 1000]

Prints, per design (items x samples per item, true rate, between-item spread as the intra-item
correlation), the share of simulated runs whose interval holds the true rate, and the share of
zero-width intervals. The table in docs/statistics.md is this script's output.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from designs import clustered_hits  # noqa: E402

from userturn.stats.intervals import clustered_interval  # noqa: E402


def bootstrap_interval(hits: np.ndarray, sizes: np.ndarray, rng: np.random.Generator,
                       resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """The previous interval: percentile bootstrap of the pooled rate over items, per run."""
    runs, items = hits.shape
    low, high = np.empty(runs), np.empty(runs)
    for run in range(runs):
        draws = rng.integers(0, items, size=(resamples, items))
        rates = hits[run][draws].sum(axis=1) / sizes[run][draws].sum(axis=1)
        low[run], high[run] = np.quantile(rates, [0.025, 0.975])
    return low, high


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print("| items x samples | rate | spread (ICC) | bootstrap: covers | zero-width "
          "| clustered Wilson: covers | zero-width |")
    print("|---|---|---|---|---|---|---|")
    new_all = []
    for items, samples, rate, icc in itertools.product((20, 40, 100, 200), (1, 4, 8),
                                                       (0.01, 0.02, 0.05, 0.15, 0.5),
                                                       (0.0, 0.05, 0.2)):
        if samples == 1 and icc > 0:
            continue  # one turn per item: the spread does not change the data's distribution
        hits, sizes = clustered_hits(rng, items=items, samples=samples, rate=rate, icc=icc,
                                     runs=args.runs)
        old = bootstrap_interval(hits, sizes, rng, args.resamples)
        new = clustered_interval(hits, sizes)
        row = []
        for low, high in (old, new):
            row += [((low <= rate) & (rate <= high)).mean(), (high - low <= 0).mean()]
        new_all.append(row[2])
        print(f"| {items} x {samples} | {rate:.0%} | {icc:g} | {row[0]:.3f} | {row[1]:.3f} "
              f"| {row[2]:.3f} | {row[3]:.3f} |")
    print(f"\nclustered Wilson: coverage min {min(new_all):.3f}, mean {np.mean(new_all):.3f}, "
          f"max {max(new_all):.3f} over {len(new_all)} designs, {args.runs} runs each")


if __name__ == "__main__":
    main()
