"""The noise in the once-labelled train turns, per range of slices (docs/corpus.md).

    .venv/bin/python corpus/noise.py   # per round from round 5 (slice 18) on, then all of them

From slice 18 on, annotator A labels every turn and annotator B only the turns labelled twice
(dev, test, and a fixed-seed sample of the train turns; collect.py). A's agreement with the
adjudicated labels on the sampled train turns says how far a train turn that carries A's label
alone may be from the label a second annotator and an adjudicator would give it.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from build import agreement  # noqa: E402

from userturn.labels.corpus import CORPUS_FILE  # noqa: E402

# The first slice of each round since annotator B labels only a sample of the train turns.
ROUND_STARTS = (18, 23, 26, 28)  # rounds 5-7, round 8, round 9, round 10


def ranges() -> list[tuple[int, int]]:
    """Each round's slices, then every slice from the first round's on."""
    last = len(list((HERE / "annotations").glob("slice-*.jsonl")))
    ends = [start - 1 for start in ROUND_STARTS[1:]] + [last]
    return [*zip(ROUND_STARTS, ends), (ROUND_STARTS[0], last)]


def slice_ids(number: int) -> set[str]:
    path = HERE / "annotations" / f"slice-{number:02d}.jsonl"
    return {json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()}


def main() -> None:
    with gzip.open(CORPUS_FILE, "rt", encoding="utf-8") as handle:
        rows = {row["id"]: row for row in map(json.loads, handle)}
    for first, last in ranges():
        ids = set().union(*(slice_ids(n) for n in range(first, last + 1))) & set(rows)
        twice = sorted(k for k in ids if "B" in rows[k]["annotations"])
        sampled = [k for k in twice if rows[k]["split"] == "train"]
        a = {k: rows[k]["annotations"]["A"] for k in twice}
        b = {k: rows[k]["annotations"]["B"] for k in twice}
        final = {k: rows[k]["label"] for k in twice}
        print(f"slices {first}-{last}: {len(ids)} turns, {len(twice)} labelled twice "
              f"({sum(a[k] != b[k] for k in twice)} disagreements), {len(ids) - len(twice)} once")
        print("  A against B:                          ", agreement(a, b, twice))
        print("  A against adjudicated, sampled train: ", agreement(a, final, sampled))
        print("  A against adjudicated, every twice:   ", agreement(a, final, twice))


if __name__ == "__main__":
    main()
