"""The run's database file: its schema, content keys, how it is opened for writing and for reading
(a reader never writes into the run folder, yet sees what a killed writer left in the WAL), the
checks at open, the added-column migrations, and storage faults as one line.

:class:`~userturn.store.database.RunStore` is the only user of what is here besides the schema
constants, :func:`generation_key` and :func:`storage_faults` (for the store's own queries outside
``RunStore``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from userturn.credentials import scrub
from userturn.errors import DamagedStore, RequestsFailed, StoreError
from userturn.records import DEFAULT_THINKING, NATIVE, Request, probed_name
from userturn.store.rows import GenerationRow

DB_NAME = "userturn.db"
SCHEMA_VERSION = 1  # stored in meta; a store of a newer schema is refused, not misread
TABLES = {"meta", "items", "generations", "plan", "contexts", "scores", "labels",
          "continuations"}
SQLITE_HEADER = b"SQLite format 3\x00"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
  dataset TEXT NOT NULL, item_id TEXT NOT NULL, data TEXT NOT NULL,
  PRIMARY KEY (dataset, item_id));
CREATE TABLE IF NOT EXISTS generations (
  key TEXT PRIMARY KEY, role TEXT NOT NULL, model TEXT NOT NULL, revision TEXT NOT NULL,
  template_hash TEXT NOT NULL, prompt TEXT NOT NULL, stop TEXT NOT NULL,
  temperature REAL NOT NULL, top_p REAL NOT NULL, max_tokens INTEGER NOT NULL,
  sample_index INTEGER NOT NULL, seed INTEGER NOT NULL,
  text TEXT NOT NULL, raw_text TEXT NOT NULL, finish_reason TEXT NOT NULL,
  prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, error TEXT,
  created REAL NOT NULL, thinking TEXT);
CREATE TABLE IF NOT EXISTS plan (
  key TEXT PRIMARY KEY, role TEXT NOT NULL, model TEXT NOT NULL, dataset TEXT NOT NULL,
  item_id TEXT NOT NULL, context TEXT NOT NULL, temperature REAL NOT NULL,
  sample_index INTEGER NOT NULL, assistant_key TEXT,
  answerer TEXT NOT NULL DEFAULT 'self', perturbation TEXT NOT NULL DEFAULT 'none',
  arm TEXT NOT NULL DEFAULT 'opened', user_variant TEXT NOT NULL DEFAULT 'native',
  enable_thinking TEXT NOT NULL DEFAULT 'default');
CREATE TABLE IF NOT EXISTS contexts (
  context TEXT PRIMARY KEY, perturbation TEXT NOT NULL, answer TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS scores (
  key TEXT NOT NULL, scorer TEXT NOT NULL, correct INTEGER NOT NULL, extracted TEXT,
  reference TEXT, details TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (key, scorer));
CREATE TABLE IF NOT EXISTS continuations (
  key TEXT PRIMARY KEY, next_role TEXT NOT NULL, user_turn TEXT, boundary INTEGER,
  p_user REAL, p_assistant REAL, p_end REAL);
CREATE TABLE IF NOT EXISTS labels (
  key TEXT NOT NULL, source TEXT NOT NULL, version TEXT NOT NULL, label TEXT, rationale TEXT,
  error TEXT, created REAL NOT NULL, probability REAL, PRIMARY KEY (key, source));
"""


