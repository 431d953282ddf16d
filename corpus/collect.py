"""Pool the corpus's turns and cut blind annotation slices (docs/corpus.md).

    .venv/bin/python corpus/collect.py pool      # shipped corpus + runs + people -> corpus/work/pool.jsonl
    .venv/bin/python corpus/collect.py slice N   # the next N pooled turns no slice holds yet
    .venv/bin/python corpus/collect.py snapshot  # runs/corpus/qwen-* -> corpus/runs/*.db.gz (committed)

The second generator's run stores are committed as gzipped snapshots (corpus/runs/), so a later
session on a fresh machine pools their turns and resumes their generation where it stopped
(generate.py restores a missing store from its snapshot).

The pool starts from the shipped corpus (src/userturn/labels/corpus.jsonl.gz), so a machine without
the earlier rounds' run folders still pools every labelled turn under its id, and adds the turns of
whatever runs/corpus/* folders exist here.

A slice is written with nothing but id, query, answer and user turn (never the model, decoding,
perturbation or any label), in a different order for each annotator. Copy "a" holds every turn of
the slice. Copy "b" holds the turns that must be labelled twice: every dev and test turn (the split
is fixed by the query's hash before any model is fit) and a sample of SAMPLE_RATE of the train turns,
which measures the single annotator's agreement with adjudicated labels; the rest of the train turns
are labelled once, for volume (docs/corpus.md).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

from userturn.store.database import RunStore
from userturn.store.turns import read_turns

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
RUNS = (Path("runs/corpus/plain"), Path("runs/corpus/chats"), Path("runs/corpus/perturbed"),
        Path("runs/corpus/llamacpp"), Path("runs/corpus/conversations"),
        Path("runs/corpus/qwen-tasks"), Path("runs/corpus/qwen-chats"),
        Path("runs/corpus/qwen-perturbed"), Path("runs/corpus/qwen-conversations"))
AUTHORED = HERE / "authored.jsonl"


def turn_id(query: str, answer: str, user_turn: str) -> str:
    digest = hashlib.sha256(json.dumps([query, answer, user_turn]).encode()).hexdigest()
    return "t" + digest[:12]


SNAPSHOTS = HERE / "runs"


def snapshot() -> None:
    """A consistent gzipped copy of each qwen run store (safe while its generation runs)."""
    import gzip
    import sqlite3
    import tempfile

    SNAPSHOTS.mkdir(exist_ok=True)
    for folder in RUNS:
        db = folder / "userturn.db"
        if not folder.name.startswith("qwen") or not db.exists():
            continue
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "userturn.db"
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as src, sqlite3.connect(copy) as dst:
                src.backup(dst)
            with sqlite3.connect(copy) as dst:
                dst.execute("PRAGMA journal_mode=DELETE")
                turns = dst.execute("SELECT COUNT(*) FROM generations").fetchone()[0]
            target = SNAPSHOTS / f"{folder.name}.db.gz"
            with target.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9,
                                                         mtime=0) as out:
                out.write(copy.read_bytes())  # mtime 0: the same store gives the same bytes
        print(f"{target}: {turns} generations, {target.stat().st_size // 1024} KB")


def restore(folder: Path) -> bool:
    """Put a committed snapshot back where its run writes, if the store is missing."""
    import gzip

    target = SNAPSHOTS / f"{folder.name}.db.gz"
    if (folder / "userturn.db").exists() or not target.exists():
        return (folder / "userturn.db").exists()
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(target, "rb") as handle:
        (folder / "userturn.db").write_bytes(handle.read())
    return True


def generated_rows() -> list[dict]:
    rows = []
    for folder in RUNS:
        if not restore(folder):
            continue
        store = RunStore.read(folder)  # a reader: never writes into a run being generated
        for turn in read_turns(store):
            if turn.error is not None:
                continue
            kind = "human" if turn.model == "human" else "generated"
            rows.append({
                "query": turn.query, "answer": turn.answer, "user_turn": turn.user_turn,
                "source": {"kind": kind, "model": turn.model, "dataset": turn.dataset,
                           "item_id": turn.item_id, "temperature": turn.temperature,
                           "sample_index": turn.sample_index, "perturbation": turn.perturbation,
                           "finish_reason": turn.finish_reason}})
        store.close()
    return rows


# FastChat's sample conversations end 333 of their 384 distinct exchanges with one of two
# farewells: every exchange is kept, but each farewell text only this many times, so that the
# corpus's human turns are not two thirds the same sentence.
FAREWELL_CAP = 12
SAMPLE_RATE = 0.15


def human_rows(seed: int = 11) -> list[dict]:
    """Real next user turns that need no generated answer: MT-Bench's second turns after its
    reference answers (the questions that have one), and every distinct exchange of FastChat's
    sample conversations (Apache-2.0), farewells capped at FAREWELL_CAP each."""
    from userturn.data.conversations import mtbench_question_file

    rows = []
    questions = mtbench_question_file()
    for line in questions.read_text().splitlines():
        question = json.loads(line)
        references = question.get("reference") or []
        if references and references[0].strip():
            rows.append({"query": question["turns"][0], "answer": references[0],
                         "user_turn": question["turns"][1],
                         "source": {"kind": "human", "model": "human",
                                    "dataset": "mtbench-reference",
                                    "item_id": f"mtbench-{question['question_id']}"}})
    dummy = json.loads((questions.parents[4] / "data" / "dummy_conversation.json").read_text())
    triples = []
    for conversation in dummy:
        turns = [m["value"] for m in conversation["conversations"]]
        triples += [(conversation["id"], turns[i], turns[i + 1], turns[i + 2])
                    for i in range(0, len(turns) - 2, 2)]
    random.Random(seed).shuffle(triples)
    seen_turns: dict[str, int] = {}
    for item_id, query, answer, turn in triples:
        seen_turns[turn] = seen_turns.get(turn, 0) + 1
        if turn in ("Goodbye", "Have a nice day!") and seen_turns[turn] > FAREWELL_CAP:
            continue
        rows.append({"query": query, "answer": answer, "user_turn": turn,
                     "source": {"kind": "human", "model": "human",
                                "dataset": "fastchat-dummy", "item_id": item_id}})
    return rows


def authored_rows() -> list[dict]:
    if not AUTHORED.exists():
        return []
    rows = []
    for line in AUTHORED.read_text().splitlines():
        if line.strip():
            case = json.loads(line)
            rows.append({"query": case["query"], "answer": case["answer"],
                         "user_turn": case["user_turn"],
                         "source": {"kind": "authored", "model": "authored",
                                    "dataset": "authored", "item_id": case["id"],
                                    "intended_label": case["intended_label"]}})
    return rows


def shipped_rows() -> list[dict]:
    """Every turn of the shipped corpus, under its id (its text, with the source it was pooled from)."""
    import gzip

    from userturn.labels.corpus import CORPUS_FILE

    with gzip.open(CORPUS_FILE, "rt", encoding="utf-8") as handle:
        return [{"query": r["query"], "answer": r["answer"], "user_turn": r["user_turn"],
                 "source": r["source"]} for r in map(json.loads, handle)]


def pool() -> None:
    WORK.mkdir(exist_ok=True)
    seen: dict[str, dict] = {}
    for row in [*shipped_rows(), *generated_rows(), *human_rows(), *authored_rows()]:
        key = turn_id(row["query"], row["answer"], row["user_turn"])
        if key in seen:
            seen[key].setdefault("duplicates", []).append(row["source"])
            continue
        seen[key] = {"id": key, **row}
    path = WORK / "pool.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in seen.values()))
    kinds: dict[str, int] = {}
    for row in seen.values():
        kinds[row["source"]["kind"]] = kinds.get(row["source"]["kind"], 0) + 1
    print(f"{len(seen)} distinct turns in {path}: {kinds}")


def sliced_ids() -> set[str]:
    ids = set()
    for path in (HERE / "annotations").glob("slice-*.jsonl"):
        ids.update(json.loads(line)["id"] for line in path.read_text().splitlines() if line)
    return ids


def cut_slice(size: int) -> None:
    rows = [json.loads(line) for line in (WORK / "pool.jsonl").read_text().splitlines() if line]
    done = sliced_ids()
    fresh = [r for r in rows if r["id"] not in done][:size]
    if not fresh:
        print("nothing left to slice")
        return
    number = len(list((HERE / "annotations").glob("slice-*.jsonl"))) + 1
    blind = [{"id": r["id"], "query": r["query"], "answer": r["answer"],
              "user_turn": r["user_turn"]} for r in fresh]
    twice = {r["id"] for r in fresh if labelled_twice(r, number)}
    (HERE / "annotations" / f"slice-{number:02d}.jsonl").write_text(
        "".join(json.dumps({"id": r["id"], "twice": r["id"] in twice}) + "\n" for r in blind))
    for copy, seed in (("a", 1000 + number), ("b", 2000 + number)):
        order = [r for r in blind if copy == "a" or r["id"] in twice]
        random.Random(seed).shuffle(order)
        path = WORK / f"blind-{number:02d}{copy}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in order))
        print(f"{path}: {len(order)} turns")


def labelled_twice(row: dict, slice_number: int) -> bool:
    """Dev and test turns always; a fixed-seed sample of the train turns (the single annotator's
    agreement is measured on it)."""
    from userturn.labels.training import group_of, split_of

    if split_of(group_of(row["query"])) != "train":
        return True
    return random.Random(f"{slice_number}:{row['id']}").random() < SAMPLE_RATE


if __name__ == "__main__":
    if sys.argv[1:2] == ["pool"]:
        pool()
    elif sys.argv[1:2] == ["snapshot"]:
        snapshot()
    elif sys.argv[1:2] == ["slice"] and len(sys.argv) == 3:
        cut_slice(int(sys.argv[2]))
    else:
        sys.exit(__doc__)
