"""The run store: one SQLite database per run folder.

Generations are content-addressed: the key covers everything that changes a generation's
distribution (model, revision, template hash, rendered prompt, decoding parameters, stop markers,
sample index, seed), so a finished generation is never made twice and a sampled one is never served
for another sample index. Every chunk of results is committed in one transaction: a run killed at
any moment restarts where it stopped, losing at most the chunk in flight and never half of one.
The ``plan`` table lists the generations the current experiment is made of; reports read through it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from userturn.credentials import scrub, scrub_value
from userturn.errors import StoreError
from userturn.records import Label, Request, Score
from userturn.store.meta import AnnotationSample, RunMeta
from userturn.store.rows import ContextRow, GenerationRow, PlanRow

DB_NAME = "userturn.db"
SCHEMA_VERSION = 1  # stored in meta; a store of a newer schema is refused, not misread
TABLES = {"meta", "items", "generations", "plan", "contexts", "scores", "labels"}
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
  answerer TEXT NOT NULL DEFAULT 'self', perturbation TEXT NOT NULL DEFAULT 'none');
CREATE TABLE IF NOT EXISTS contexts (
  context TEXT PRIMARY KEY, perturbation TEXT NOT NULL, answer TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS scores (
  key TEXT NOT NULL, scorer TEXT NOT NULL, correct INTEGER NOT NULL, extracted TEXT,
  reference TEXT, details TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (key, scorer));
CREATE TABLE IF NOT EXISTS labels (
  key TEXT NOT NULL, source TEXT NOT NULL, version TEXT NOT NULL, label TEXT, rationale TEXT,
  error TEXT, created REAL NOT NULL, probability REAL, PRIMARY KEY (key, source));
"""


def generation_key(role: str, model: str, revision: str, template_hash: str, request: Request,
                   sample_index: int, thinking: str = "drop") -> str:
    payload = {
        "role": role, "model": model, "revision": revision, "template": template_hash,
        "prompt": request.prompt, "params": asdict(request.params), "stop": list(request.stop),
        "sample_index": sample_index, "seed": request.seed,
    }
    if thinking != "drop":  # the default is left out: keys of runs before the policy stay valid
        payload["thinking"] = thinking
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


def _connect(path: Path, writable: bool) -> sqlite3.Connection:
    if writable:
        db = sqlite3.connect(path, timeout=30)
    else:  # a read-only folder or file: read without the WAL side files
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    db.row_factory = sqlite3.Row
    return db


def _check_schema(db: sqlite3.Connection, path: Path) -> None:
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not names:
        return  # a database with no table yet (its creation was cut short): a new store
    if not {"meta", "generations", "plan", "labels"} <= names:
        raise StoreError(f"{path} is a SQLite database but not a userturn store (no "
                         f"{', '.join(sorted({'meta', 'generations', 'plan', 'labels'} - names))}"
                         " table)")
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = json.loads(row[0]) if row else SCHEMA_VERSION  # before versions: the first schema
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise StoreError(f"{path} has store schema {version}; this userturn reads up to "
                         f"{SCHEMA_VERSION}: upgrade userturn to read it")


def _create_database(path: Path) -> None:
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


def _identity(path: Path) -> tuple[int, int] | None:
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


def _storage_errors(method):  # type: ignore[no-untyped-def]
    """Every store method: SQLite faults become one StoreError line; writes first check that
    the database is still the one opened."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if method.__name__.startswith(("put_", "update_", "replace_", "keep_",
                                            "delete_")):
            self.check_present()
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise StoreError(storage_problem(exc, self.path)) from None
    return wrapper


class Tally:
    """What this process asked of models: requests sent and failed per kind (generation, judge),
    and the first error; a command whose every request failed exits non-zero with it."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.first_error: dict[str, str] = {}

    def count(self, kind: str, error: str | None) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + 1
        if error is not None:
            self.failed[kind] = self.failed.get(kind, 0) + 1
            self.first_error.setdefault(kind, scrub(error))

    def all_failed(self, kind: str) -> bool:
        return self.sent.get(kind, 0) > 0 and self.failed.get(kind, 0) == self.sent[kind]

    def summary(self, kind: str) -> str:
        """One line: how many of what failed, and the first error."""
        sent, failed = self.sent.get(kind, 0), self.failed.get(kind, 0)
        first = " ".join(self.first_error.get(kind, "").split())[:300]
        return f"{failed} of {sent} {kind} request(s) failed; the first: {first}"


