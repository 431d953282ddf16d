"""The user's own data files (CSV, TSV, JSONL, JSON, Parquet), and the row reading and collecting
that the conversation loaders share.

``file_items`` turns rows into single-turn items: a ``query`` (required), an optional reference
``answer``, ``id`` and ``system`` prompt, each read from a column that ``fields`` names (by default:
query <- ``query`` | ``question`` | ``prompt``; answer <- ``answer`` | ``target`` | ``reference``;
id <- ``id``; system <- ``system``).

Row numbers in messages and in ``Skipped`` follow the GSM8K loader: a JSONL or CSV row by its
1-based line (what an editor shows; for CSV the line its record starts on, the header being line 1),
a JSON or Parquet row by its 0-based index (what ``data[i]`` and pandas show). Generated ids count
data rows from 0 (``<name>-0000``), skipped rows included, so skipping a row never renames the ones
after it.

Malformed rows (a missing field, a wrong type, empty text, bytes that are not UTF-8, a line that is
not JSON) raise ``DatasetError`` naming the file, the row and the field; with ``skip_invalid`` they
are recorded in ``LoadResult.skipped`` and counted instead. A file none of whose rows is valid is an
error either way: nothing is half-loaded silently.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from userturn.data.rows import (
    ALL_FORMATS,
    FILE_SUFFIXES,
    FileFormat,
    existing_file,
    file_format,
    invalid_json,
    json_lines,
    parquet_records,
    read_bytes,
    row_list,
)
from userturn.errors import ConfigError, DatasetError
from userturn.records import Item

# userturn's fields and the columns tried, in order, when ``fields`` does not name one.
FIELD_DEFAULTS: Mapping[str, tuple[str, ...]] = {
    "query": ("query", "question", "prompt"),
    "answer": ("answer", "target", "reference"),
    "id": ("id",),
    "system": ("system",),
}
REQUIRED_FIELDS = ("query",)
SUFFIXES = FILE_SUFFIXES

# Undecodable bytes survive decoding as lone surrogates (errors="surrogateescape"), so that the
# error can name the row and the field they sit in instead of failing the whole file.
_SURROGATE = re.compile("[\ud800-\udfff]")


class Skipped(NamedTuple):
    """A row left out: where it is, which field is at fault (None: the whole row), and why.

    ``kind`` is ``invalid`` (malformed data: an error unless invalid rows are skipped), or one of
    the shapes a conversation loader always skips and counts: ``too_short`` (fewer user turns than
    the probe context asks for) and ``assistant_first`` (the conversation opens with the assistant,
    as the continuation chunks of ShareGPT's split conversations do).
    """

    row: int
    field: str | None
    reason: str
    unit: str = "row"
    kind: str = "invalid"

    def __str__(self) -> str:
        where = f"{self.unit} {self.row}"
        if self.field:
            return f"{where}: field '{self.field}': {self.reason}"
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class LoadResult:
    """The items of a file and what was left out of it.

    ``fields`` is the column each userturn field was read from (files only). ``recovered`` is set
    when a JSON list was truncated: how many complete rows were read before the cut.
    ``notes`` are one-line remarks a CLI should print (a truncation, a skip count).
    """

    name: str
    items: tuple[Item, ...]
    source: str
    skipped: tuple[Skipped, ...] = ()
    fields: Mapping[str, str] = field(default_factory=dict)
    recovered: int | None = None
    notes: tuple[str, ...] = ()

    @property
    def skipped_count(self) -> int:
        return len(self.skipped)

    def count(self, kind: str) -> int:
        """How many rows were skipped as ``kind``: invalid, too_short or assistant_first."""
        return sum(1 for entry in self.skipped if entry.kind == kind)


class RowError(Exception):
    """A malformed row: the field at fault (None: the whole row) and the reason. Internal."""

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


class UnusableRow(Exception):
    """A well-formed row the loader cannot use (see ``Skipped.kind``): always skipped, counted."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class Row:
    """One data row as read: its number, the unit the number counts in, its position among the
    file's data rows (for generated ids), and the parsed data or why it could not be parsed."""

    number: int
    unit: str
    index: int
    data: Any = None
    error: str | None = None


@dataclass
class RowCollector:
    """Gathers items and skipped rows under the one rule every loader follows.

    ``add_error`` raises at once unless ``skip_invalid``; ``finish`` raises when no row was valid.
    """

    path: Path
    skip_invalid: bool
    limit: int | None = None
    items: list[Item] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set)

    @property
    def full(self) -> bool:
        return self.limit is not None and len(self.items) >= self.limit

    def add_error(self, row: Row, field_name: str | None, reason: str) -> None:
        entry = Skipped(row.number, field_name, reason, row.unit, "invalid")
        if not self.skip_invalid:
            raise DatasetError(f"{self.path} {entry}")
        self.skipped.append(entry)

    def add_skip(self, row: Row, reason: str, kind: str) -> None:
        """A valid row the loader cannot use: always skipped, counted under ``kind``."""
        self.skipped.append(Skipped(row.number, None, reason, row.unit, kind))

    def collect(self, rows: Iterable[Row], build: Callable[[Row], Item], id_field: str = "id"
                ) -> None:
        """Each row's item from ``build`` (which raises ``RowError`` or ``UnusableRow`` for a row
        it cannot use), or the row's error or skip, until ``limit`` items are gathered."""
        for row in rows:
            if self.full:
                break
            if row.error is not None:
                self.add_error(row, None, row.error)
                continue
            try:
                item = build(row)
            except UnusableRow as unusable:
                self.add_skip(row, unusable.reason, unusable.kind)
                continue
            except RowError as error:
                self.add_error(row, error.field, error.reason)
                continue
            self.add_item(row, item, id_field)

    def add_item(self, row: Row, item: Item, id_field: str = "id") -> None:
        if item.id in self._ids:
            self.add_error(row, id_field, f"duplicate id {item.id!r}")
            return
        self._ids.add(item.id)
        self.items.append(item)

    def _kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.skipped:
            counts[entry.kind] = counts.get(entry.kind, 0) + 1
        return counts

    def finish(self, name: str, **extra: Any) -> LoadResult:
        if not self.items:
            if not self.skipped:
                raise DatasetError(f"{self.path}: no rows")
            invalid = [entry for entry in self.skipped if entry.kind == "invalid"]
            first = invalid[0] if invalid else self.skipped[0]
            kinds = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in self._kinds().items())
            raise DatasetError(
                f"{self.path}: no usable row: all {len(self.skipped)} skipped ({kinds}); "
                f"first: {first}"
            )
        notes = tuple(extra.pop("notes", ()))
        if self.skipped:
            kinds = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in self._kinds().items())
            notes += (f"{self.path.name}: skipped {len(self.skipped)} rows ({kinds}); "
                      f"loaded {len(self.items)}",)
        return LoadResult(name, tuple(self.items), f"file {self.path}", tuple(self.skipped),
                          notes=notes, **extra)


