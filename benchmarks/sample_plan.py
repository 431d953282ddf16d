"""Does the planned human sample keep its promise? The plan, the allocation and the corrected
intervals on the corpus's labelled runs (docs/statistics.md).

    .venv/bin/python benchmarks/sample_plan.py                      # the docs' table
    .venv/bin/python benchmarks/sample_plan.py --half-width 0.2 --draws 200 --run RUN ...

The runs are the corpus's committed Qwen2.5-Coder-1.5B runs (corpus/runs/*.db.gz, restored to a
temporary folder): every user turn of them carries the corpus's adjudicated label, so the rate of
all of its labels is known per condition, the figure a person labelling every turn would get.
For each run the script takes the plan of ``userturn annotate RUN --plan --half-width H`` (the
run's stored labels are the labeller, its error from the offline error card), then draws many
calibration samples of the planned size in each condition, stratified as ``annotate
--calibration`` draws them, gives each drawn turn its corpus label as the human one, and
computes the corrected interval with ``userturn.stats.correction``. Per condition it prints the
planned labels, the half-width the plan expects, the mean half-width drawn, and how often the
interval covers the all-labels rate: over new runs (the run's items drawn again with
replacement, then a sample: what the interval is for, as items are a sample too) and over new
samples of the same run (the interval also counts the items' spread, so there it covers more).

Then the allocation: the plan's total shared by ``annotate --calibration`` (the widest interval
first) against the same number of labels drawn over the whole run at once, stratified by the
labeller alone (what ``--calibration`` did before): the widest interval of each, and how many
conditions get a corrected rate at all (a condition needs 30 labels of its own).
"""

from __future__ import annotations

import argparse
import gzip
import random
import shutil
import sys
import tempfile
from collections import defaultdict
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from userturn.labels.calibration import calibration_sample, labeller_errors
from userturn.labels.corpus import corpus_examples
from userturn.records import Condition, Turn
from userturn.stats.correction import MIN_HUMAN_LABELS, ppi_arrays
from userturn.stats.planning import PlanRow, plan_run, split
from userturn.store.database import RunStore
from userturn.store.turns import read_turns

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ("qwen-tasks", "qwen-chats", "qwen-conversations", "qwen-perturbed")


@dataclass(frozen=True)
class Cell:
    """One condition's turns as arrays: item index, the labeller's verdict, the corpus label."""

    items: np.ndarray
    predicted: np.ndarray
    truth: np.ndarray

    @property
    def rate(self) -> float:
        return float(self.truth.mean())


def restore(names: Sequence[str], folder: Path) -> list[Path]:
    """The committed run snapshots, each unzipped into a run folder of its own."""
    runs = []
    for name in names:
        run = folder / name
        run.mkdir(parents=True)
        with gzip.open(ROOT / "corpus" / "runs" / f"{name}.db.gz") as src, \
                (run / "userturn.db").open("wb") as out:
            shutil.copyfileobj(src, out)
        runs.append(run)
    return runs


def cells_of(turns: Sequence[Turn], truth: dict[tuple[str, str, str], str]) -> dict[Condition, Cell]:
    groups: dict[Condition, list[Turn]] = defaultdict(list)
    for turn in turns:
        if turn.counts_toward_rate:
            groups[Condition.of(turn)].append(turn)
    cells = {}
    for condition, group in groups.items():
        index = {item: i for i, item in enumerate(sorted({t.item_id for t in group}))}
        cells[condition] = Cell(np.array([index[t.item_id] for t in group]),
                                np.array([t.follow_up for t in group], dtype=float),
                                np.array([truth[(t.query, t.answer, t.user_turn)] == "follow_up"
                                          for t in group], dtype=float))
    return cells


