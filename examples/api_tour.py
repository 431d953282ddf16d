"""A notebook-sized tour of userturn's Python API (docs/api.md).

    python examples/api_tour.py                 # probes the tiny test model (about 2 minutes on CPU)
    python examples/api_tour.py --model fake/probe --labeller rules   # a scripted model: seconds
    python examples/api_tour.py runs/demo       # or reads a run you already have
    python examples/api_tour.py runs/demo judge:openai/gpt-5.4-mini@rubric1,rules   # which labels

It prints the follow-up rate per condition (the numbers of `userturn report RUN`), the same table
as a pandas DataFrame (the columns of summary.csv), recomputes the rates from a DataFrame of the
turns, and shows a few turns with their labels.
"""

from __future__ import annotations

import argparse
from collections import Counter

import userturn

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("run", nargs="?", help="a run folder to read (default: run the probe)")
parser.add_argument("labels", nargs="?", help="label sources in priority order, comma-separated")
parser.add_argument("--model", default="tiny", help="the model to probe (default: tiny)")
parser.add_argument("--labeller", default="cascade", help="the offline labeller (default: cascade)")
args = parser.parse_args()

# 1. A run: load one from disk, or run the probe (resumable: a second call makes no model calls).
if args.run:
    run = userturn.load_run(args.run)
else:
    run = userturn.run(models=[args.model], labeller=args.labeller, limit=3, samples=2,
                       output=f"runs/api-tour-{args.model.replace('/', '-')}")
labels = args.labels.split(",") if args.labels else None  # as `userturn report --labels`
print(run, "labels from:", ", then ".join(run.label_sources(labels)))

# 2. The summary: one row per model, answerer, dataset, perturbation and temperature.
for row in run.summary(labels):
    rate = row.follow_up
    shown = "-" if rate.n == 0 else (
        f"{100 * rate.value:.0f}% [{100 * rate.low:.0f}-{100 * rate.high:.0f}]")
    temperature = "greedy" if row.temperature <= 0 else f"{row.temperature:g}"
    print(f"{row.model:<12} {row.perturbation:<10} {row.dataset:<14} {temperature:>6}  "
          f"follow-up {shown:<14} n={rate.n:<3} undecided={row.undecided} "
          f"label_errors={row.label_errors} errors={row.errors}")

# 2b. The same table as a DataFrame: the columns and numbers of the report's summary.csv.
try:
    summary = run.summary_frame(labels)
except userturn.UserturnError as missing:
    print(f"\n{missing}")
else:
    print("\nsummary_frame():")
    print(summary[["model", "perturbation", "temperature", "follow_up", "follow_up_low",
                   "follow_up_high", "follow_up_n", "accuracy"]].round(3).to_string(index=False))

# 3. Every user turn as a Turn: its context, its text, every label, and its status.
turns = run.turns(labels)
print(f"\n{len(turns)} user turns; status counts: {dict(Counter(t.status for t in turns))}")
for turn in turns[:3]:
    print(f"- [{turn.status}] T={turn.temperature:g} {turn.user_turn[:70]!r}"
          f" (labels: {', '.join(f'{lab.source}={lab.label}' for lab in turn.labels)})")

# 4. The same turns as a DataFrame (the columns of `userturn export`), when pandas is installed.
try:
    frame = run.to_pandas(labels)
except userturn.UserturnError as missing:
    print(f"\n{missing}")
else:
    counted = frame[~frame["status"].isin(["invalid", "failed"])]
    rates = (counted.assign(hit=counted["label"] == "follow_up")
             .groupby(["model", "perturbation", "temperature"])["hit"].mean())
    print("\nfollow-up rate recomputed from the DataFrame:")
    print((100 * rates).round(0).astype(int).astype(str).add("%").to_string())

# 5. Label turns from anywhere with the rules classifier (undecided: label None).
labels = userturn.classify([{"query": "What is 6 x 7?", "answer": "6 x 7 = 42.",
                             "user_turn": "Why did you multiply instead of adding?"},
                            {"query": "What is 6 x 7?", "answer": "6 x 7 = 42.",
                             "user_turn": ""}])
print("\nclassify:", [(label.label, label.source) for label in labels])