# --- reading rows ------------------------------------------------------------------------------

def check_file(path: str | Path, formats: Sequence[FileFormat] = ALL_FORMATS,
               what: str = "data") -> Path:
    """The resolved path of an existing data file in one of ``formats``."""
    resolved = existing_file(Path(path).expanduser().resolve())
    file_format(resolved, formats, what)
    return resolved


def read_rows(path: Path, *, allow_truncated: bool = False) -> tuple[Iterator[Row], int | None]:
    """The data rows of a CSV/TSV, JSONL, JSON (a list) or Parquet file, and for a JSON list that
    was cut off (``allow_truncated``) how many complete rows were recovered before the cut."""
    kind = file_format(path)
    if kind == "jsonl":
        return _jsonl_rows(path), None
    if kind == "json":
        return _json_rows(path, allow_truncated)
    if kind == "parquet":
        return _indexed_rows(parquet_records(path)), None
    return _csv_rows(path, "\t" if kind == "tsv" else ","), None


def _decode(data: bytes) -> str:
    return data.decode("utf-8-sig", errors="surrogateescape")


def _jsonl_rows(path: Path) -> Iterator[Row]:
    for index, line in enumerate(json_lines(path, keep_bad_bytes=True)):
        yield Row(line.number, "line", index, line.value, line.error)


