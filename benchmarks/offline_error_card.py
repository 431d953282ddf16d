"""The offline labeller's measured error, as the summary and the report show it beside a rate.

    .venv/bin/python benchmarks/offline_error_card.py corpus/lomo_round10.txt \
        --unseen corpus/unseen_people.txt > src/userturn/labels/offline_error.json

Reads the output of ``benchmarks/leave_one_model_out.py --context`` (the table it prints) and
keeps, for the shipped default labeller (``cascade (+context+hidden)``) and the form-only one
(``cascade (features-lr)``), each held-out group's kappa (7-way and follow-up vs rest) and the
per-condition gaps between the follow-up rate it printed and the adjudicated rate (conditions of
40 or more turns). ``--unseen`` adds what ``benchmarks/unseen_people.py`` printed for the shipped
cascade on people's ShareGPT turns (one condition: the whole set), a source no labeller was fit
to. A run labelled offline alone shows these figures, so that its rates are never read as more
certain than the labeller is on a model it was not fit to.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Sequence

LABELLERS = {"context": "cascade (+context+hidden)", "form": "cascade (features-lr)"}
GROUPS = {"smollm2": "SmolLM2-135M", "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B", "human": "people"}
_KAPPA_ROW = re.compile(r"^\| (\S+) \| (.+?) \| (\d+) \| ([-\d.]+) \[.*?\] \| ([-\d.]+) \[")
_UNSEEN_ROW = re.compile(r"^\| cascade \| (\d+) \| ([-\d.]+) \[.*?\] \| ([-\d.]+) \[.*\| "
                         r"([\d.]+)% vs ([\d.]+)% \|$")
UNSEEN_GROUP = "people (ShareGPT)"
_GAP_ROW = re.compile(r"^\| (\S+) \| (.+?) \| (.+?) \| (\d+) \| .*? \| .*? \| ([-+\d.]+) \|$")


def card(text: str, source: str) -> dict:
    folds: dict[str, dict[str, dict]] = {name: {} for name in LABELLERS}
    for line in text.splitlines():
        for name, labeller in LABELLERS.items():
            kappa = _KAPPA_ROW.match(line)
            if kappa and kappa.group(2) == labeller and kappa.group(1) in GROUPS:
                folds[name].setdefault(GROUPS[kappa.group(1)], {}).update(
                    turns=int(kappa.group(3)), kappa=float(kappa.group(4)),
                    kappa_follow_up=float(kappa.group(5)))
            gap = _GAP_ROW.match(line)
            if (gap and gap.group(2) == labeller and gap.group(1) in GROUPS
                    and "(n < " not in gap.group(3)):
                folds[name].setdefault(GROUPS[gap.group(1)], {}).setdefault(
                    "gaps", []).append(float(gap.group(5)))
    if not all(folds[name] for name in LABELLERS):
        raise SystemExit("no leave-one-model-out rows for both labellers: run "
                         "benchmarks/leave_one_model_out.py --context and pass its output")
    return {"source": source, "labellers": folds}


def unseen_fold(text: str) -> dict:
    """The shipped cascade's row of ``benchmarks/unseen_people.py``'s output, as a card's fold."""
    row = next(filter(None, map(_UNSEEN_ROW.match, text.splitlines())), None)
    if row is None:
        raise SystemExit("no '| cascade |' row with a follow-up rate: pass what "
                         "benchmarks/unseen_people.py printed")
    return {"turns": int(row.group(1)), "kappa": float(row.group(2)),
            "kappa_follow_up": float(row.group(3)),
            "gaps": [round(float(row.group(4)) - float(row.group(5)), 1)]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="what leave_one_model_out.py --context printed")
    parser.add_argument("--unseen", type=Path, default=None,
                        help="what benchmarks/unseen_people.py printed (people's ShareGPT turns)")
    args = parser.parse_args(argv)
    source = f"benchmarks/leave_one_model_out.py --context ({args.output.name})"
    result = card(args.output.read_text(encoding="utf-8"), source)
    if args.unseen is not None:  # the shipped default labeller is the context one
        result["labellers"]["context"][UNSEEN_GROUP] = unseen_fold(
            args.unseen.read_text(encoding="utf-8"))
        result["source"] += f"; benchmarks/unseen_people.py ({args.unseen.name})"
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
