"""The shipped offline labeller, and a local judge, on people's turns none of them was fit to.

    .venv/bin/python corpus/sharegpt.py materialize FILE   # once: the texts from your ShareGPT copy
    .venv/bin/python benchmarks/unseen_people.py           # the rules, the classifier, the cascade
    .venv/bin/python benchmarks/unseen_people.py \
        --judge-verdicts corpus/judge_verdicts_sharegpt.jsonl \
        --calibration corpus/judge_calibration_qwen.json   # + the judge, raw and calibrated

The turns are real people's next messages after an assistant's answer (ShareGPT's first
exchanges, labelled blind by two annotators and adjudicated: corpus/sharegpt.py). The corpus the
classifier and the judge calibration were fit to holds none of them, nor any ShareGPT text: each
figure is what a user bringing a new source gets. Printed per labeller: Cohen's kappa 7-way and
follow-up vs rest with 95% intervals (whole queries resampled; here one turn per query), follow-up
precision and recall, and the follow-up rate it prints against the adjudicated rate. Then the
cascade's coverage at each probability threshold (the share of turns it keeps, and how often it
is right there) and, with judge verdicts, the cascade that asks the judge below each threshold.
Judge verdicts come from ``benchmarks/judge_quality.py --corpus corpus/work/people_sharegpt.jsonl.gz
--verdicts FILE``, keyed like the corpus's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).parent))
from leave_one_model_out import kappa_interval, verdict_rows  # noqa: E402

from userturn.labels.context import turn_key  # noqa: E402
from userturn.labels.local_judge import JudgeCalibration, calibrated_verdict  # noqa: E402
from userturn.labels.stages import label_cases  # noqa: E402
from userturn.labels.training import evaluate  # noqa: E402
from userturn.records import Case  # noqa: E402

DEFAULT_SET = Path(__file__).resolve().parent.parent / "corpus" / "work" / "people_sharegpt.jsonl.gz"
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
NO_LABEL = "undecided"  # no label (the rules undecided, a judge error): counted as wrong


def read_set(path: Path) -> list[dict]:
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run corpus/sharegpt.py materialize FILE first")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def row(name: str, predicted: Sequence[str], reference: Sequence[str], groups: Sequence[str],
        draws: int) -> str:
    scores = evaluate(list(predicted), list(reference))
    (k_lo, k_hi), (f_lo, f_hi) = kappa_interval(predicted, reference, groups, draws)
    said = sum(p == "follow_up" for p in predicted) / len(predicted)
    truth = sum(r == "follow_up" for r in reference) / len(reference)
    hits = sum(p == r == "follow_up" for p, r in zip(predicted, reference))
    precision = hits / max(1, sum(p == "follow_up" for p in predicted))
    recall = hits / max(1, sum(r == "follow_up" for r in reference))
    return (f"| {name} | {len(predicted)} | {scores.kappa:.3f} [{k_lo:.2f}, {k_hi:.2f}] | "
            f"{scores.kappa_follow_up:.3f} [{f_lo:.2f}, {f_hi:.2f}] | {precision:.2f} / "
            f"{recall:.2f} | {100 * said:.1f}% vs {100 * truth:.1f}% |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, default=DEFAULT_SET,
                        help="the materialized turns (corpus/sharegpt.py materialize)")
    parser.add_argument("--judge-verdicts", type=Path, default=None)
    parser.add_argument("--calibration", type=Path, default=None,
                        help="a judge calibration to apply to the stored log-probabilities")
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args(argv)

    rows = read_set(args.set)
    cases = [Case(r["query"], r["answer"], r["user_turn"], r["user_turn"]) for r in rows]
    reference = [r["label"] for r in rows]
    groups = [r["group"] for r in rows]
    print(f"{len(rows)} people's turns ({args.set.name}); adjudicated follow-up rate "
          f"{100 * reference.count('follow_up') / len(rows):.1f}%")
    print("\n| labeller | turns | kappa 7-way | kappa follow-up | follow-up P / R | "
          "follow-up rate printed vs people |\n|---|---|---|---|---|---|")
    labels = {name: label_cases(name, cases) for name in ("rules", "classifier", "cascade")}
    predicted = {name: [x.label or NO_LABEL for x in found] for name, found in labels.items()}
    for name in ("rules", "classifier", "cascade"):
        print(row(name, predicted[name], reference, groups, args.bootstrap))
    decided = [i for i, x in enumerate(labels["rules"]) if x.label is not None]
    right = sum(predicted["rules"][i] == reference[i] for i in decided)
    print(f"\nThe rules decide {len(decided)} of {len(rows)} turns "
          f"({100 * len(decided) / len(rows):.0f}%), {100 * right / max(1, len(decided)):.0f}% right.")

    cascade = labels["cascade"]
    learned = set(range(len(rows))) - set(decided)  # the turns the classifier labels
    print("\nThe cascade's classifier probability on the turns the rules leave "
          f"({len(learned)}): at each threshold, the share it keeps and how often it is right")
    for threshold in THRESHOLDS:
        kept = [i for i in sorted(learned) if (cascade[i].probability or 0.0) >= threshold]
        right = sum(predicted["cascade"][i] == reference[i] for i in kept)
        print(f"  p >= {threshold:.1f}: keeps {100 * len(kept) / max(1, len(learned)):.0f}%, "
              f"{100 * right / max(1, len(kept)):.0f}% right")

    if args.judge_verdicts is None:
        return
    verdicts = verdict_rows(args.judge_verdicts, None)
    keys = [turn_key(r["query"], r["answer"], r["user_turn"]) for r in rows]
    judged = [i for i, key in enumerate(keys) if key in verdicts]
    print(f"\nThe judge ({args.judge_verdicts.name}) on {len(judged)} of {len(rows)} turns")
    print("\n| labeller | turns | kappa 7-way | kappa follow-up | follow-up P / R | "
          "follow-up rate printed vs people |\n|---|---|---|---|---|---|")
    judges = {"judge (raw)": {i: verdicts[keys[i]]["label"] or NO_LABEL for i in judged}}
    if args.calibration is not None:
        calibration = JudgeCalibration.load(args.calibration)
        judges[f"judge (calibrated, {args.calibration.name})"] = {
            i: calibrated_verdict(verdicts[keys[i]]["logprobs"], "judge", calibration).label
            or NO_LABEL for i in judged if verdicts[keys[i]].get("logprobs")}
    pick = lambda values, idx: [values[i] for i in idx]  # noqa: E731
    for name, said in judges.items():
        idx = sorted(said)
        print(row(name, [said[i] for i in idx], pick(reference, idx), pick(groups, idx),
                  args.bootstrap))
        print(row("cascade, same turns", pick(predicted["cascade"], idx), pick(reference, idx),
                  pick(groups, idx), args.bootstrap))
        for threshold in THRESHOLDS:  # the judge where the classifier is unsure
            asked = [i for i in idx if i in learned
                     and (cascade[i].probability or 0.0) < threshold]
            mixed = [said[i] if i in asked else predicted["cascade"][i] for i in idx]
            print(row(f"cascade + {name} below p {threshold:.1f} (judge on "
                      f"{100 * len(asked) / len(idx):.0f}%)", mixed, pick(reference, idx),
                      pick(groups, idx), args.bootstrap))


if __name__ == "__main__":
    main()
