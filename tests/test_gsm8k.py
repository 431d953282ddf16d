"""GSM8K answer extraction, scoring and loading (GSM-Symbolic offline, local files, the hub)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from userturn.data import Dataset, load_dataset
from userturn.data.gsm8k import GSM8KScorer, extract_answer, normalize_number
from userturn.errors import DatasetError
from userturn.records import Item

# (model answer, expected extraction): the kinds of replies chat models give to GSM8K problems.
MODEL_ANSWERS = [
    # the strict GSM8K form
    ("Natalia sold 48/2 = 24 clips in May.\nAltogether she sold 48+24 = 72 clips.\n#### 72", "72"),
    ("She earns 12 * 50 = 600 per week.\n#### 1,234", "1234"),
    ("#### $18.00", "18"),
    ("First 5 + 3 = 8.\n#### -7\nNote: 9 of the apples were green.", "-7"),
    ("Wrong start #### 5\nLet me redo it: 6 * 7 = 42\n#### 42", "42"),
    # boxed
    ("We compute $3 \\times 4 = 12$, then $12 + 6 = 18$. So the total is $\\boxed{18}$.", "18"),
    ("Total cost: $2,400 + $600 = $3,000.\n\n\\[\\boxed{3{,}000}\\]", "3000"),
    ("She ate $\\frac{3}{4}$ of the cake, so \\boxed{\\frac{3}{4}}", "3/4"),
    ("The total is \\boxed{\\$1,250.50} dollars.", "1250.5"),
    ("The change in temperature is \\boxed{-15} degrees.", "-15"),
    # "the answer is" / "answer:"
    ("Janet has 16 eggs, eats 3 and bakes with 4, so 16 - 3 - 4 = 9 remain. 9 * 2 = 18.\n"
     "The answer is 18.", "18"),
    ("He runs 3 sprints 3 times a week, 60 meters each: 3 * 3 * 60 = 540.\n"
     "The answer is: 540 meters", "540"),
    ("**Final Answer:** $1,080", "1080"),
    ("**Answer**: 25%", "25"),
    ("The answer is 5. Wait, I forgot the 2 extra.\nThe answer is 7", "7"),
    ("Step 1: 20 * 0.25 = 5\nStep 2: 20 - 5 = 15\n\nFinal answer:\n\n15 students", "15"),
    ("The answer is 3.50 dollars.", "3.5"),
    ("answer = 0.0", "0"),
    # the last number in the text
    ("Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 0.2 x 50 = $10.",
     "10"),
    ("Betty has 100 / 2 = 50 dollars. Her grandparents give 15 * 2 = 30. "
     "She needs 100 - 50 - 30 - 15 = 5 more.", "5"),
    ("So, in total, the farm produced 1,234,567 eggs.", "1234567"),
    ("The temperature dropped from 5 to -3, a change of 8 degrees.", "8"),
    ("James writes 3 pages to 2 friends twice a week, so 3*2*2 = 12 pages a week, "
     "and 12 * 52 = 624 pages a year.", "624"),
    ("She pays 15% of $1,200, which is $180.", "180"),
    ("3/4", "3/4"),
    ("He poured 3/4 of the 8 cups, i.e. 6 cups.", "6"),
    ("Total: 42.", "42"),
    ("It costs 2.50 + 1.50 = 4.00", "4"),
    # no number at all
    ("I'm sorry, I cannot solve this problem without more information.", None),
    ("", None),
]


@pytest.mark.parametrize(("answer", "expected"), MODEL_ANSWERS)
def test_extract_answer(answer: str, expected: str | None) -> None:
    assert extract_answer(answer) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,234", "1234"), ("$18.00", "18"), ("3.50", "3.5"), ("-7", "-7"), ("12 apples", "12"),
        ("18.", "18"), ("50%", "50"), ("6/8", "3/4"), ("4/2", "2"), ("€1,000,000", "1000000"),
        ("−5", "-5"), ("-0", "0"), ("100", "100"), ("no number", None),
    ],
)
def test_normalize_number(text: str, expected: str | None) -> None:
    assert normalize_number(text) == expected


def _item(reference: str) -> Item:
    return Item("x-0000", ({"role": "user", "content": "How many?"},), reference)


def test_scorer_marks_correct_and_incorrect() -> None:
    scorer = GSM8KScorer()
    assert scorer.name == "gsm8k"
    right = scorer.score(_item("18"), "9 * 2 = 18 dollars.\n#### 18.0")
    assert (right.correct, right.extracted, right.reference) == (True, "18", "18")
    wrong = scorer.score(_item("18"), "The answer is 16.")
    assert (wrong.correct, wrong.extracted) == (False, "16")
    assert scorer.score(_item("0.75"), "\\boxed{\\frac{3}{4}}").correct
    assert not scorer.score(_item("18"), "I don't know.").correct


def test_gsm_symbolic_is_deterministic_and_self_consistent() -> None:
    first = load_dataset("gsm_symbolic", limit=5, seed=0)
    again = load_dataset("gsm_symbolic", limit=5, seed=0)
    other = load_dataset("gsm_symbolic", limit=5, seed=1)
    assert isinstance(first, Dataset) and first.name == "gsm_symbolic"
    assert len(first.items) == 5 and first.items == again.items
    assert [i.query for i in first.items] != [i.query for i in other.items]
    assert [i.id for i in first.items] == [f"gsm_symbolic-s0-{n:04d}" for n in range(5)]
    assert first.source == "reasoning-gym gsm_symbolic seed=0"
    for item in first.items:
        assert item.messages[0]["role"] == "user" and item.query.strip()
        assert normalize_number(item.reference) == item.reference
        assert first.scorer.score(item, item.metadata["solution"]).correct


def test_gsm_symbolic_limit_is_a_prefix() -> None:
    three = load_dataset("gsm_symbolic", limit=3, seed=0).items
    assert three == load_dataset("gsm_symbolic", limit=5, seed=0).items[:3]


ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A book costs $1,200. Two cost?", "answer": "2 * 1200 = 2400\n#### 2,400"},
    {"question": "Half of 7?", "answer": 3.5},
    {"id": "custom-9", "question": "What is 10 - 12?", "answer": "-2"},
]


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def _check_rows(dataset: Dataset, stem: str) -> None:
    assert dataset.name == stem
    ids = [f"{stem}-0000", f"{stem}-0001", f"{stem}-0002", "custom-9"]
    assert [i.id for i in dataset.items] == ids
    assert [i.reference for i in dataset.items] == ["7", "2400", "3.5", "-2"]
    assert dataset.items[1].metadata["solution"] == ROWS[1]["answer"]
    assert dataset.items[0].messages == ({"role": "user", "content": ROWS[0]["question"]},)


def test_local_jsonl_loads(tmp_path) -> None:
    path = tmp_path / "mine.jsonl"
    _write_jsonl(path, ROWS)
    dataset = load_dataset(str(path))
    _check_rows(dataset, "mine")
    assert dataset.source == f"file {path.resolve()}"
    assert len(load_dataset(str(path), limit=2).items) == 2


def test_local_ndjson_loads_as_jsonl(tmp_path) -> None:
    # .ndjson is JSON Lines to every reader: the same GSM8K items and scorer as a .jsonl copy.
    path = tmp_path / "mine.ndjson"
    _write_jsonl(path, ROWS)
    dataset = load_dataset(str(path))
    _check_rows(dataset, "mine")
    assert dataset.items[1].metadata["line"] == 2
    assert isinstance(dataset.scorer, GSM8KScorer)
    assert load_dataset(f"gsm8k:{path}").items == dataset.items


def test_local_json_list_loads(tmp_path) -> None:
    path = tmp_path / "listed.json"
    path.write_text(json.dumps(ROWS), encoding="utf-8")
    _check_rows(load_dataset(str(path)), "listed")


def test_local_parquet_loads(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{**row, "answer": str(row["answer"]), "id": row.get("id")} for row in ROWS]
    path = tmp_path / "table.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    _check_rows(load_dataset(str(path)), "table")


@pytest.mark.parametrize(
    ("rows", "where", "field"),
    [
        ([ROWS[0], {"answer": "#### 3"}], "line 2", "question"),
        ([ROWS[0], ROWS[1], {"question": "  ", "answer": "#### 3"}], "line 3", "question"),
        ([{"question": "How many?"}], "line 1", "answer"),
        ([{"question": "How many?", "answer": "lots"}], "line 1", "answer"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, rows, where, field) -> None:
    path = tmp_path / "bad.jsonl"
    _write_jsonl(path, rows)
    with pytest.raises(DatasetError) as caught:
        load_dataset(str(path))
    message = str(caught.value)
    assert str(path.resolve()) in message and where in message and f"'{field}'" in message


def test_invalid_json_line_is_named(tmp_path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + '\n{"question": "oops\n')
    with pytest.raises(DatasetError, match=r"broken\.jsonl line 3: invalid JSON"):
        load_dataset(str(path))


def test_malformed_parquet_row_is_named(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "holes.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "Q?", "answer": "#### 1"},
                                         {"question": None, "answer": "#### 2"}]), path)
    with pytest.raises(DatasetError, match=r"holes\.parquet row 1: missing field 'question'"):
        load_dataset(str(path))


def test_duplicate_ids_are_rejected(tmp_path) -> None:
    path = tmp_path / "dupes.jsonl"
    _write_jsonl(path, [{**ROWS[0], "id": "a"}, {**ROWS[1], "id": "a"}])
    with pytest.raises(DatasetError, match="line 2: duplicate id 'a'"):
        load_dataset(str(path))


def test_missing_file_and_unknown_spec(tmp_path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(DatasetError, match="not found: .*nowhere.jsonl"):
        load_dataset(str(missing))
    with pytest.raises(DatasetError, match="unknown dataset 'mmlu'.*userturn datasets"):
        load_dataset("mmlu")
    with pytest.raises(DatasetError, match="at least 1"):
        load_dataset("gsm_symbolic", limit=0)
    with pytest.raises(DatasetError, match="dataset ifbench takes no file"):
        load_dataset(f"ifbench:{missing}")
    with pytest.raises(DatasetError, match="dataset coval needs a file: coval:PATH"):
        load_dataset("coval")


def test_gsm8k_hub_unreachable_is_one_clear_error(monkeypatch) -> None:
    # No network here: offline mode makes a real `datasets` fail at once instead of retrying.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetError) as caught:
        load_dataset("gsm8k", limit=3)
    message = str(caught.value)
    assert "\n" not in message and "gsm_symbolic" in message
    try:
        import datasets  # noqa: F401
    except ImportError:
        assert "'datasets' package" in message and "not installed" in message
    else:
        assert "openai/gsm8k" in message


def _fake_datasets(monkeypatch, load) -> None:
    module = types.ModuleType("datasets")
    module.load_dataset = load
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_gsm8k_hub_failure_is_wrapped(monkeypatch) -> None:
    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    _fake_datasets(monkeypatch, unreachable)
    expected = r"cannot load openai/gsm8k .*Couldn't reach.*gsm_symbolic"
    with pytest.raises(DatasetError, match=expected):
        load_dataset("gsm8k")


def test_gsm8k_hub_rows_become_items(monkeypatch) -> None:
    calls = []

    def load(name, config, split):
        calls.append((name, config, split))
        return [{"question": f"Q{n}?", "answer": f"n = {n}\n#### {n}"} for n in range(10)]

    _fake_datasets(monkeypatch, load)
    dataset = load_dataset("gsm8k", limit=3, split="train")
    assert calls == [("openai/gsm8k", "main", "train")]
    assert [i.id for i in dataset.items] == [f"gsm8k-train-{n:04d}" for n in range(3)]
    assert [i.reference for i in dataset.items] == ["0", "1", "2"]
    assert dataset.source == "hub openai/gsm8k main/train" and dataset.name == "gsm8k"
