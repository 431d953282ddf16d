"""Corrected rates on a real SmolLM2 run: raw, corrected and human-only side by side, and the rate
of every turn's corpus label as the truth to read them against (docs/statistics.md).

    .venv/bin/python benchmarks/calibration_demo.py [--run runs/corpus/perturbed] [--size 300]
        [--random]
    .venv/bin/python benchmarks/calibration_demo.py --run RUN --size 4  # RUN: any run of corpus turns

The run is a copy of one of the corpus's SmolLM2 runs (corpus/generate.py), so every one of its
user turns also carries the corpus's adjudicated label (two blind LLM annotators and an
adjudicator, docs/corpus.md). The script draws a calibration sample the way
``userturn annotate RUN --calibration N`` does (shared between the conditions so the widest
interval is narrowest, stratified by the run's labeller within each, inclusion probabilities
stored; a run none of whose conditions has the 30 turns a corrected rate needs gets a random
sample instead, and the script says so), imports the corpus labels of the sampled turns only as ``human:corpus``
(``userturn annotate --import``), then prints the summary for the rules alone and for the
cascade (``--labels``), and per row the rate of all the turns' corpus labels: the figure a
person labelling every turn would get, which the corrected rate should cover.

``--random`` draws a simple random sample instead (what ``--import`` assumes of labels made
elsewhere). With the stratified sample every predicted follow-up is drawn when they are fewer than
half the slots, so the labeller's verdicts are already used through the strata and the corrected
rate equals the human-only one; with a random sample the PPI++ term is what uses them.
"""

from __future__ import annotations

import argparse
import csv
import random
import sqlite3
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from userturn.cli.main import main as cli
from userturn.labels.annotate import AnnotationError, AnnotationServer
from userturn.labels.corpus import corpus_examples
from userturn.store.database import RunStore
from userturn.store.turns import read_turns


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/corpus/perturbed"))
    parser.add_argument("--size", type=int, default=300, help="calibration sample size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random", action="store_true",
                        help="a simple random sample instead of the stratified calibration sample")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="userturn-calibration-")) / "run"
    folder.mkdir()
    # SQLite's backup API: a consistent copy with what the write-ahead log holds, even while
    # the run is still writing.
    with sqlite3.connect(args.run / "userturn.db") as source, \
            sqlite3.connect(folder / "userturn.db") as target:
        source.backup(target)
    truth = {(ex.case.query, ex.case.answer, ex.case.user_turn): ex.label
             for ex in corpus_examples()}
    store = RunStore.open(folder)
    turns = [t for t in read_turns(store) if t.counts_toward_rate and t.model != "human"]
    missing = [t for t in turns if (t.query, t.answer, t.user_turn) not in truth]
    if missing:
        sys.exit(f"{len(missing)} of the run's {len(turns)} turns are not in the corpus yet: "
                 "annotate them first (corpus/collect.py, corpus/build.py)")
    by_key = {t.key: t for t in turns}
    store.close()
    keys = [] if args.random else calibration_keys(folder, args.size, args.seed)
    if not keys:
        args.random = True
        keys = random.Random(args.seed).sample(sorted(by_key), min(args.size, len(by_key)))
    labels = folder.parent / "calibration.csv"
    with labels.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["key", "label"])
        for key in keys:
            if key in by_key:
                t = by_key[key]
                writer.writerow([key, truth[(t.query, t.answer, t.user_turn)]])
    how = "at random" if args.random else "stratified by the run's labeller"
    print(f"run copied to {folder}; calibration sample of {len(keys)} turns ({how}), labels "
          "from the corpus")
    cli(["annotate", str(folder), "--import", str(labels), "--annotator", "corpus"])
    for sources in ("rules", "rules,classifier"):
        print(f"\n=== raw rate from: {sources} ===", flush=True)
        cli(["report", str(folder), "--labels", sources])
    rows: dict[tuple[str, str, float], list[bool]] = defaultdict(list)
    for t in turns:
        rows[(t.dataset, t.perturbation, t.temperature)].append(
            truth[(t.query, t.answer, t.user_turn)] == "follow_up")
    print("\n=== every turn's corpus label (the truth the corrected rate should cover) ===")
    for (dataset, perturbation, temperature), hits in sorted(rows.items()):
        print(f"{dataset:<14} {perturbation:<26} T={temperature:g}  "
              f"{sum(hits) / len(hits):6.1%}  ({sum(hits)} of {len(hits)})")


def calibration_keys(folder: Path, size: int, seed: int) -> list[str]:
    """Drawn and stored (with its inclusion probabilities) by what `userturn annotate RUN
    --calibration N` runs; the page itself is never served. None where no condition of the run
    can have a corrected rate."""
    try:
        server = AnnotationServer(folder, "corpus", seed=seed, calibration=size)
    except AnnotationError as exc:
        print(f"no calibration sample: {exc}; a random sample instead")
        return []
    server.stop()
    return list(server.keys)


if __name__ == "__main__":
    main()