def generation_key(role: str, model: str, revision: str, template_hash: str, request: Request,
                   sample_index: int, thinking: str = "drop", arm: str = "opened", *,
                   user_variant: str = NATIVE, enable_thinking: str = DEFAULT_THINKING) -> str:
    """The content key of one generation. ``model`` is the model's spec, the variants it is
    probed under are typed beside it; the key hashes the name runs before the typed fields gave
    the variant (``MODEL[thinking=on][user=SPEC]``), so every key is what it was and a run folder
    of any release resumes without generating."""
    payload = {
        "role": role, "model": probed_name(model, user_variant, enable_thinking),
        "revision": revision, "template": template_hash,
        "prompt": request.prompt, "params": asdict(request.params), "stop": list(request.stop),
        "sample_index": sample_index, "seed": request.seed,
    }
    if thinking != "drop":  # the default is left out: keys of runs before the policy stay valid
        payload["thinking"] = thinking
    if arm != "opened":  # the same: the opened arm's keys are those of runs before the arms
        payload["arm"] = arm
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def check_header(path: Path) -> None:
    """An existing file is a SQLite database at all (a 0-byte or foreign file is not a run)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        raise StoreError(f"{path.parent} is not a userturn run folder (no {DB_NAME})") from None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    if not header:
        raise StoreError(f"{path} is empty (0 bytes), not a userturn store: a cut-short copy? "
                         "Move it away to start a new run here")
    if header != SQLITE_HEADER:
        raise StoreError(f"{path} is not a userturn store (not a SQLite database); move it away "
                         "or choose another folder")


def connect(path: Path, writable: bool) -> sqlite3.Connection:
    if writable:
        db = sqlite3.connect(path, timeout=30)
    else:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    return db


class ReadCopy:
    """A run's database and WAL copied into a temporary folder, for a reader that must not
    write beside the original (read-only folder, full disk) where SQLite could not read the WAL
    in place: it applies the WAL in the copy. Removed on close."""

    def __init__(self, path: Path) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="userturn-read-")
        self.path = Path(self.folder.name) / path.name
        try:
            for suffix in ("", "-wal"):  # no writer holds a run whose WAL lacks its -shm
                source = path.with_name(path.name + suffix)
                if source.exists():
                    shutil.copyfile(source, self.path.with_name(self.path.name + suffix))
        except OSError as exc:
            self.folder.cleanup()
            raise StoreError(f"cannot read {path}: its newest rows are in {path.name}-wal, which "
                             "SQLite reads only through a copy here, and the copy into "
                             f"{self.folder.name} failed ({exc.strerror or exc}); free space in "
                             "the temporary folder (TMPDIR)") from None

    def connect(self) -> sqlite3.Connection:
        return connect(self.path, writable=True)


def open_for_reading(path: Path) -> tuple[sqlite3.Connection, ReadCopy | None]:
    """A connection that reads every committed row and writes nothing into the run folder.

    SQLite reads a WAL-mode database read-only (``mode=ro``) only through its ``-shm`` index: it
    creates a missing one beside the database, and the first reader after a crash rebuilds it.
    So: no WAL (or an empty one) means the database file holds everything, read ``immutable``;
    a WAL that a live writer is using is read in place, through the writer's shared ``-shm``
    (what keeps a reader consistent while the writer checkpoints); any other WAL (a killed
    writer's, one without its ``-shm``) is read from a temporary copy."""
    from userturn.store.lock import held

    wal = path.with_name(path.name + "-wal")
    if not wal.exists() or wal.stat().st_size == 0:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        db.row_factory = sqlite3.Row
        return db, None
    if path.with_name(path.name + "-shm").exists() and held(path.parent):
        db = connect(path, writable=False)
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return db, None
        except sqlite3.OperationalError:  # a -shm it cannot use read-only: the copy reads it
            db.close()
    copy = ReadCopy(path)
    return copy.connect(), copy


def check_schema(db: sqlite3.Connection, path: Path) -> None:
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not names:
        return  # a database with no table yet (its creation was cut short): a new store
    if not {"meta", "generations", "plan", "labels"} <= names:
        raise StoreError(f"{path} is a SQLite database but not a userturn store (no "
                         f"{', '.join(sorted({'meta', 'generations', 'plan', 'labels'} - names))}"
                         " table)")
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    try:
        version = json.loads(row[0]) if row else SCHEMA_VERSION  # before versions: the first
    except (ValueError, TypeError):
        raise DamagedStore(f"{path} is damaged: its metadata 'schema_version' is not JSON; "
                           f"`userturn doctor {path.parent}` says what can be recovered",
                           "'schema_version' is not JSON") from None
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise StoreError(f"{path} has store schema {version}; this userturn reads up to "
                         f"{SCHEMA_VERSION}: upgrade userturn to read it")


def create_database(path: Path) -> None:
    """A new database, made whole under a temporary name and linked into place: a kill at any
    moment leaves either no database or a complete empty store, never a 0-byte file (which
    ``open`` refuses, as it cannot tell it from a cut-short copy)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        for stale in (temporary, temporary.with_name(temporary.name + "-journal")):
            stale.unlink(missing_ok=True)
        db = sqlite3.connect(temporary)
        try:
            db.executescript(f"BEGIN; {SCHEMA} COMMIT;")
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (json.dumps(SCHEMA_VERSION),))
            db.commit()
        finally:
            db.close()
        try:
            os.link(temporary, path)  # never over a database another process just made
        except FileExistsError:
            pass
    except sqlite3.Error as exc:
        raise StoreError(storage_problem(exc, path)) from None
    except OSError as exc:
        from userturn.store.atomic import describe

        raise StoreError(describe(exc, path)) from None
    finally:
        temporary.unlink(missing_ok=True)


def file_identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def storage_problem(exc: sqlite3.Error, path: Path) -> str:
    """A SQLite error as one line naming the database and what to do."""
    text = str(exc)
    if "full" in text:
        return (f"cannot write {path}: the disk is full; free some space and run the same "
                "command again (everything stored so far is kept)")
    if "readonly" in text or "read-only" in text:
        return f"cannot write {path}: the run folder is read-only; copy the run somewhere writable"
    if "malformed" in text or "not a database" in text or "corrupt" in text:
        return (f"{path} is damaged ({text}); `userturn doctor {path.parent}` checks it; "
                "restore it from a copy or start a new run")
    return f"{path}: {text}"


def storage_error(exc: sqlite3.Error, path: Path) -> StoreError:
    """``storage_problem`` as the error to raise: damage is a ``DamagedStore``, which
    ``userturn doctor`` reports as its finding rather than as advice to run itself."""
    text = str(exc)
    if "malformed" in text or "not a database" in text or "corrupt" in text:
        return DamagedStore(storage_problem(exc, path), text)
    return StoreError(storage_problem(exc, path))


@contextmanager
def storage_faults(path: Path) -> Iterator[None]:
    """SQLite faults inside become one ``StoreError`` line naming the database (damage a
    ``DamagedStore``): no ``sqlite3`` error leaves the store, so no caller needs to know SQLite."""
    try:
        yield
    except sqlite3.Error as exc:
        raise storage_error(exc, path) from None


def storage_errors(method):  # type: ignore[no-untyped-def]
    """Every store method: SQLite faults become one StoreError line; writes first check that
    the database is still the one opened."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if method.__name__.startswith(("put_", "update_", "replace_", "keep_",
                                            "delete_")):
            if self.read_only:  # never into a reader's temporary copy, where it would vanish
                raise StoreError(f"cannot write {self.path}: it was opened to read only (a "
                                 "read-only folder?); copy the run somewhere writable")
            self.check_present()
        with storage_faults(self.path):
            return method(self, *args, **kwargs)
    return wrapper


