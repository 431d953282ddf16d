"""Leave one generator out: how a labeller does on turns of a model it was never fit to.

    .venv/bin/python benchmarks/leave_one_model_out.py            # every held-out group
    .venv/bin/python benchmarks/leave_one_model_out.py --limit 300  # smoke: every k-th turn
    .venv/bin/python benchmarks/leave_one_model_out.py --context --bootstrap 500  # docs' table

The labelled corpus (src/userturn/labels/corpus.jsonl.gz) holds turns of several generators
(SmolLM2-135M, through transformers and as a GGUF; Qwen2.5-Coder-1.5B as a GGUF), of people, and
authored hard cases. For each held-out group (each generator, and the human turns) every labeller
is fit on all the other groups' train-split turns (the authored cases always among them),
calibrated on their dev split, and scored on ALL of the held-out group's turns: none of them was
seen in fitting, whatever its split. Printed per labeller and group: Cohen's kappa 7-way and
follow-up vs rest with 95% intervals over queries (bootstrap of whole queries), follow-up
precision and recall; then, per condition of the held-out generator (dataset x temperature), the
follow-up rate the labeller prints against the adjudicated rate. docs/classifier.md keeps the
table this prints.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from userturn.labels.classifier import LearnedClassifier
from userturn.labels.context import HIDDEN_SIZE, ContextReading, turn_key
from userturn.labels.corpus import CORPUS_FILE
from userturn.labels.readings import shipped_and_cached
from userturn.labels.rules import RulesClassifier
from userturn.labels.sources import labeller_named
from userturn.labels.training import (
    Example,
    calibrate,
    context_meta,
    evaluate,
    fit,
    group_of,
    predict,
)
from userturn.records import Case

TARGET_CONDITION_TURNS = 40  # the threshold for a per-condition rate gap to count
BOOTSTRAP = 1000


@dataclass(frozen=True)
class Turn:
    example: Example
    generator: str  # smollm2 | qwen2.5-coder-1.5b | human | authored
    condition: str  # dataset, temperature


def generator_of(source: dict) -> str:
    model = str(source.get("model", ""))
    if source.get("kind") in ("human", "authored"):
        return str(source["kind"])
    if "qwen" in model.lower():
        return "qwen2.5-coder-1.5b"
    if "smollm2" in model.lower():
        return "smollm2"
    return model or "unknown"


def read_corpus(path: Path = CORPUS_FILE, readings: dict[str, ContextReading] | None = None
                ) -> list[Turn]:
    """The corpus's turns; with ``readings`` (by turn key), each carries its context reading."""
    turns = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for row in map(json.loads, handle):
            source = row.get("source") or {}
            case = Case(row["query"], row["answer"], row["user_turn"], row["user_turn"])
            reading = (readings or {}).get(turn_key(row["query"], row["answer"], row["user_turn"]))
            example = Example(case, row["label"], row["split"], group_of(row["query"]),
                              str(source.get("kind", "")), reading)
            temperature = source.get("temperature")
            condition = f"{source.get('dataset', '?')}, " + (
                "T ?" if temperature is None else "greedy" if temperature == 0 else f"T {temperature}")
            turns.append(Turn(example, generator_of(source), condition))
    return turns


Labeller = Callable[[Case], object]


def labellers(train: Sequence[Example], dev: Sequence[Example], scorer: str | None,
              readings: dict[str, ContextReading], default_only: bool = False
              ) -> dict[str, Labeller]:
    """Every family, fit on ``train`` and calibrated on ``dev`` (never on the held-out group).
    With a ``scorer`` (the turns carry readings) also the classifiers that read the turn in
    context: the likelihood ratios, and those plus the scorer's hidden state."""
    rules = RulesClassifier()
    out: dict[str, Labeller] = {"rules": rules.classify}
    variants: dict[str, dict | None] = {"features-lr": None}
    if scorer:
        variants["+context"] = context_meta(scorer, 0)
        variants["+context+hidden"] = context_meta(scorer, HIDDEN_SIZE)
    if default_only:  # the shipped design alone: the last variant, as cascade and classifier
        out = {}
        variants = dict(list(variants.items())[-1:])

    def cached(case: Case) -> ContextReading:
        return readings[turn_key(case.query, case.answer, case.user_turn)]

    for name, context in variants.items():
        model = calibrate(fit(train, c=0.5, context=context), dev)
        classifier = LearnedClassifier(model, reader=cached)
        out[f"classifier ({name})"] = classifier.classify
        out[f"cascade ({name})"] = labeller_named("cascade").case_labeller(learned=classifier).classify
    return out