def _json_rows(path: Path, allow_truncated: bool) -> tuple[Iterator[Row], int | None]:
    text = _decode(read_bytes(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        if not allow_truncated or not text.lstrip().startswith("["):
            raise invalid_json(path, error) from None
        data, recovery = recover_json_list(text)
        # A list that parsed to its end but for what follows, or whose text still closes with ']',
        # is corrupt, not cut off: only a missing end is recovered.
        if recovery.complete or text.rstrip().endswith("]"):
            raise invalid_json(path, error) from None
        if not data:
            raise DatasetError(
                f"{path}: truncated JSON list with no complete row "
                f"(cut at character {recovery.stopped_at})"
            ) from None
        return _indexed_rows(data), len(data)
    return _indexed_rows(row_list(path, data)), None


@dataclass(frozen=True)
class Recovery:
    """What ``recover_json_list`` read: whether the list was complete, how many rows it holds,
    the character offset where reading stopped and how many characters were left unread."""

    complete: bool
    rows: int
    stopped_at: int
    unread: int
    reason: str = ""


def recover_json_list(text: str) -> tuple[list[Any], Recovery]:
    """The complete elements of a JSON list whose end may be cut off (a truncated download).

    Reads element by element with ``json.JSONDecoder.raw_decode``, so memory holds one element's
    text at a time beyond the input; stops at the first element that does not parse. Everything
    after that point (the incomplete tail) is dropped and reported in the ``Recovery``.
    """
    decoder = json.JSONDecoder()
    rows: list[Any] = []
    length = len(text)
    position = _skip_space(text, 0)
    if position >= length or text[position] != "[":
        raise DatasetError("not a JSON list: it does not start with '['")
    position = _skip_space(text, position + 1)
    if position < length and text[position] == "]":
        return rows, Recovery(True, 0, position + 1, 0)
    while position < length:
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            return rows, Recovery(False, len(rows), position, length - position, error.msg)
        rows.append(value)
        position = _skip_space(text, end)
        if position < length and text[position] == ",":
            position = _skip_space(text, position + 1)
        elif position < length and text[position] == "]":
            return rows, Recovery(True, len(rows), position + 1, 0)
        elif position < length:
            return rows, Recovery(False, len(rows), position, length - position,
                                  "expected ',' or ']' after an element")
    return rows, Recovery(False, len(rows), length, 0, "the list is not closed")


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _csv_rows(path: Path, delimiter: str) -> Iterator[Row]:
    text = _decode(read_bytes(path))
    # strict: a quote left open is an error naming its row, never a field that swallows the rest
    # of the file.
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as error:
        raise DatasetError(f"{path} line 1: invalid CSV header ({error})") from None
    header = [name.strip() for name in header]
    if bad := next((name for name in header if _SURROGATE.search(name)), None):
        raise DatasetError(f"{path} line 1: column name {bad!r} is not UTF-8 text")
    previous_end = reader.line_num
    index = 0
    while True:
        start = previous_end + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            why = ("a quoted field is never closed: it runs to the end of the file"
                   if "unexpected end of data" in str(error) else str(error))
            yield Row(start, "line", index, error=f"invalid CSV ({why})")
            return  # the reader cannot resynchronize after a malformed quote
        previous_end = reader.line_num
        if not cells or all(not cell.strip() for cell in cells):
            continue
        if len(cells) > len(header):
            yield Row(start, "line", index,
                      error=f"{len(cells)} cells but the header has {len(header)} columns")
        else:
            # Short rows (a trailing empty cell dropped) read as missing values, not as errors.
            yield Row(start, "line", index, dict(zip(header, cells)))
        index += 1


def _indexed_rows(values: Iterable[Any]) -> Iterator[Row]:
    """JSON or Parquet rows, numbered (and named in messages) by their 0-based index."""
    return (Row(i, "row", i, value) for i, value in enumerate(values))


def columns_of(rows: Iterable[Row]) -> list[str]:
    """Every top-level key of the object rows, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        if isinstance(row.data, Mapping):
            seen.update((str(key), None) for key in row.data)
    return list(seen)


def bad_text_path(value: Any, path: str = "") -> str | None:
    """The key path (``a.b[2]``) of the first string in ``value`` holding bytes that were not UTF-8
    (or a lone surrogate escape); None when all text is clean. ``""`` means ``value`` itself."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and _SURROGATE.search(key):
                return inner
            found = bad_text_path(item, inner)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            found = bad_text_path(item, f"{path}[{position}]")
            if found is not None:
                return found
    return None


def utf8_reason(text: str) -> str:
    match = _SURROGATE.search(text)
    code = ord(match.group()) if match else 0
    if 0xDC80 <= code <= 0xDCFF:
        return f"invalid UTF-8 (byte 0x{code - 0xDC00:02x} at character {match.start()})"
    return "invalid UTF-8 (a lone surrogate)"


def text_value(value: Any, field_name: str, *, required: bool = True) -> str | None:
    """A text field's stripped value; raises ``RowError`` for a wrong type, empty text or bytes
    that were not UTF-8. ``required=False`` turns a missing value into None (an empty one too)."""
    if _missing(value):
        if required:
            raise RowError(field_name, "missing")
        return None
    if not isinstance(value, str):
        raise RowError(field_name, f"expected text, got {_type_name(value)}")
    if _SURROGATE.search(value):
        raise RowError(field_name, utf8_reason(value))
    if not value.strip():
        if required:
            raise RowError(field_name, "empty text")
        return None
    return value.strip()


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # None or NaN


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", bool: "a boolean"}
    return names.get(type(value), type(value).__name__)


# --- the user's own files ----------------------------------------------------------------------

def parse_field_mappings(pairs: Iterable[str]) -> dict[str, str]:
    """CLI ``--field`` values to a mapping: ``["query=question", "answer=target"]`` ->
    ``{"query": "question", "answer": "target"}``."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        name, sep, column = pair.partition("=")
        name, column = name.strip(), column.strip()
        if not sep or not name or not column:
            raise ConfigError(
                f"bad field mapping {pair!r}: write FIELD=COLUMN, e.g. query=question "
                f"(fields: {', '.join(FIELD_DEFAULTS)})"
            )
        if name not in FIELD_DEFAULTS:
            raise ConfigError(
                f"bad field mapping {pair!r}: unknown field {name!r}; use one of "
                f"{', '.join(FIELD_DEFAULTS)}"
            )
        if name in mapping and mapping[name] != column:
            raise ConfigError(
                f"field {name!r} mapped twice: to {mapping[name]!r} and to {column!r}"
            )
        mapping[name] = column
    return mapping


def resolve_fields(
    fields: Mapping[str, str] | None, columns: Sequence[str], path: Path
) -> tuple[dict[str, str], set[str]]:
    """The column of each userturn field, and which of them the caller named explicitly."""
    explicit = dict(fields or {})
    unknown = sorted(set(explicit) - set(FIELD_DEFAULTS))
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(map(repr, unknown))} in the field mapping; use one of "
            f"{', '.join(FIELD_DEFAULTS)}"
        )
    bad = [name for name, column in explicit.items() if not isinstance(column, str) or not column]
    if bad:
        raise ConfigError(f"field mapping for {bad[0]!r} must be a column name")
    resolved = dict(explicit)
    available = set(columns)
    for name, candidates in FIELD_DEFAULTS.items():
        if name not in resolved:
            column = next((c for c in candidates if c in available), None)
            if column is not None:
                resolved[name] = column
    if "query" not in resolved:
        raise DatasetError(
            f"{path}: no query column: none of {', '.join(FIELD_DEFAULTS['query'])} is present "
            f"(columns: {', '.join(columns[:12]) or 'none'}); name it, e.g. "
            f"fields={{'query': 'COLUMN'}} or --field query=COLUMN"
        )
    return resolved, set(explicit)


def file_items(
    path: str | Path,
    *,
    fields: Mapping[str, str] | None = None,
    skip_invalid: bool = False,
    name: str | None = None,
    limit: int | None = None,
) -> LoadResult:
    """Single-turn items from the user's own CSV/TSV, JSONL, JSON or Parquet file.

    A field named in ``fields`` is required in every row; a field found by its default column name
    (``answer``, ``id``, ``system``) may be missing or empty in a row. ``query`` is always required.
    ``limit`` keeps the first N valid items; rows after the Nth are not checked.
    """
    if limit is not None and limit < 1:
        raise DatasetError(f"dataset limit must be at least 1, got {limit}")
    resolved_path = check_file(path)
    rows = list(read_rows(resolved_path)[0])
    columns = columns_of(rows)
    unreadable = next((row for row in rows if row.error is not None), None)
    if not columns and unreadable is not None:  # no row could be read: say why, not "no column"
        raise DatasetError(f"{resolved_path} {unreadable.unit} {unreadable.number}: "
                           f"{unreadable.error}")
    mapping, explicit = resolve_fields(fields, columns, resolved_path)
    stem = name or resolved_path.stem
    collector = RowCollector(resolved_path, skip_invalid, limit)
    collector.collect(rows, lambda row: _file_item(row, mapping, explicit,
                                                   f"{stem}-{row.index:04d}"))
    return collector.finish(stem, fields=mapping)


def _file_item(row: Row, mapping: Mapping[str, str], explicit: set[str], default_id: str) -> Item:
    data = row.data
    if not isinstance(data, Mapping):
        raise RowError(None, f"expected an object with a {mapping['query']!r} column, "
                             f"got {_type_name(data)}")
    values: dict[str, Any] = {}
    for name, column in mapping.items():
        required = name in REQUIRED_FIELDS or name in explicit
        convert = {"answer": _answer_value, "id": _id_value}.get(name, text_value)
        try:
            values[name] = convert(data.get(column), name, required=required)
        except RowError as error:
            where = "" if column == name else f" (column '{column}')"
            raise RowError(error.field, error.reason + where) from None
    # Bytes that were not UTF-8 in any other column still make the row invalid: say where.
    bad = bad_text_path(data)
    if bad is not None:
        raise RowError(bad, "invalid UTF-8 (a column userturn does not read)")
    system, query = values.get("system"), values["query"]
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": query}]
    item_id = values.get("id") or default_id
    return Item(item_id, tuple(messages), values.get("answer"), {row.unit: row.number})


def _answer_value(value: Any, name: str, *, required: bool) -> str | None:
    """A reference answer may be a number (GSM8K-style targets, numeric Parquet columns)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not _missing(value):
        return str(value)
    return text_value(value, name, required=required)


def _id_value(value: Any, name: str, *, required: bool) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return text_value(value, name, required=required)


__all__ = [
    "FIELD_DEFAULTS", "LoadResult", "Recovery", "Skipped", "file_items", "parse_field_mappings",
    "recover_json_list",
]