class Tally:
    """What this process asked of models: requests sent and failed per kind (generation, judge),
    and the first error; a command whose every request failed exits non-zero with it."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.first_error: dict[str, str] = {}
        self.tokens: dict[str, int] = {}  # tokens generated, per kind

    def count(self, kind: str, error: str | None, tokens: int = 0) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + 1
        self.tokens[kind] = self.tokens.get(kind, 0) + tokens
        if error is not None:
            self.failed[kind] = self.failed.get(kind, 0) + 1
            self.first_error.setdefault(kind, scrub(error))

    def all_failed(self, kind: str) -> bool:
        return self.sent.get(kind, 0) > 0 and self.failed.get(kind, 0) == self.sent[kind]

    def refuse_if_all_failed(self, kind: str) -> None:
        """A command whose every request of ``kind`` failed did nothing: ``RequestsFailed``
        (exit 1) with :meth:`summary`, once what it stored has been shown."""
        if self.all_failed(kind):
            raise RequestsFailed(self.summary(kind))

    def summary(self, kind: str) -> str:
        """One line: how many of what failed, and the first error."""
        sent, failed = self.sent.get(kind, 0), self.failed.get(kind, 0)
        first = " ".join(self.first_error.get(kind, "").split())[:300]
        return f"{failed} of {sent} {kind} request(s) failed; the first: {first}"


def scrubbed(text: str | None) -> str | None:
    return None if text is None else scrub(text)


def generation_values(row: GenerationRow, created: float) -> tuple[Any, ...]:
    """The ``generations`` columns of one row, in the order of the INSERT below."""
    req, gen = row.request, row.generation
    return (row.key, row.role, row.model, row.revision, row.template_hash, scrub(req.prompt),
            json.dumps(list(req.stop)), req.params.temperature, req.params.top_p,
            req.params.max_tokens, row.sample_index, req.seed, scrub(gen.text),
            scrub(gen.raw_text), gen.finish_reason, gen.prompt_tokens, gen.completion_tokens,
            scrubbed(gen.error), created, scrubbed(gen.thinking))


ADDED_COLUMNS = (("plan", "answerer", "TEXT NOT NULL DEFAULT 'self'"),
                  ("plan", "perturbation", "TEXT NOT NULL DEFAULT 'none'"),
                  ("plan", "arm", "TEXT NOT NULL DEFAULT 'opened'"),  # before the arms: opened
                  # NULL: planned before the typed variants, whose name holds them
                  # (store.rows.typed_model reads it); every row planned since sets both.
                  ("plan", "user_variant", "TEXT"),
                  ("plan", "enable_thinking", "TEXT"),
                  ("scores", "details", "TEXT NOT NULL DEFAULT '{}'"),
                  ("generations", "thinking", "TEXT"),  # NULL: generated before the split
                  ("labels", "probability", "REAL"))  # NULL: the source gives none


def missing_columns(db: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """The columns an earlier userturn's store lacks, as (table, name, declaration)."""
    missing = []
    for table, name, declaration in ADDED_COLUMNS:
        columns = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        if columns and name not in columns:
            missing.append((table, name, declaration))
    return missing


def needs_upgrade(db: sqlite3.Connection) -> bool:
    """Whether a store lacks tables or columns this userturn reads (an earlier userturn's)."""
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return not TABLES <= names or bool(missing_columns(db))


def check_folder(folder: Path) -> None:
    if not folder.is_dir() or not (folder / DB_NAME).exists():
        raise StoreError(f"{folder} is not a userturn run folder (no {DB_NAME})")
