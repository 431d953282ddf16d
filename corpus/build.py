"""Join the pooled turns with both annotators' labels and the adjudications into the corpus.

    .venv/bin/python corpus/build.py disagreements   # corpus/work/disagreements.jsonl for the adjudicator
    .venv/bin/python corpus/build.py                 # agreement figures + src/userturn/labels/corpus.jsonl.gz
    .venv/bin/python corpus/build.py --out FILE      # the same corpus into FILE (the shipped one untouched)

Annotator A labelled every slice's copy "a", annotator B its copy "b" (corpus/annotations/). From
slice 18 on, copy "b" holds only the turns to be labelled twice (every dev and test turn and a
sample of the train turns, collect.py); the other train turns carry A's label alone, marked so.
Splits are drawn by query with a fixed hash (userturn.labels.training.split_of): 20% test, 15%
dev, the rest train, decided by the query text alone before any model is fit.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path

from userturn.labels.corpus import CORPUS_FILE
from userturn.labels.training import group_of, split_of
from userturn.records import LABELS
from userturn.stats.agreement import cohen_kappa, confusion_matrix

HERE = Path(__file__).resolve().parent
ANNOTATIONS = HERE / "annotations"
WORK = HERE / "work"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def annotations(copy: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for path in sorted(ANNOTATIONS.glob(f"labels-*{copy}.jsonl")):
        for row in _jsonl(path):
            if row["label"] not in LABELS:
                raise SystemExit(f"{path}: {row['id']}: label {row['label']!r} is not in labels.md")
            labels[row["id"]] = row["label"]
    return labels


def both() -> tuple[dict[str, dict], dict[str, str], dict[str, str]]:
    pool = {row["id"]: row for row in _jsonl(WORK / "pool.jsonl")}
    a, b = annotations("a"), annotations("b")
    return pool, a, b


def disagreements() -> None:
    pool, a, b = both()
    rows = [{"id": key, "query": pool[key]["query"], "answer": pool[key]["answer"],
             "user_turn": pool[key]["user_turn"], "label_1": a[key], "label_2": b[key]}
            for key in a if key in b and a[key] != b[key]]
    path = WORK / "disagreements.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} disagreements of {sum(k in b for k in a)} doubly labelled turns -> {path}")


def agreement(a: dict[str, str], b: dict[str, str], keys: list[str]) -> str:
    pairs = [(a[k], b[k]) for k in keys]
    binary = [("f" if x == "follow_up" else "r", "f" if y == "follow_up" else "r")
              for x, y in pairs]
    agree = sum(x == y for x, y in pairs) / len(pairs)
    return (f"n={len(pairs)}  raw agreement {agree:.3f}  kappa 7-way {cohen_kappa(pairs):.3f}  "
            f"kappa follow-up vs rest {cohen_kappa(binary, ('f', 'r')):.3f}")


def build(out: Path = CORPUS_FILE) -> None:
    pool, a, b = both()
    adjudicated = {}
    for path in sorted(ANNOTATIONS.glob("adjudicated*.jsonl")):
        adjudicated.update({row["id"]: row for row in _jsonl(path)})
    keys = [k for k in pool if k in a and k in b]
    single = [k for k in pool if k in a and k not in b and not labelled_twice(k)]
    missing = [k for k in keys if a[k] != b[k] and k not in adjudicated]
    if missing:
        raise SystemExit(f"{len(missing)} disagreements are not adjudicated yet")
    print("annotator agreement before adjudication:", agreement(a, b, keys))
    by_kind: dict[str, list[str]] = {}
    for k in keys:
        by_kind.setdefault(pool[k]["source"]["kind"], []).append(k)
    for kind, ks in sorted(by_kind.items()):
        print(f"  {kind:<10}", agreement(a, b, ks))
    matrix = confusion_matrix([(a[k], b[k]) for k in keys])
    print("confusion (rows A, columns B):", " ".join(label[:6] for label in LABELS))
    for label, row in zip(LABELS, matrix):
        print(f"  {label:<16}", " ".join(f"{v:>6}" for v in row))
    rows = []
    for k in [*keys, *single]:
        turn = pool[k]
        if k not in b:
            label, how = a[k], "one annotator (train split)"
        elif a[k] == b[k]:
            label, how = a[k], "both annotators agreed"
        else:
            label, how = adjudicated[k]["label"], "adjudicated: " + adjudicated[k].get("how", "")
        group = group_of(turn["query"])
        rows.append({"id": k, "query": turn["query"], "answer": turn["answer"],
                     "user_turn": turn["user_turn"], "label": label,
                     "annotations": {"A": a[k], **({"B": b[k]} if k in b else {})}, "how": how,
                     "split": split_of(group), "source": turn["source"]})
    final = {row["id"]: row["label"] for row in rows}
    print(f"labelled once (train split): {len(single)} turns")
    sampled = [k for k in keys if split_of(group_of(pool[k]["query"])) == "train"]
    if sampled:  # the noise in the once-labelled train turns: A against the adjudicated labels
        print("annotator A on doubly labelled train turns:", agreement(a, final, sampled))
    for name, labels in (("A", a), ("B", b)):  # the ceiling a labeller is scored against
        print(f"annotator {name} against the adjudicated labels:", agreement(labels, final, keys))
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} turns to {out}")
    counts = Counter((r["split"], r["label"]) for r in rows)
    kinds = Counter((r["split"], r["source"]["kind"]) for r in rows)
    print("labels per split:")
    for split in ("train", "dev", "test"):
        print(f"  {split:<5}", "  ".join(f"{label} {counts[split, label]}" for label in LABELS),
              "|", "  ".join(f"{kind} {kinds[split, kind]}"
                             for kind in ("generated", "human", "authored")))
    print("labels in all:", dict(Counter(r["label"] for r in rows)))
    print("labels per generator (the data card's table):")
    by = Counter((generator_of(r["source"]), r["label"]) for r in rows)
    for generator in sorted({g for g, _ in by}):
        total = sum(n for (g, _), n in by.items() if g == generator)
        print(f"  {generator:<22} {total:>5}  " + "  ".join(
            f"{label} {by[generator, label]}" for label in LABELS))


def generator_of(source: dict) -> str:
    """Which model (or people, or authors) wrote a turn: SmolLM2 through transformers or as a
    GGUF, Qwen2.5-Coder-1.5B, people, authored."""
    if source.get("kind") != "generated":
        return str(source.get("kind"))
    model = str(source.get("model", "")).lower()
    return ("qwen2.5-coder-1.5b" if "qwen" in model else
            "smollm2 (gguf)" if model.startswith("llamacpp/") else model or "unknown")


def labelled_twice(key: str) -> bool:
    """Whether the slice that holds ``key`` asked for two annotators (slices before 18 always did)."""
    global _TWICE
    if _TWICE is None:
        _TWICE = {}
        for path in ANNOTATIONS.glob("slice-*.jsonl"):
            for row in _jsonl(path):
                _TWICE[row["id"]] = row.get("twice", True)
    return _TWICE.get(key, True)


_TWICE: dict[str, bool] | None = None


if __name__ == "__main__":
    if sys.argv[1:] == ["disagreements"]:
        disagreements()
    elif sys.argv[1:2] == ["--out"] and len(sys.argv) == 3:
        build(Path(sys.argv[2]))
    else:
        build()
