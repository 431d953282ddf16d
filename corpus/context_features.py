"""Cache the language-model context features of every corpus turn (labels/context.py).

    .venv/bin/python corpus/context_features.py [--corpus FILE] [--shard K --shards N]
    .venv/bin/python corpus/context_features.py --ship 576   # the shipped corpus's readings ->
                                                             # src/userturn/labels/corpus_readings.npz

Reading a turn in its context costs about two seconds on one CPU core here, so the features of
the corpus are computed once, in shards that can run side by side (one torch thread each), and
appended to ``corpus/work/context-features-K.jsonl`` as they come: a killed run resumes where it
stopped. Rows are keyed by a digest of (query, answer, user turn), so a rebuilt corpus reuses
every turn it still holds, and the readings shipped with the last corpus
(src/userturn/labels/corpus_readings.npz) count as read: on a fresh machine only the turns a new
round added are read. Training and the leave-one-model-out benchmark read both.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from userturn.labels.corpus import CORPUS_FILE  # noqa: E402
from userturn.labels.readings import read_cases, shipped_and_cached  # noqa: E402
from userturn.records import Case  # noqa: E402

CACHE = HERE / "work"
# Which turns first: the groups a held-out figure needs most, SmolLM2's many training turns last.
ORDER = {"qwen": 0, "human": 1, "authored": 2}


def rank(row: dict) -> tuple[int, int]:
    source = row.get("source") or {}
    kind = "qwen" if "qwen" in str(source.get("model", "")).lower() else source.get("kind", "")
    return ORDER.get(kind, 3), 0 if row.get("split") in ("dev", "test") else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS_FILE)
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--ship", type=int, metavar="DIMENSIONS", default=None,
                        help="write the cached readings of --corpus's turns (the first DIMENSIONS "
                        "of each hidden state) beside the shipped corpus; every turn must have one")
    args = parser.parse_args()
    if args.ship is not None:
        ship(args.corpus, args.ship)
        return
    import torch

    torch.set_num_threads(1)
    with gzip.open(args.corpus, "rt", encoding="utf-8") as handle:
        rows = sorted((json.loads(line) for line in handle), key=rank)
    mine = [r for i, r in enumerate(rows) if i % args.shards == args.shard]
    known = shipped_and_cached(cache_files())[0]
    read_cases([Case(r["query"], r["answer"], r["user_turn"], r["user_turn"]) for r in mine],
               CACHE / f"context-features-{args.shard}.jsonl", known,
               description=f"shard {args.shard}")


def ship(corpus: Path, dimensions: int) -> None:
    from userturn.labels.context import turn_key
    from userturn.labels.readings import CORPUS_READINGS, save_corpus_readings

    readings, scorers = shipped_and_cached(cache_files())
    with gzip.open(corpus, "rt", encoding="utf-8") as handle:
        keys = {turn_key(r["query"], r["answer"], r["user_turn"]) for r in map(json.loads, handle)}
    missing = keys - set(readings)
    if missing or len(scorers) != 1:
        raise SystemExit(f"{len(missing)} turns have no reading; scorers {sorted(scorers)}")
    save_corpus_readings({k: readings[k] for k in keys}, scorers.pop(), CORPUS_READINGS, dimensions)
    print(f"wrote {len(keys)} readings to {CORPUS_READINGS}")


def cache_files(folder: Path = CACHE) -> list[Path]:
    return sorted(folder.glob("context-features-*.jsonl"))


if __name__ == "__main__":
    main()