def _scrubbed(text: str | None) -> str | None:
    return None if text is None else scrub(text)


def _generation_values(row: GenerationRow, created: float) -> tuple[Any, ...]:
    """The ``generations`` columns of one row, in the order of the INSERT below."""
    req, gen = row.request, row.generation
    return (row.key, row.role, row.model, row.revision, row.template_hash, scrub(req.prompt),
            json.dumps(list(req.stop)), req.params.temperature, req.params.top_p,
            req.params.max_tokens, row.sample_index, req.seed, scrub(gen.text),
            scrub(gen.raw_text), gen.finish_reason, gen.prompt_tokens, gen.completion_tokens,
            _scrubbed(gen.error), created, _scrubbed(gen.thinking))


class RunStore:
    """One run's database. ``create`` makes or continues a run (the folder's writer holds its
    ``RunLock``); ``open`` reads an existing one and checks first that it is a userturn store of
    a schema this version knows. Storage faults (a full disk, a read-only folder, a damaged or
    vanished file) are ``StoreError`` lines naming the database."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / DB_NAME
        self.tally = Tally()
        check_header(self.path)
        writable = os.access(self.folder, os.W_OK) and os.access(self.path, os.W_OK)
        try:
            self.db = _connect(self.path, writable)
            _check_schema(self.db, self.path)
            if writable:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.executescript(f"BEGIN; {SCHEMA} COMMIT;")  # all tables or none
                self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(storage_problem(exc, self.path)) from None
        self._identity = _identity(self.path)

    def _migrate(self) -> None:
        """Bring a store written by an earlier userturn up to this schema (columns only added)."""
        added = (("plan", "answerer", "TEXT NOT NULL DEFAULT 'self'"),
                 ("plan", "perturbation", "TEXT NOT NULL DEFAULT 'none'"),
                 ("scores", "details", "TEXT NOT NULL DEFAULT '{}'"),
                 ("generations", "thinking", "TEXT"),  # NULL: generated before the split
                 ("labels", "probability", "REAL"))  # NULL: the source gives none
        with self.db:
            for table, name, declaration in added:
                columns = {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})")}
                if name not in columns:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                            (json.dumps(SCHEMA_VERSION),))

    @classmethod
    def create(cls, folder: Path) -> RunStore:
        from userturn.store.atomic import make_folder

        make_folder(Path(folder))
        path = Path(folder) / DB_NAME
        if not path.exists():
            _create_database(path)
        return cls(folder)

    @classmethod
    def open(cls, folder: Path) -> RunStore:
        if not Path(folder).is_dir() or not (Path(folder) / DB_NAME).exists():
            raise StoreError(f"{folder} is not a userturn run folder (no {DB_NAME})")
        return cls(folder)

    def check_present(self) -> None:
        """The database this store opened is still there: a run whose database was deleted or
        replaced under it would store into nothing and say it finished."""
        if _identity(self.path) != self._identity:
            raise StoreError(f"{self.path} was deleted or replaced while this command ran: what "
                             "it made since is lost; run the same command again")

    def close(self) -> None:
        self.db.close()

    # -- metadata and items -------------------------------------------------------------------
    def update_meta(self, **changes: Any) -> RunMeta:
        """Change fields of the run's :class:`RunMeta` (validated first: a wrong type is a bug
        caught here, not a report that misreads it later); returns the metadata as stored."""
        current = self.meta()
        updated = RunMeta.model_validate({**current.model_dump(), **changes})
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                [(k, json.dumps(scrub_value(v)))
                                 for k, v in updated.rows(changes).items()])
        return updated

    def put_annotation_sample(self, annotator: str, sample: AnnotationSample) -> None:
        samples = self.meta().annotation_samples
        self.update_meta(annotation_samples={**samples, annotator: sample})

    def meta(self) -> RunMeta:
        return RunMeta.from_rows({r["key"]: json.loads(r["value"])
                                  for r in self.db.execute("SELECT key, value FROM meta")})

    def put_items(self, dataset: str, items: Iterable[Mapping[str, Any]]) -> None:
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO items VALUES (?, ?, ?)",
                [(dataset, i["id"], scrub(json.dumps(i))) for i in items])

    def items(self, dataset: str) -> dict[str, dict[str, Any]]:
        rows = self.db.execute("SELECT item_id, data FROM items WHERE dataset = ?", (dataset,))
        return {r["item_id"]: json.loads(r["data"]) for r in rows}

    # -- the plan -----------------------------------------------------------------------------
    def replace_plan(self, rows: Sequence[PlanRow], *, role: str, model: str,
                     dataset: str) -> None:
        """The plan of one role, model and dataset, replaced as a whole."""
        with self.db:
            self.db.execute("DELETE FROM plan WHERE role = ? AND model = ? AND dataset = ?",
                            (role, model, dataset))
            self.db.executemany(
                "INSERT OR REPLACE INTO plan VALUES (:key, :role, :model, :dataset, :item_id, "
                ":context, :temperature, :sample_index, :assistant_key, :answerer, "
                ":perturbation)", [asdict(row) for row in rows])

    def keep_plan(self, models: Sequence[str], datasets: Sequence[str]) -> None:
        """Drop planned rows of models or datasets the current experiment no longer has."""
        marks_m, marks_d = ",".join("?" * len(models)), ",".join("?" * len(datasets))
        with self.db:
            self.db.execute(f"DELETE FROM plan WHERE model NOT IN ({marks_m}) "
                            f"OR dataset NOT IN ({marks_d})", [*models, *datasets])

    # -- generations --------------------------------------------------------------------------
    def finished_keys(self, keys: Sequence[str]) -> set[str]:
        """Keys already generated without error (errors are retried on the next run)."""
        found: set[str] = set()
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(
                f"SELECT key FROM generations WHERE error IS NULL AND key IN ({marks})", chunk)
            found.update(r["key"] for r in rows)
        return found

    def put_generations(self, rows: Sequence[GenerationRow]) -> None:
        now = time.time()
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO generations (key, role, model, revision, template_hash, "
                "prompt, stop, temperature, top_p, max_tokens, sample_index, seed, text, "
                "raw_text, finish_reason, prompt_tokens, completion_tokens, error, created, "
                "thinking) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [_generation_values(row, now) for row in rows])

    def generations(self, keys: Sequence[str]) -> dict[str, sqlite3.Row]:
        out: dict[str, sqlite3.Row] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(f"SELECT * FROM generations WHERE key IN ({marks})", chunk)
            out.update((r["key"], r) for r in rows)
        return out

    # -- scores and labels --------------------------------------------------------------------
    def put_scores(self, rows: Sequence[tuple[str, str, Score]]) -> None:
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?, ?, ?)",
                [(key, scorer, int(s.correct), s.extracted, s.reference,
                  json.dumps(dict(s.details))) for key, scorer, s in rows])

    def put_labels(self, rows: Sequence[tuple[str, str, Label]]) -> None:
        """Store (key, version, label); one label per key and source, the newest wins."""
        now = time.time()
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO labels (key, source, version, label, rationale, error, "
                "created, probability) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(key, lab.source, version, lab.label, _scrubbed(lab.rationale),
                  _scrubbed(lab.error), now, lab.probability) for key, version, lab in rows])

    def delete_label(self, key: str, source: str) -> None:
        with self.db:
            self.db.execute("DELETE FROM labels WHERE key = ? AND source = ?", (key, source))

    def label_rows(self) -> list[sqlite3.Row]:
        """Every stored label (key, source, version, label, rationale, error), by source."""
        return list(self.db.execute("SELECT key, source, version, label, rationale, error, "
                                    "probability FROM labels ORDER BY source"))

    def stored_label_sources(self) -> list[str]:
        """Every source the run holds labels from, by name."""
        return [r["source"] for r in
                self.db.execute("SELECT DISTINCT source FROM labels ORDER BY source")]

    def keys_labelled_by(self, source: str) -> list[tuple[str, str | None, str | None]]:
        """(key, label, rationale) of one source's labels, newest first (rowid breaks ties of
        equal times)."""
        rows = self.db.execute("SELECT key, label, rationale FROM labels WHERE source = ? "
                               "ORDER BY created DESC, rowid DESC", (source,))
        return [(r["key"], r["label"], r["rationale"]) for r in rows]

    def labelled_keys(self, source: str, version: str) -> set[str]:
        """Keys ``source`` labelled at ``version`` without error: only successes are cached, a
        failed verdict is asked again."""
        rows = self.db.execute("SELECT key FROM labels WHERE source = ? AND version = ? "
                               "AND error IS NULL", (source, version))
        return {r["key"] for r in rows}

    def scored_keys(self, scorer: str) -> set[str]:
        return {r["key"] for r in self.db.execute("SELECT key FROM scores WHERE scorer = ?",
                                                  (scorer,))}

    # -- reading a run ------------------------------------------------------------------------
    def label_sources(self) -> list[str]:
        """Which labellers decide a turn's label, first non-empty wins (set by run and judge)."""
        return self.meta().label_sources

    def user_turn_rows(self) -> list[dict[str, Any]]:
        """Every planned user turn joined with its generation, the answer it follows (the
        context's answer, perturbed or not) and that answer's task score, in report order.
        ``userturn.store.turns.read_turns`` makes them :class:`~userturn.store.turns.Turn` values."""
        query = """
        SELECT p.model, p.dataset, p.item_id, p.context, p.temperature, p.sample_index,
               p.answerer, p.perturbation, p.key, g.text, g.raw_text, g.thinking,
               g.finish_reason, g.error, g.prompt, COALESCE(c.answer, a.text) AS answer,
               s.correct
        FROM plan p
        JOIN generations g ON g.key = p.key
        LEFT JOIN generations a ON a.key = p.assistant_key
        LEFT JOIN scores s ON s.key = p.assistant_key
        LEFT JOIN contexts c ON c.context = p.context
        WHERE p.role = 'user'
        ORDER BY p.model, p.answerer, p.dataset, p.perturbation, p.temperature, p.item_id,
                 p.sample_index
        """
        return [dict(r) for r in self.db.execute(query)]

    def plan_rows(self, role: str) -> list[PlanRow]:
        """The planned generations of one role, for exports that rebuild a run elsewhere."""
        rows = self.db.execute("SELECT * FROM plan WHERE role = ? ORDER BY model, dataset, "
                               "item_id, context, temperature, sample_index", (role,))
        return [PlanRow(**dict(r)) for r in rows]

    def put_contexts(self, rows: Sequence[ContextRow]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO contexts VALUES (?, ?, ?)",
                                [(r.context, r.perturbation, scrub(r.answer)) for r in rows])

    def answer_rows(self) -> list[dict[str, Any]]:
        """Every planned assistant answer joined with its task score (``details`` decoded)."""
        query = """
        SELECT p.model, p.dataset, p.item_id, p.key, g.text, g.thinking, g.error,
               g.finish_reason, s.correct, s.extracted, s.reference, s.scorer, s.details
        FROM plan p JOIN generations g ON g.key = p.key
        LEFT JOIN scores s ON s.key = p.key
        WHERE p.role = 'assistant' ORDER BY p.model, p.dataset, p.item_id
        """
        rows = [dict(r) for r in self.db.execute(query)]
        for row in rows:
            row["details"] = json.loads(row["details"]) if row["details"] else {}
        return rows


for _name, _method in list(vars(RunStore).items()):
    if callable(_method) and not _name.startswith("_") and _name not in (
            "create", "open", "check_present", "close"):
        setattr(RunStore, _name, _storage_errors(_method))