def kappa_interval(predicted: Sequence[str], reference: Sequence[str], groups: Sequence[str],
                   draws: int = BOOTSTRAP, seed: int = 0) -> tuple[tuple[float, float], tuple[float, float]]:
    """95% intervals of (kappa 7-way, kappa follow-up) resampling whole queries."""
    by_group: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        by_group[group].append(index)
    names = list(by_group)
    rng = np.random.default_rng(seed)
    seven, follow = [], []
    for _ in range(draws):
        drawn = [i for g in rng.choice(len(names), len(names)) for i in by_group[names[g]]]
        e = evaluate([predicted[i] for i in drawn], [reference[i] for i in drawn])
        seven.append(e.kappa)
        follow.append(e.kappa_follow_up)
    q = lambda xs: (float(np.nanpercentile(xs, 2.5)), float(np.nanpercentile(xs, 97.5)))  # noqa: E731
    return q(seven), q(follow)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS_FILE)
    parser.add_argument("--limit", type=int, default=None,
                        help="smoke: keep every k-th turn so that about this many remain")
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP)
    parser.add_argument("--context", action="store_true",
                        help="add the classifiers that read turns in context, from the readings "
                             "shipped with the corpus (labels/corpus_readings.npz); keeps only "
                             "the turns that have a reading")
    parser.add_argument("--readings", type=Path, nargs="*", default=None,
                        help="readings caches (corpus/context_features.py writes them) over the "
                             "shipped ones, for a corpus not shipped yet; implies --context")
    parser.add_argument("--judge-verdicts", type=Path, default=None,
                        help="a judge's verdicts on the corpus (benchmarks/judge_quality.py "
                             "writes them): adds, per held-out group and on the turns the judge "
                             "labelled, the default cascade's coverage-accuracy curve and the "
                             "cascade with the judge asked below each threshold")
    parser.add_argument("--default-only", action="store_true",
                        help="fit only the shipped design (with --context: ratios + hidden "
                             "state), for the judge's curve without the comparison")
    parser.add_argument("--judge", default=None,
                        help="which judge of --judge-verdicts (needed when it holds several)")
    args = parser.parse_args(argv)
    verdicts = judge_verdicts(args.judge_verdicts, args.judge) if args.judge_verdicts else None
    readings, scorers = shipped_and_cached(args.readings or []) if (
        args.context or args.readings) else ({}, set())
    if len(scorers) > 1:
        raise SystemExit(f"readings from more than one scorer: {sorted(scorers)}")
    scorer = next(iter(scorers)) if scorers else None
    turns = read_corpus(args.corpus, readings)
    if scorer:
        turns = [t for t in turns if t.example.reading is not None]
    if args.limit:
        turns = turns[:: max(1, len(turns) // args.limit)]
    held_out_groups = [g for g in ("smollm2", "qwen2.5-coder-1.5b", "human")
                       if any(t.generator == g for t in turns)]
    print(f"{len(turns)} turns: " + ", ".join(
        f"{g} {sum(t.generator == g for t in turns)}"
        for g in ("smollm2", "qwen2.5-coder-1.5b", "human", "authored")))
    print("| held out | labeller | n | kappa7 [95% CI] | kappaF [95% CI] | F-P | F-R |")
    print("|---|---|---|---|---|---|---|")
    gaps: list[str] = []
    curves: list[str] = []
    for held in held_out_groups:
        fit_on = [t.example for t in turns if t.generator != held]
        train = [ex for ex in fit_on if ex.split == "train"]
        dev = [ex for ex in fit_on if ex.split == "dev"]
        test = [t for t in turns if t.generator == held]
        families = labellers(train, dev, scorer, readings, args.default_only)
        for name, labeller in families.items():
            predicted, probabilities = predict(labeller, [t.example for t in test])
            print(held_out_row(held, name, test, predicted, args.bootstrap), flush=True)
            if name.startswith("cascade"):
                gaps += rate_gaps(held, name, test, predicted)
            if verdicts is not None and name == list(families)[-1]:  # the default cascade
                curves += judge_curve(held, test, predicted, probabilities, verdicts,
                                      args.bootstrap)
    print_rate_gaps(gaps)
    if verdicts is not None:
        print()
        print("the default cascade's coverage and the cascade with the judge below a threshold "
              "(turns the judge labelled; rules' labels count as certain)")
        print("| held out | threshold | n | kept | kappa7 kept | kappaF kept | judge share | "
              "kappa7 with judge [95% CI] | kappaF with judge [95% CI] |")
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(curves))


def held_out_row(held: str, name: str, test: Sequence[Turn], predicted: Sequence[str],
                 draws: int) -> str:
    """One row of the table: kappas with their intervals over queries, follow-up P and R."""
    reference = [t.example.label for t in test]
    e = evaluate(predicted, reference)
    (k_lo, k_hi), (f_lo, f_hi) = kappa_interval(predicted, reference,
                                                [t.example.group for t in test], draws)
    f = e.per_label.get("follow_up", {})
    return (f"| {held} | {name} | {e.n} | {e.kappa:.3f} [{k_lo:.2f}, {k_hi:.2f}] | "
            f"{e.kappa_follow_up:.3f} [{f_lo:.2f}, {f_hi:.2f}] | "
            f"{f.get('precision', float('nan')):.2f} | {f.get('recall', float('nan')):.2f} |")


def print_rate_gaps(gaps: Sequence[str]) -> None:
    """The per-condition table (rate_gaps' lines), then how many conditions land within 5."""
    print()
    print("follow-up rate per condition of the held-out group: labeller vs adjudicated")
    print("| held out | labeller | condition | n | printed | adjudicated | gap (points) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(gaps))
    print()
    print(f"conditions of {TARGET_CONDITION_TURNS}+ turns whose printed rate is within 5 points of "
          "the adjudicated one:")
    for held, name in sorted({tuple(line.split(" | ")[:2]) for line in gaps}):
        rows = [line for line in gaps if line.startswith(f"{held} | {name} |")
                and "(n < " not in line]
        within = sum(abs(float(line.rstrip(" |").rsplit("| ", 1)[1])) <= 5 for line in rows)
        print(f"  {held.lstrip('| ')} / {name}: {within} of {len(rows)}")


THRESHOLDS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.01)  # 0: never asked; 1.01: always


def verdict_rows(path: Path, judge: str | None) -> dict[str, dict]:
    """The rows ``benchmarks/judge_quality.py`` stored for ``judge`` (None: the only judge in
    the file), by turn key."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    names = sorted({row["judge"] for row in rows})
    if judge is None and len(names) > 1:
        raise SystemExit(f"{path} holds several judges ({', '.join(names)}): name one")
    judge = judge or (names[0] if names else None)
    return {row["key"]: row for row in rows if row["judge"] == judge}


def judge_verdicts(path: Path, judge: str | None) -> dict[str, str | None]:
    """A judge's label by turn key (None where its verdict was an error)."""
    return {key: row["label"] for key, row in verdict_rows(path, judge).items()}


def judge_curve(held: str, test: Sequence[Turn], predicted: Sequence[str],
                probabilities: Sequence[float], verdicts: dict[str, str | None],
                draws: int) -> list[str]:
    """Per threshold, on the held-out turns the judge labelled: the share the cascade keeps (its
    probability at or above the threshold) and its kappas there; then every turn below the
    threshold labelled by the judge (its error keeps the cascade's label), with the judge's share.
    Threshold 0 is the cascade alone, 1.0 the judge on every turn the rules leave, 1.01 the
    judge alone (the cascade only where its verdict is an error)."""
    chosen = [(t, p, q) for t, p, q in zip(test, predicted, probabilities)
              if turn_key(t.example.case.query, t.example.case.answer,
                          t.example.case.user_turn) in verdicts]
    if not chosen:
        return [f"| {held} | - | 0 | no judged turns | | | | | |"]
    lines = []
    for threshold in THRESHOLDS:
        kept = [(t, p) for t, p, q in chosen if q >= threshold]
        combined, asked = [], 0
        for t, p, q in chosen:
            verdict = verdicts[turn_key(t.example.case.query, t.example.case.answer,
                                        t.example.case.user_turn)]
            if q < threshold:
                asked += 1
                combined.append(verdict or p)
            else:
                combined.append(p)
        reference = [t.example.label for t, _, _ in chosen]
        e = evaluate(combined, reference)
        (k_lo, k_hi), (f_lo, f_hi) = kappa_interval(combined, reference,
                                                    [t.example.group for t, _, _ in chosen], draws)
        k = evaluate([p for _, p in kept], [t.example.label for t, _ in kept]) if kept else None
        lines.append(
            f"| {held} | {threshold:.2f} | {len(chosen)} | {len(kept) / len(chosen):.0%} | "
            + (f"{k.kappa:.3f} | {k.kappa_follow_up:.3f}" if k else "- | -")
            + f" | {asked / len(chosen):.0%} | {e.kappa:.3f} [{k_lo:.2f}, {k_hi:.2f}] | "
            f"{e.kappa_follow_up:.3f} [{f_lo:.2f}, {f_hi:.2f}] |")
    return lines


def rate_gaps(held: str, name: str, test: Sequence[Turn], predicted: Sequence[str]) -> list[str]:
    by: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for turn, label in zip(test, predicted):
        by[turn.condition].append((label, turn.example.label))
    lines = []
    for condition, pairs in sorted(by.items(), key=lambda kv: -len(kv[1])):
        printed = sum(p == "follow_up" for p, _ in pairs) / len(pairs)
        truth = sum(r == "follow_up" for _, r in pairs) / len(pairs)
        mark = "" if len(pairs) >= TARGET_CONDITION_TURNS else " (n < 40)"
        lines.append(f"| {held} | {name} | {condition}{mark} | {len(pairs)} | {printed:.1%} | "
                     f"{truth:.1%} | {100 * (printed - truth):+.1f} |")
    return lines


if __name__ == "__main__":
    main()