def draw(cell: Cell, labels: int, rng: np.random.Generator, new_items: bool
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One draw: (the run's items again with replacement, if ``new_items``) and a calibration
    sample of ``labels`` stratified as ``annotate --calibration`` draws it. Arrays (items,
    slots) of verdicts, human labels and weights (NaN: no turn in that slot)."""
    k = int(cell.items.max()) + 1
    chosen = rng.integers(0, k, k) if new_items else np.arange(k)
    rows = [np.flatnonzero(cell.items == i) for i in chosen]
    width = max(len(r) for r in rows)
    predicted, truth = np.zeros((k, width)), np.zeros((k, width))
    weight = np.full((k, width), np.nan)
    for slot, turns in enumerate(rows):
        predicted[slot, :len(turns)] = cell.predicted[turns]
        truth[slot, :len(turns)] = cell.truth[turns]
        weight[slot, :len(turns)] = 0.0
    present = np.argwhere(~np.isnan(weight))
    strata = [present[predicted[tuple(present.T)] == 1], present[predicted[tuple(present.T)] == 0]]
    for stratum, take in zip(strata, split((len(strata[0]), len(strata[1])), labels)):
        if take:
            picked = stratum[rng.choice(len(stratum), take, replace=False)]
            weight[tuple(picked.T)] = len(stratum) / take
    return predicted, truth, weight


def simulate(cell: Cell, labels: int, draws: int, rng: np.random.Generator, new_items: bool
             ) -> tuple[np.ndarray, np.ndarray]:
    """Half-widths and whether each interval covers the all-labels rate, over ``draws``."""
    arrays = [draw(cell, labels, rng, new_items) for _ in range(draws)]
    width = max(a[0].shape[1] for a in arrays)
    predicted, truth, weight = (
        np.stack([np.pad(a[i], ((0, 0), (0, width - a[i].shape[1])),
                         constant_values=np.nan if i == 2 else 0.0) for a in arrays])
        for i in range(3))
    _, low, high, _ = ppi_arrays(predicted, truth, weight)
    return (high - low) / 2, (low <= cell.rate) & (cell.rate <= high)


def runwide(cells: dict[Condition, Cell], budget: int, draws: int, rng: np.random.Generator,
            minimum: int) -> np.ndarray:
    """The sample as ``--calibration`` drew it before: ``budget`` labels over the whole run,
    half on predicted follow-ups. Half-widths (draws, conditions), NaN where a condition got
    fewer than ``minimum`` labels and so no corrected rate."""
    order = list(cells)
    sizes = [len(cells[c].items) for c in order]
    f_all = np.concatenate([cells[c].predicted for c in order])
    strata = [np.flatnonzero(f_all == 1), np.flatnonzero(f_all == 0)]
    take = split((len(strata[0]), len(strata[1])), budget)
    widths = np.full((draws, len(order)), np.nan)
    for d in range(draws):
        weight = np.zeros(len(f_all))
        for stratum, count in zip(strata, take):
            if count:
                weight[rng.choice(stratum, count, replace=False)] = len(stratum) / count
        for i, part in enumerate(np.split(weight, np.cumsum(sizes)[:-1])):
            if (part > 0).sum() >= minimum:
                _, low, high, _ = ppi_arrays(*_by_item(cells[order[i]], part))
                widths[d, i] = float(high - low) / 2
    return widths


def equal_split(rows: Sequence[PlanRow], budget: int, minimum: int) -> dict[Condition, int]:
    """``budget`` labels shared equally between the conditions that can be corrected (a
    condition full passes its share on)."""
    room = {row.condition: row.design.turns for row in rows if row.design.turns >= minimum}
    share = dict.fromkeys(room, 0)
    left = budget
    while left and any(share[c] < room[c] for c in room):
        for c in room:
            if left and share[c] < room[c]:
                share[c], left = share[c] + 1, left - 1
    return share


def _by_item(cell: Cell, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = int(cell.items.max()) + 1
    width = int(np.bincount(cell.items).max())
    arrays = [np.zeros((k, width)), np.zeros((k, width)), np.full((k, width), np.nan)]
    fill = np.zeros(k, dtype=int)
    for j, item in enumerate(cell.items):
        for array, value in zip(arrays, (cell.predicted[j], cell.truth[j], weight[j])):
            array[item, fill[item]] = value
        fill[item] += 1
    return arrays[0], arrays[1], arrays[2]


def name_of(c: Condition) -> str:
    parts = [c.dataset] + ([c.perturbation] if c.perturbation != "none" else [])
    parts += [f"answers: {c.answerer}"] if c.answerer != "self" else []
    return ", ".join(parts) + f", T={c.temperature:g}" + (" (people's turns)" if c.model == "human"
                                                         else "")


def report_run(run: Path, rows: list[PlanRow], cells: dict[Condition, Cell], args: argparse.Namespace,
               rng: np.random.Generator, summary: dict[str, list[float]]) -> None:
    for row in rows:
        cell, planned = cells[row.condition], row.planned
        head = (f"| {run.name} | {name_of(row.condition)} | {row.design.turns} | "
                f"{100 * row.design.predicted / row.design.turns:.0f} | {100 * cell.rate:.1f} |")
        if planned.status not in ("ok", "unreachable"):
            print(f"{head} - | - | - | - | - |  no corrected rate: fewer than {args.minimum} turns")
            continue
        widths, covers = simulate(cell, planned.labels, args.draws, rng, new_items=True)
        same = simulate(cell, planned.labels, args.draws, rng, new_items=False)[1]
        promise = max(args.half_width, planned.half_width)
        summary["kept"].append(float(widths.mean() <= promise * 1.005))
        summary["ratio"].append(float(widths.mean() / planned.half_width))
        summary["coverage"].append(float(covers.mean()))
        best = " (best)" if planned.status == "unreachable" else ""
        print(f"{head} {planned.labels} | {100 * planned.half_width:.1f}{best} | "
              f"{100 * widths.mean():.1f} | {covers.mean():.3f} | {same.mean():.3f} |")


def widest(cells: dict[Condition, Cell], shares: dict[Condition, int], draws: int,
           rng: np.random.Generator, minimum: int) -> np.ndarray:
    """Per draw of the same run, the widest half-width over the conditions (inf where one has
    fewer than ``minimum`` labels: no corrected rate)."""
    columns = [simulate(cells[c], n, draws, rng, new_items=False)[0] if n >= minimum
               else np.full(draws, np.inf) for c, n in shares.items()]
    return np.max(np.stack(columns, axis=1), axis=1)


def allocation_line(run: Path, turns: Sequence[Turn], rows: list[PlanRow],
                    cells: dict[Condition, Cell], args: argparse.Namespace,
                    rng: np.random.Generator, summary: dict[str, list[float]]) -> None:
    budget = sum(row.planned.more for row in rows)
    eligible = [row.condition for row in rows if row.design.turns >= args.minimum]
    if not budget or not eligible:
        return
    keys, _ = calibration_sample(turns, budget, seed=args.seed)
    by_key = {t.key: Condition.of(t) for t in turns}
    planned = dict.fromkeys(eligible, 0)
    for key in keys:
        planned[by_key[key]] += 1
    now = widest(cells, planned, args.draws, rng, args.minimum)
    equal = widest(cells, equal_split(rows, budget, args.minimum), args.draws, rng, args.minimum)
    before = runwide({c: cells[c] for c in eligible}, budget, args.draws, rng, args.minimum)
    complete = ~np.isnan(before).any(axis=1)
    summary["widest_now"].append(float(now.mean()))
    summary["widest_equal"].append(float(equal.mean()))
    print(f"| {run.name} | {budget} | {len(eligible)} | {100 * now.mean():.1f} | "
          f"{_points(equal)} | {complete.mean():.2f} | "
          f"{_points(np.nanmax(before[complete], axis=1)) if complete.any() else '-'} |")


def _points(widths: np.ndarray) -> str:
    return "none" if not np.isfinite(widths).all() else f"{100 * widths.mean():.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, nargs="*", default=None,
                        help="run folders whose every turn is in the corpus (default: the "
                        "corpus's committed Qwen runs)")
    parser.add_argument("--half-width", type=float, default=0.15)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minimum", type=int, default=MIN_HUMAN_LABELS,
                        help=argparse.SUPPRESS)  # smaller only for the smoke test's tiny run
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    random.seed(args.seed)
    truth = {(ex.case.query, ex.case.answer, ex.case.user_turn): ex.label
             for ex in corpus_examples()}
    folder = Path(tempfile.mkdtemp(prefix="userturn-sample-plan-"))
    runs = args.run or restore(SNAPSHOTS, folder)
    print(f"plan for +-{100 * args.half_width:g} points (95% CI), {args.draws} draws per "
          "condition; rates in %\n")
    print("| run | condition | turns | labeller | all labels | planned labels | expected +- | "
          "mean +- drawn | covers: new runs | covers: same run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    summary: dict[str, list[float]] = defaultdict(list)
    plans = []
    for run in runs:
        with closing(RunStore.read(run)) as store:
            turns = [t for t in read_turns(store) if t.counts_toward_rate]
            errors = labeller_errors(store.label_sources())
        missing = [t for t in turns if (t.query, t.answer, t.user_turn) not in truth]
        if missing:
            sys.exit(f"{run}: {len(missing)} of its {len(turns)} turns are not in the corpus")
        rows = plan_run(turns, errors, args.half_width, minimum=args.minimum)
        cells = cells_of(turns, truth)
        report_run(run, rows, cells, args, rng, summary)
        plans.append((run, turns, rows, cells))
    print("\nthe plan's total shared by `annotate --calibration` (the widest first), shared "
          "equally between the conditions, and drawn over the whole run half on predicted "
          "follow-ups (as --calibration did before): the widest half-width over the conditions, "
          "in points, mean over draws of the same run\n")
    print("| run | labels | conditions with 30+ turns | widest +-: planned allocation | widest +-: "
          "equal split | before: draws with every condition corrected | before: widest +- in "
          "those |")
    print("|---|---|---|---|---|---|---|")
    for run, turns, rows, cells in plans:
        allocation_line(run, turns, rows, cells, args, rng, summary)
    coverage = summary["coverage"]
    print(f"\nplanned conditions: {len(coverage)}, mean half-width within the promise in "
          f"{int(sum(summary['kept']))}; drawn / expected half-width {min(summary['ratio']):.2f}"
          f"-{max(summary['ratio']):.2f}; coverage min {min(coverage):.3f}, mean "
          f"{float(np.mean(coverage)):.3f}, max {max(coverage):.3f}; widest +- planned "
          f"allocation {100 * max(summary['widest_now']):.1f} vs equal split "
          f"{100 * max(summary['widest_equal']):.1f} points")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
