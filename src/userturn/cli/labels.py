"""``userturn classify``, ``userturn label`` and ``userturn train-classifier``."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from userturn.cli.flags import check_range, number
from userturn.labels.fitting import CONTEXT_CHOICES
from userturn.labels.sources import DEFAULT_LABELLER, LABELLERS
from userturn.records import LABELS
from userturn.store.atomic import refuse_to_replace, write_text


def add_classifier_parsers(sub: Any) -> None:
    classify = sub.add_parser(
        "classify", help="label a JSONL file of user turns (query, answer, user_turn)",
        description="Label every row of FILE (JSON Lines with the text fields query, answer and "
        "user_turn) offline and write it back with label, probability and source. Without -o "
        "the rows go to standard output; the label counts go to standard error.")
    classify.add_argument("file", type=Path)
    classify.add_argument("-o", "--out", type=Path, help="file to write (refused if it exists, "
                          "unless --force)")
    classify.add_argument("--force", action="store_true", help="overwrite --out")
    _labeller_options(classify)
    classify.set_defaults(handler=classify_command)

    label = sub.add_parser(
        "label", help="(re)label a run's user turns offline, generating nothing",
        description="Run the offline labellers over a stored run: the rules and the learned "
        "classifier, each on the turns it has not labelled yet. Only labels change.")
    label.add_argument("run", type=Path)
    _labeller_options(label)
    label.set_defaults(handler=label_command)

    train = sub.add_parser(
        "train-classifier", help="fit the user-turn classifier to your own labels",
        description="Fit the classifier to LABELLED (JSON Lines: query, answer, user_turn, label "
        "from docs/labels.md; optional split train/dev/test). Without splits, a dev split is "
        "drawn by query. Dev agreement is printed before anything is written; test rows are "
        "never used.")
    train.add_argument("labelled", type=Path)
    train.add_argument("--output", "-o", type=Path, default=Path("classifier.npz"),
                       help="where the parameters go (default ./classifier.npz); use them with "
                       "--classifier or `classifier:` in an experiment file")
    train.add_argument("--with-corpus", action="store_true", help="adapt: train on the shipped "
                       "corpus's train split plus your rows")
    train.add_argument("--c", type=number, default=0.5, help="inverse regularisation strength "
                       "(default 0.5: the best of the grid on the corpus dev split)")
    train.add_argument("--context", choices=CONTEXT_CHOICES,
                       default="shipped", help="what the classifier reads of a turn in context "
                       "through the embedded SmolLM2: ratios (how much likelier the turn is after "
                       "the answer, after the query, as the assistant), hidden (those and its "
                       "hidden state), none (form alone; numpy-only inference). Default: as the "
                       "shipped classifier does")
    train.add_argument("--readings", type=Path, help="cache of your turns' context readings "
                       "(default OUTPUT.readings.jsonl): a killed training resumes from it")
    train.add_argument("--force", action="store_true", help="overwrite --output")
    train.set_defaults(handler=train_command)


def _labeller_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--labeller", choices=list(LABELLERS), default=DEFAULT_LABELLER,
                        help=labeller_help())
    parser.add_argument("--classifier", type=Path, help="classifier parameters from "
                        "train-classifier (default: the shipped ones)")


def labeller_help() -> str:
    """``--labeller``'s help, from the labeller table: each name, with what it does where its
    row says (``cascade (rules, then the classifier; default), classifier, rules``)."""
    def said(name: str) -> str:
        parts = [LABELLERS[name].summary] * bool(LABELLERS[name].summary)
        parts += ["default"] * (name == DEFAULT_LABELLER)
        return f"{name} ({'; '.join(parts)})" if parts else name

    return ", ".join(map(said, LABELLERS))


def classify_command(args: argparse.Namespace, console: Console) -> int:
    from userturn.cli.console import progress_bars
    from userturn.labels.stages import label_cases
    from userturn.labels.training import case_of, read_rows

    if args.out is not None:
        refuse_to_replace(args.out, args.force)
    rows = read_rows(args.file)
    cases = [case_of(row, args.file, number) for number, row in rows]  # every row checked first
    with progress_bars() as progress:
        labels = label_cases(args.labeller, cases, args.classifier, progress)
    out_rows: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    for (_, row), label in zip(rows, labels):
        counts[label.label or "undecided"] += 1
        out_rows.append({**row, "label": label.label, "probability": label.probability,
                         "source": label.source})
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out_rows)
    if args.out is None:
        sys.stdout.write(text)
    else:
        write_text(args.out, text)
    from userturn.cli.console import plain_console

    err = plain_console(stderr=True)
    summary = ", ".join(f"{name} {counts[name]}" for name in (*LABELS, "undecided")
                        if counts[name])
    err.print(f"{len(out_rows)} turn(s) labelled ({args.labeller}): {summary}"
              + (f"; written to {args.out}" if args.out else ""))
    return 0


def label_command(args: argparse.Namespace, console: Console) -> int:
    from userturn.cli.console import progress_bars
    from userturn.labels.sources import labeller_named
    from userturn.labels.stages import label_turns
    from userturn.store.database import RunStore
    from userturn.store.view import read_stored_run

    # A bad parameters file is refused before the run is touched.
    labeller_named(args.labeller).build(args.classifier)
    # no run, judge or other label writes meanwhile
    with RunStore.writing(args.run, "label") as store:
        run = read_stored_run(store)  # once: labelled, then shown with what the labelling wrote
        with progress_bars() as progress:
            count = label_turns(store, args.labeller, classifier_path=args.classifier,
                                progress=progress, turns=run.turns)
        console.print(f"{count} label(s) added ({args.labeller}); nothing generated")
        from userturn.report.terminal import print_run
        from userturn.report.view import view_of

        print_run(view_of(run.relabelled(store)), console)
    return 0


def train_command(args: argparse.Namespace, console: Console) -> int:
    from userturn.cli.console import progress_bars
    from userturn.labels.fitting import fit_classifier, training_splits

    check_range("--c", args.c, low=0, low_open=True)
    refuse_to_replace(args.output, args.force)
    splits = training_splits(args.labelled, with_corpus=args.with_corpus)
    train, dev = len(splits.train), len(splits.dev)
    console.print(f"training on {train + dev if splits.small else train} turn(s), "
                  + ("checked by cross-validation by query" if splits.small else f"dev {dev}")
                  + f" ({splits.test} test rows left untouched)")
    readings = args.readings or args.output.with_name(args.output.name + ".readings.jsonl")
    with progress_bars() as progress:  # the bars every command shows
        fitted = fit_classifier(splits, args.labelled, c=args.c, context=args.context,
                                readings=readings, progress=progress)
    console.print(f"{fitted.checked}: {fitted.result.line()}  calibration error "
                  f"{fitted.result.ece:.3f}")
    print_per_label(fitted.result, console)
    fitted.model.save(args.output)
    console.print(f"wrote {args.output} (use it with --classifier {args.output})")
    return 0


def print_per_label(result: Any, console: Console) -> None:
    table = Table("label", "precision", "recall", "support")
    for name, row in result.per_label.items():
        table.add_row(name, *(_share(row[key]) for key in ("precision", "recall")),
                      str(row["support"]))
    console.print(table)


def _share(value: float) -> str:
    return "–" if value != value else f"{value:.2f}"  # nan: nothing predicted, or none there
