"""Cache the language-model context features of every corpus turn (labels/context.py).

    .venv/bin/python corpus/context_features.py [--corpus FILE] [--shard K --shards N]

Reading a turn in its context costs about two seconds on one CPU core here, so the features of
the corpus are computed once, in shards that can run side by side (one torch thread each), and
appended to ``corpus/work/context-features-K.jsonl`` as they come: a killed run resumes where it
stopped. Rows are keyed by a digest of (query, answer, user turn), so a rebuilt corpus reuses
every turn it still holds. Training and the leave-one-model-out benchmark read the cache through
:func:`load_cache`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from userturn.labels.context import load_readings, read_cases  # noqa: E402
from userturn.labels.corpus import CORPUS_FILE  # noqa: E402
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
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    with gzip.open(args.corpus, "rt", encoding="utf-8") as handle:
        rows = sorted((json.loads(line) for line in handle), key=rank)
    mine = [r for i, r in enumerate(rows) if i % args.shards == args.shard]
    known = load_readings(cache_files())[0]
    read_cases([Case(r["query"], r["answer"], r["user_turn"], r["user_turn"]) for r in mine],
               CACHE / f"context-features-{args.shard}.jsonl", known,
               description=f"shard {args.shard}")


def cache_files(folder: Path = CACHE) -> list[Path]:
    return sorted(folder.glob("context-features-*.jsonl"))


if __name__ == "__main__":
    main()
