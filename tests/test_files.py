"""The user's own data files: CSV/TSV/JSONL/JSON/Parquet, field mappings, malformed rows."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from userturn.data.files import file_items, parse_field_mappings
from userturn.data.reading import LoadResult, Skipped, recover_json_list
from userturn.errors import ConfigError, DatasetError

ROWS = [
    {"question": "What is 2 + 3?", "target": "5", "notes": "easy"},
    {"question": "Name a prime above 10.", "target": "11", "notes": ""},
    {"question": "Spell 'cat' backwards.", "target": "tac", "notes": "words"},
]
MAPPING = {"query": "question", "answer": "target"}


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _write_csv(path: Path, rows, delimiter: str = ",") -> Path:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _check(result: LoadResult, stem: str, unit: str, first: int) -> None:
    assert isinstance(result, LoadResult) and result.name == stem
    assert [item.id for item in result.items] == [f"{stem}-{n:04d}" for n in range(3)]
    assert [item.query for item in result.items] == [row["question"] for row in ROWS]
    assert [item.reference for item in result.items] == ["5", "11", "tac"]
    assert result.items[0].messages == ({"role": "user", "content": "What is 2 + 3?"},)
    assert [item.metadata[unit] for item in result.items] == [first, first + 1, first + 2]
    assert result.skipped == () and result.skipped_count == 0
    assert result.fields["query"] == "question" and result.fields["answer"] == "target"


def test_csv_with_field_mapping(tmp_path) -> None:
    path = _write_csv(tmp_path / "mine.csv", ROWS)
    result = file_items(path, fields=MAPPING)
    _check(result, "mine", "line", 2)  # line 1 is the header
    assert result.source == f"file {path.resolve()}"


def test_tsv_and_default_columns(tmp_path) -> None:
    # Without a mapping, query <- question and answer <- target are found by their default names.
    path = _write_csv(tmp_path / "tabs.tsv", ROWS, delimiter="\t")
    _check(file_items(path), "tabs", "line", 2)


def test_jsonl_and_json_with_field_mapping(tmp_path) -> None:
    _check(file_items(_write_jsonl(tmp_path / "rows.jsonl", ROWS), fields=MAPPING),
           "rows", "line", 1)
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps(ROWS), encoding="utf-8")
    _check(file_items(listed, fields=MAPPING), "listed", "row", 0)


def test_parquet_with_field_mapping(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "table.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    _check(file_items(path, fields=MAPPING), "table", "row", 0)


def test_parquet_numbers_ids_and_nulls(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "nums.parquet"
    rows = [{"prompt": "Half of 7?", "answer": 3.5, "id": 7},
            {"prompt": "Twice 4?", "answer": None, "id": 8}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = file_items(path)  # answer found by default: optional, so a null is no reference
    assert [(i.id, i.reference) for i in result.items] == [("7", "3.5"), ("8", None)]
    with pytest.raises(DatasetError, match=r"nums\.parquet row 1: field 'answer': missing"):
        file_items(path, fields={"query": "prompt", "answer": "answer"})  # named: required


def test_system_and_id_columns(tmp_path) -> None:
    rows = [{"prompt": "Hi?", "system": "Be brief.", "uid": "a-1", "reference": "Hello"},
            {"prompt": "Bye?", "system": "", "uid": "a-2"}]
    result = file_items(_write_jsonl(tmp_path / "sys.jsonl", rows), fields={"id": "uid"})
    first, second = result.items
    assert first.id == "a-1" and first.reference == "Hello"
    assert first.messages == ({"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Hi?"})
    assert second.id == "a-2" and second.reference is None
    assert second.messages == ({"role": "user", "content": "Bye?"},)
    assert result.fields == {"id": "uid", "query": "prompt", "answer": "reference",
                             "system": "system"}


def test_limit_keeps_a_prefix(tmp_path) -> None:
    path = _write_jsonl(tmp_path / "rows.jsonl", ROWS)
    full = file_items(path, fields=MAPPING).items
    assert file_items(path, fields=MAPPING, limit=2).items == full[:2]


BAD_UTF8 = b'{"question": "caf\xe9 au lait?", "target": "1"}'  # Latin-1, not UTF-8

# (file name, content, row label, field) for each kind of malformed row; the good rows are ROWS[0]
# and ROWS[2], written around the bad one so it is line 2 of the JSONL files.
MALFORMED = [
    ("missing.jsonl", {"target": "1"}, "line 2", "query", "missing"),
    ("wrong_type.jsonl", {"question": ["a", "list"], "target": "1"}, "line 2", "query",
     "expected text"),
    ("empty.jsonl", {"question": "   ", "target": "1"}, "line 2", "query", "empty text"),
    ("answer_type.jsonl", {"question": "Q?", "target": {"x": 1}}, "line 2", "answer",
     "expected text"),
    ("bad_utf8.jsonl", BAD_UTF8, "line 2", "query", "invalid UTF-8"),
    ("bad_json.jsonl", b'{"question": "unclosed', "line 2", None, "invalid JSON"),
    ("not_object.jsonl", [1, 2], "line 2", None, "expected an object"),
]


def _malformed_file(tmp_path: Path, name: str, bad) -> Path:
    good = [json.dumps(row).encode() for row in (ROWS[0], ROWS[2])]
    bad_line = bad if isinstance(bad, bytes) else json.dumps(bad).encode()
    path = tmp_path / name
    path.write_bytes(b"\n".join([good[0], bad_line, good[1]]) + b"\n")
    return path


@pytest.mark.parametrize(("name", "bad", "where", "field", "reason"), MALFORMED)
def test_malformed_row_names_file_row_and_field(tmp_path, name, bad, where, field, reason) -> None:
    path = _malformed_file(tmp_path, name, bad)
    with pytest.raises(DatasetError) as caught:
        file_items(path, fields=MAPPING)
    message = str(caught.value)
    assert str(path.resolve()) in message and f" {where}: " in message and reason in message
    if field is not None:
        assert f"field '{field}'" in message and "(column '" in message
    assert "\n" not in message


@pytest.mark.parametrize(("name", "bad", "where", "field", "reason"), MALFORMED)
def test_malformed_row_is_skipped_and_counted(tmp_path, name, bad, where, field, reason) -> None:
    path = _malformed_file(tmp_path, name, bad)
    result = file_items(path, fields=MAPPING, skip_invalid=True)
    assert [item.query for item in result.items] == [ROWS[0]["question"], ROWS[2]["question"]]
    # Ids count data rows, skipped ones included: the third row keeps its number.
    assert [item.id for item in result.items] == [f"{path.stem}-0000", f"{path.stem}-0002"]
    assert result.skipped_count == 1 and result.count("invalid") == 1
    skipped = result.skipped[0]
    assert (skipped.row, skipped.unit, skipped.field) == (2, "line", field)
    assert reason in skipped.reason and tuple(skipped[:3]) == (2, field, skipped.reason)
    assert any("skipped 1 rows (1 invalid); loaded 2" in note for note in result.notes)


def test_bad_utf8_in_csv_names_line_and_field(tmp_path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes(b"question,target\nWhat is 1+1?,2\nCaf\xe9?,3\n\nLast?,4\n")
    with pytest.raises(DatasetError, match=r"latin\.csv line 3: field 'query': invalid UTF-8 "
                                           r"\(byte 0xe9 at character 3\) \(column 'question'\)"):
        file_items(path, fields=MAPPING)
    result = file_items(path, fields=MAPPING, skip_invalid=True)
    assert [i.query for i in result.items] == ["What is 1+1?", "Last?"]
    assert result.skipped == (Skipped(3, "query", result.skipped[0].reason, "line"),)
    assert "byte 0xe9" in result.skipped[0].reason
    assert [i.metadata["line"] for i in result.items] == [2, 5]


def test_bad_utf8_in_an_unread_column_is_still_named(tmp_path) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"question": "Q?", "notes": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"line 2: field 'notes': invalid UTF-8"):
        file_items(path, fields={"query": "question"})


def test_csv_with_extra_cells_and_empty_cells(tmp_path) -> None:
    path = tmp_path / "cells.csv"
    path.write_text("question,target\nA?,1\nB?,2,surplus\nC?,\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"cells\.csv line 3: 3 cells but the header has 2"):
        file_items(path)
    # An empty answer cell: no reference by default, an error when the answer column is named.
    result = file_items(path, skip_invalid=True)
    assert [(i.query, i.reference) for i in result.items] == [("A?", "1"), ("C?", None)]
    named = file_items(path, fields=MAPPING, skip_invalid=True)
    assert [i.query for i in named.items] == ["A?"]
    assert [str(entry) for entry in named.skipped] == [
        "line 3: 3 cells but the header has 2 columns",
        "line 4: field 'answer': empty text (column 'target')",
    ]


def test_every_row_invalid_is_an_error_even_when_skipping(tmp_path) -> None:
    path = _write_jsonl(tmp_path / "hollow.jsonl", [{"question": ""}, {"question": None}])
    with pytest.raises(DatasetError, match=r"hollow\.jsonl: no usable row: all 2 skipped "
                                           r"\(2 invalid\); first: line 1: field 'query'"):
        file_items(path, skip_invalid=True)
    empty = tmp_path / "empty.csv"
    empty.write_text("question,target\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="no query column|no rows"):
        file_items(empty, skip_invalid=True)


def test_no_query_column_is_one_clear_error(tmp_path) -> None:
    path = _write_jsonl(tmp_path / "cols.jsonl", [{"text": "hi", "label": "x"}])
    with pytest.raises(DatasetError, match=r"no query column.*query, question, prompt.*"
                                           r"columns: text, label.*--field query=COLUMN"):
        file_items(path, skip_invalid=True)
    assert file_items(path, fields={"query": "text"}).items[0].query == "hi"


def test_duplicate_ids(tmp_path) -> None:
    path = _write_jsonl(tmp_path / "dupes.jsonl", [{"id": "a", "query": "1?"},
                                                   {"id": "a", "query": "2?"},
                                                   {"id": "b", "query": "3?"}])
    with pytest.raises(DatasetError, match=r"line 2: field 'id': duplicate id 'a'"):
        file_items(path)
    assert [i.id for i in file_items(path, skip_invalid=True).items] == ["a", "b"]


def test_missing_file_and_unsupported_suffix(tmp_path) -> None:
    with pytest.raises(DatasetError, match="not found: .*nowhere.csv"):
        file_items(tmp_path / "nowhere.csv")
    other = tmp_path / "data.xlsx"
    other.write_bytes(b"PK")
    with pytest.raises(DatasetError, match="unsupported file type"):
        file_items(other)
    with pytest.raises(ConfigError, match="unknown field.*'label'"):
        file_items(_write_jsonl(tmp_path / "ok.jsonl", ROWS), fields={"label": "target"})


def test_parse_field_mappings() -> None:
    assert parse_field_mappings(["query=question", " answer = target "]) == MAPPING
    assert parse_field_mappings([]) == {}
    assert parse_field_mappings(["query=question", "query=question"]) == {"query": "question"}
    for bad, pattern in [
        ("question", "write FIELD=COLUMN"), ("=question", "write FIELD=COLUMN"),
        ("query=", "write FIELD=COLUMN"), ("label=target", "unknown field 'label'.*query, answer"),
    ]:
        with pytest.raises(ConfigError, match=pattern):
            parse_field_mappings([bad])
    with pytest.raises(ConfigError, match="mapped twice"):
        parse_field_mappings(["query=question", "query=prompt"])


def test_recover_json_list() -> None:
    rows, recovery = recover_json_list('[{"a": 1}, {"a": 2}]')
    assert rows == [{"a": 1}, {"a": 2}] and recovery.complete and recovery.unread == 0
    rows, recovery = recover_json_list('[\n {"a": 1},\n {"a": [2, 3]},\n {"a": "cut')
    assert rows == [{"a": 1}, {"a": [2, 3]}]
    assert not recovery.complete and recovery.rows == 2
    assert recovery.unread == len('{"a": "cut')
    assert recover_json_list("[]")[0] == [] and recover_json_list("[]")[1].complete
    with pytest.raises(DatasetError, match="does not start with"):
        recover_json_list('{"a": 1}')
