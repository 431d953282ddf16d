"""Reading any data file as rows (CSV, TSV, JSONL, JSON, Parquet) and collecting them into items.

Each row keeps its number (a JSONL or CSV row by its 1-based line, a JSON or Parquet row by its
0-based index) and undecodable bytes survive as lone surrogates, so that an error names the file,
the row and the field instead of failing the whole file. ``RowCollector`` records malformed rows as
``Skipped`` (with ``skip_invalid``) or raises ``DatasetError``. Used by the user's own files
(:mod:`.files`) and by the conversation loaders.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from userturn.data.rows import (
    ALL_FORMATS,
    FileFormat,
    existing_file,
    file_format,
    invalid_json,
    json_lines,
    parquet_records,
    read_bytes,
    row_list,
)
from userturn.errors import DatasetError
from userturn.records import Item
from userturn.settings import (
    LONE_SURROGATE,
    DocumentError,
    checked_shape,
    parse_json,
    utf8_reason,
)


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
        data = parse_json(text)
    except DocumentError as error:
        raise invalid_json(path, error) from None
    except json.JSONDecodeError as error:
        if not allow_truncated or not text.lstrip().startswith("["):
            raise invalid_json(path, error) from None
        data, recovery = recover_json_list(text)
        try:
            checked_shape(data)
        except DocumentError as too_deep:
            raise invalid_json(path, too_deep) from None
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
    if bad := next((name for name in header if LONE_SURROGATE.search(name)), None):
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


def first_row_columns(path: Path) -> set[str]:
    """The keys of the file's first row (empty when that row is not an object, or there is
    none): enough to tell a GSM8K question/answer file from one with other column names."""
    existing_file(path)
    rows, _ = read_rows(path, allow_truncated=True)
    first = next(rows, None)
    return {str(key) for key in first.data} if first and isinstance(first.data, Mapping) \
        else set()


def columns_of(rows: Iterable[Row]) -> list[str]:
    """Every top-level key of the object rows, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        if isinstance(row.data, Mapping):
            seen.update((str(key), None) for key in row.data)
    return list(seen)


def text_value(value: Any, field_name: str, *, required: bool = True) -> str | None:
    """A text field's stripped value; raises ``RowError`` for a wrong type, empty text or bytes
    that were not UTF-8. ``required=False`` turns a missing value into None (an empty one too)."""
    if is_missing(value):
        if required:
            raise RowError(field_name, "missing")
        return None
    if not isinstance(value, str):
        raise RowError(field_name, f"expected text, got {type_name(value)}")
    if LONE_SURROGATE.search(value):
        raise RowError(field_name, utf8_reason(value))
    if not value.strip():
        if required:
            raise RowError(field_name, "empty text")
        return None
    return value.strip()


def is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # None or NaN


def type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", bool: "a boolean"}
    return names.get(type(value), type(value).__name__)
