"""Pool the corpus's turns and cut blind annotation slices (docs/corpus.md).

    .venv/bin/python corpus/collect.py pool      # runs/corpus/* + corpus/authored.jsonl -> corpus/work/pool.jsonl
    .venv/bin/python corpus/collect.py slice N   # the next N pooled turns no slice holds yet

A slice is written twice, in two different orders, with nothing but id, query, answer and user
turn (never the model, decoding, perturbation or any label): one copy per annotator.
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


def generated_rows() -> list[dict]:
    rows = []
    for folder in RUNS:
        if not (folder / "userturn.db").exists():
            continue
        store = RunStore.open(folder)
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


def human_rows(conversations: int = 40, seed: int = 11) -> list[dict]:
    """Real next user turns that need no generated answer: MT-Bench's second turns after its
    reference answers (the questions that have one), and a sample of FastChat's sample
    conversations (mostly "Goodbye" after identity questions: a few go a long way)."""
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
    for item_id, query, answer, turn in random.Random(seed).sample(triples, conversations):
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


def pool() -> None:
    WORK.mkdir(exist_ok=True)
    seen: dict[str, dict] = {}
    for row in [*generated_rows(), *human_rows(), *authored_rows()]:
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
    (HERE / "annotations" / f"slice-{number:02d}.jsonl").write_text(
        "".join(json.dumps({"id": r["id"]}) + "\n" for r in blind))
    for copy, seed in (("a", 1000 + number), ("b", 2000 + number)):
        order = blind[:]
        random.Random(seed).shuffle(order)
        path = WORK / f"blind-{number:02d}{copy}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in order))
        print(f"{path}: {len(order)} turns")


if __name__ == "__main__":
    if sys.argv[1:2] == ["pool"]:
        pool()
    elif sys.argv[1:2] == ["slice"] and len(sys.argv) == 3:
        cut_slice(int(sys.argv[2]))
    else:
        sys.exit(__doc__)
