"""The run store: one SQLite database per run folder.

Generations are content-addressed: the key covers everything that changes a generation's
distribution (model, revision, template hash, rendered prompt, decoding parameters, stop markers,
sample index, seed), so a finished generation is never made twice and a sampled one is never served
for another sample index. Every chunk of results is committed in one transaction: a run killed at
any moment restarts where it stopped, losing at most the chunk in flight and never half of one.
The ``plan`` table lists the generations the current experiment is made of; reports read through it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence, cast

from userturn.credentials import scrub, scrub_value
from userturn.errors import DamagedStore, StoreError
from userturn.records import Answer, FinishReason, Generation, GenerationParams, Item, Request
from userturn.store.meta import AnnotationSample, MetaChanges, RunMeta, damaged_meta
from userturn.store.rows import (
    ContextRow,
    ContinuationRow,
    GenerationRow,
    LabelRow,
    PlanRow,
    Probed,
    ScoreRow,
    StoredLabelRow,
    UserTurnRow,
    item_from_record,
    item_record,
    typed_fields,
    typed_model,
)
from userturn.store.sqlite import (
    DB_NAME,
    SCHEMA,
    SCHEMA_VERSION,
    ReadCopy,
    Tally,
    check_folder,
    check_header,
    check_schema,
    connect,
    create_database,
    file_identity,
    generation_values,
    missing_columns,
    needs_upgrade,
    open_for_reading,
    scrubbed,
    storage_error,
    storage_errors,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11


class RunStore:
    """One run's database. ``create`` makes or continues a run (the folder's writer holds its
    ``RunLock``); ``open`` reads an existing one and checks first that it is a userturn store of
    a schema this version knows. Storage faults (a full disk, a read-only folder, a damaged or
    vanished file) are ``StoreError`` lines naming the database."""

    def __init__(self, folder: Path, *, read_only: bool = False) -> None:
        self.folder = Path(folder)
        self.path = self.folder / DB_NAME
        self.tally = Tally()
        self._copy: ReadCopy | None = None
        check_header(self.path)
        self.read_only = read_only or not (os.access(self.folder, os.W_OK)
                                           and os.access(self.path, os.W_OK))
        try:
            if self.read_only:
                self.db, self._copy = open_for_reading(self.path)
            else:
                self.db = connect(self.path, True)
            check_schema(self.db, self.path)
            if self.read_only and self._copy is None and needs_upgrade(self.db):
                # A store of an earlier userturn: brought up to this schema in a copy, as a
                # reader never changes the original.
                self.db.close()
                self._copy = ReadCopy(self.path)
                self.db = self._copy.connect()
            if not self.read_only or self._copy is not None:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                if needs_upgrade(self.db):  # a current store is opened without a write
                    self.db.executescript(f"BEGIN; {SCHEMA} COMMIT;")  # all tables or none
                    self._migrate()
        except sqlite3.Error as exc:
            raise storage_error(exc, self.path) from None
        self._identity = file_identity(self.path)

    def _migrate(self) -> None:
        """Bring a store written by an earlier userturn up to this schema (columns only added)."""
        with self.db:
            for table, name, declaration in missing_columns(self.db):
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                            (json.dumps(SCHEMA_VERSION),))

    @classmethod
    def create(cls, folder: Path) -> RunStore:
        from userturn.store.atomic import make_folder

        make_folder(Path(folder))
        path = Path(folder) / DB_NAME
        if not path.exists():
            create_database(path)
        return cls(folder)

    @classmethod
    def open(cls, folder: Path) -> RunStore:
        """An existing run, to read and write (the caller holds the folder's ``RunLock``)."""
        check_folder(Path(folder))
        return cls(folder)

    @classmethod
    def check(cls, folder: Path) -> None:
        """Refuse, in one line and with nothing written, a folder that is not a whole userturn
        store: not a run, a 0-byte or foreign file, a newer schema, damaged metadata."""
        store = cls.read(folder)
        try:
            store.meta()
        finally:
            store.close()

    @classmethod
    @contextmanager
    def writing(cls, folder: Path, command: str) -> Iterator[RunStore]:
        """The one way a command changes an existing run, once it has checked its own inputs:
        the store is checked read-only first (a refusal leaves no lock and changes no byte),
        then the folder's lock is taken, then the store is opened to write."""
        from userturn.store.lock import RunLock

        cls.check(folder)
        with RunLock(folder, command):
            store = cls.open(folder)
            try:
                yield store
            finally:
                store.close()

    @classmethod
    def read(cls, folder: Path) -> RunStore:
        """An existing run, to read only: every committed row (those a killed writer left in the
        WAL too) and nothing written into the run folder, so a read-only folder or a full disk
        still reads."""
        check_folder(Path(folder))
        return cls(folder, read_only=True)

    def check_present(self) -> None:
        """The database this store opened is still there: a run whose database was deleted or
        replaced under it would store into nothing and say it finished."""
        if file_identity(self.path) != self._identity:
            raise StoreError(f"{self.path} was deleted or replaced while this command ran: what "
                             "it made since is lost; run the same command again")

    def close(self) -> None:
        self.db.close()
        if self._copy is not None:
            self._copy.folder.cleanup()
            self._copy = None

    # -- metadata and items -------------------------------------------------------------------
    def update_meta(self, **changes: Unpack[MetaChanges]) -> RunMeta:
        """Change fields of the run's :class:`RunMeta`, named and typed by :class:`MetaChanges`
        (a name it lacks is refused; a value is validated first: a wrong type is a bug caught
        here, not a report that misreads it later). All of them are stored in one transaction,
        or none; returns the metadata as stored."""
        unknown = sorted(set(changes) - set(MetaChanges.__annotations__))
        if unknown:
            raise TypeError(f"update_meta: {', '.join(map(repr, unknown))} "
                            f"{'is' if len(unknown) == 1 else 'are'} not a field of the run's "
                            "metadata a command changes (MetaChanges: "
                            f"{', '.join(MetaChanges.__annotations__)})")
        current = self.meta()
        updated = RunMeta.model_validate({**current.model_dump(), **changes})
        self._write_meta(updated, changes)
        return updated

    def put_meta(self, meta: RunMeta) -> RunMeta:
        """A new run's metadata as one value (an imported run's): every field ``meta`` was given,
        the keys this version does not know among them, stored in one transaction; the fields
        it was not given stay as stored. Returns the metadata as stored."""
        self._write_meta(meta, [*meta.model_fields_set, *(meta.model_extra or {})])
        return self.meta()

    def _write_meta(self, meta: RunMeta, fields: Iterable[str]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                [(k, json.dumps(scrub_value(v)))
                                 for k, v in meta.rows(fields).items()])

    def put_annotation_sample(self, annotator: str, sample: AnnotationSample) -> None:
        samples = self.meta().annotation_samples
        self.update_meta(annotation_samples={**samples, annotator: sample})

    def meta(self) -> RunMeta:
        rows = {r["key"]: r["value"] for r in self.db.execute("SELECT key, value FROM meta")}
        damaged = damaged_meta(rows)
        if damaged:
            raise DamagedStore(f"{self.path} is damaged: its metadata {damaged}; `userturn doctor "
                               f"{self.folder}` says what can be recovered", damaged)
        return RunMeta.from_rows({key: json.loads(value) for key, value in rows.items()})

    def put_items(self, dataset: str, items: Iterable[Item]) -> None:
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO items VALUES (?, ?, ?)",
                [(dataset, i.id, scrub(json.dumps(item_record(i)))) for i in items])

    def items(self, dataset: str) -> dict[str, Item]:
        """Item id -> the item, of one dataset of the run."""
        rows = self.db.execute("SELECT item_id, data FROM items WHERE dataset = ?", (dataset,))
        return {r["item_id"]: item_from_record(json.loads(r["data"])) for r in rows}

    # -- the plan -----------------------------------------------------------------------------
    def replace_plan(self, rows: Sequence[PlanRow], *, role: str, probed: Probed,
                     dataset: str) -> None:
        """The plan of one role, probed model (with its variants) and dataset, replaced as a
        whole, rows planned before the typed variants (under the variant's name) included."""
        with self.db:
            self.db.execute(
                "DELETE FROM plan WHERE role = ? AND dataset = ? AND ((model = ? AND "
                "user_variant = ? AND enable_thinking = ?) OR (model = ? AND user_variant IS NULL))",
                (role, dataset, *probed, probed.name))
            self.db.executemany(
                "INSERT OR REPLACE INTO plan (key, role, model, dataset, item_id, context, "
                "temperature, sample_index, assistant_key, answerer, perturbation, arm, "
                "user_variant, enable_thinking) VALUES (:key, :role, :model, :dataset, "
                ":item_id, :context, :temperature, :sample_index, :assistant_key, :answerer, "
                ":perturbation, :arm, :user_variant, :enable_thinking)",
                [asdict(row) for row in rows])

    def keep_plan(self, probed: Iterable[Probed], datasets: Sequence[str]) -> None:
        """Drop planned rows of probed models (with their variants) or datasets the current
        experiment no longer has."""
        kept = set(probed)
        marks_d = ",".join("?" * len(datasets))
        with self.db:
            for r in self.db.execute("SELECT DISTINCT model, user_variant, enable_thinking "
                                     "FROM plan").fetchall():
                if typed_model(*r) not in kept:
                    self.db.execute("DELETE FROM plan WHERE model = ? AND user_variant IS ? AND "
                                    "enable_thinking IS ?", tuple(r))
            self.db.execute(f"DELETE FROM plan WHERE dataset NOT IN ({marks_d})", [*datasets])

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
                [generation_values(row, now) for row in rows])

    def generations(self, keys: Sequence[str]) -> dict[str, GenerationRow]:
        """Key -> the stored generation, for the keys the store holds (as stored: the same row
        :meth:`put_generations` took)."""
        out: dict[str, GenerationRow] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(f"SELECT * FROM generations WHERE key IN ({marks})", chunk)
            out.update((r["key"], _generation_row(r)) for r in rows)
        return out

    # -- scores and labels --------------------------------------------------------------------
    def put_scores(self, rows: Sequence[ScoreRow]) -> None:
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?, ?, ?)",
                [(r.key, r.scorer, int(r.score.correct), r.score.extracted, r.score.reference,
                  json.dumps(dict(r.score.details))) for r in rows])

    def put_labels(self, rows: Sequence[LabelRow]) -> None:
        """One label per key and source, the newest wins."""
        now = time.time()
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO labels (key, source, version, label, rationale, error, "
                "created, probability) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(r.key, r.label.source, r.version, r.label.label, scrubbed(r.label.rationale),
                  scrubbed(r.label.error), now, r.label.probability) for r in rows])

    def delete_label(self, key: str, source: str) -> None:
        with self.db:
            self.db.execute("DELETE FROM labels WHERE key = ? AND source = ?", (key, source))

    def label_rows(self) -> list[StoredLabelRow]:
        """Every stored label, by source."""
        return [StoredLabelRow(**dict(r)) for r in self.db.execute(
            f"SELECT {LABEL_COLUMNS} FROM labels ORDER BY source")]

    def stored_label_sources(self) -> list[str]:
        """Every source the run holds labels from, by name."""
        return [r["source"] for r in
                self.db.execute("SELECT DISTINCT source FROM labels ORDER BY source")]

    def keys_labelled_by(self, source: str) -> list[StoredLabelRow]:
        """One source's labels, newest first (rowid breaks ties of equal times)."""
        rows = self.db.execute(f"SELECT {LABEL_COLUMNS} FROM labels WHERE source = ? "
                               "ORDER BY created DESC, rowid DESC", (source,))
        return [StoredLabelRow(**dict(r)) for r in rows]

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

    def user_turn_rows(self) -> list[UserTurnRow]:
        """Every planned user turn joined with its generation, the answer it follows (the
        context's answer, perturbed or not) and that answer's task score, in report order.
        ``userturn.store.turns.read_turns`` makes them :class:`~userturn.store.turns.Turn` values."""
        query = """
        SELECT p.model, p.dataset, p.item_id, p.context, p.temperature, p.sample_index,
               p.answerer, p.perturbation, p.key, g.text, g.raw_text, g.thinking,
               g.finish_reason, g.error, g.prompt, COALESCE(c.answer, a.text) AS answer,
               s.correct, p.arm, n.next_role, n.user_turn, n.boundary, n.p_user,
               n.p_assistant, n.p_end, p.user_variant, p.enable_thinking
        FROM plan p
        JOIN generations g ON g.key = p.key
        LEFT JOIN generations a ON a.key = p.assistant_key
        LEFT JOIN scores s ON s.key = p.assistant_key
        LEFT JOIN contexts c ON c.context = p.context
        LEFT JOIN continuations n ON n.key = p.key
        WHERE p.role = 'user'
        ORDER BY p.model, p.arm != 'opened', p.arm, p.answerer, p.dataset, p.perturbation,
                 p.temperature, p.item_id, p.sample_index
        """
        rows = [UserTurnRow(**{**dict(r), **typed_fields(r), "correct": _correct(r["correct"])})
                for r in self.db.execute(query)]
        # In report order by the name the tables print: a variant's turns after its model's,
        # as when the variant was stored as a model named MODEL[user=SPEC].
        return sorted(rows, key=lambda r: (
            Probed(r.model, r.user_variant, r.enable_thinking).name, r.arm != "opened", r.arm,
            r.answerer, r.dataset, r.perturbation, r.temperature, r.item_id, r.sample_index))

    def put_continuations(self, rows: Sequence[ContinuationRow]) -> None:
        """How continuation-arm generations read (their parsed role and user turn) and their
        next-role probabilities, replacing what the keys had."""
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO continuations VALUES (:key, :next_role, :user_turn, "
                ":boundary, :p_user, :p_assistant, :p_end)",
                [{**asdict(row), "user_turn": scrubbed(row.user_turn)} for row in rows])

    def continuations(self, keys: Sequence[str]) -> dict[str, ContinuationRow]:
        """The stored readings of these continuation keys (keys not read yet are missing)."""
        found: dict[str, ContinuationRow] = {}
        for start in range(0, len(keys), 500):
            chunk = list(keys[start:start + 500])
            marks = ",".join("?" * len(chunk))
            for r in self.db.execute(f"SELECT * FROM continuations WHERE key IN ({marks})",
                                     chunk):
                found[r["key"]] = ContinuationRow(**dict(r))
        return found

    def plan_rows(self, role: str) -> list[PlanRow]:
        """The planned generations of one role, for exports that rebuild a run elsewhere."""
        rows = self.db.execute("SELECT * FROM plan WHERE role = ? ORDER BY model, dataset, "
                               "item_id, context, temperature, sample_index", (role,))
        return [PlanRow(**{**dict(r), **typed_fields(r)}) for r in rows]

    def put_contexts(self, rows: Sequence[ContextRow]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO contexts VALUES (?, ?, ?)",
                                [(r.context, r.perturbation, scrub(r.answer)) for r in rows])

    def answer_rows(self) -> list[Answer]:
        """Every planned assistant answer joined with its task scores: one row per answer and
        scorer, one with the score fields None where the answer is not scored."""
        query = """
        SELECT p.model, p.dataset, p.item_id, p.key, g.text, g.thinking, g.error,
               g.finish_reason, s.correct, s.extracted, s.reference, s.scorer, s.details,
               p.user_variant, p.enable_thinking
        FROM plan p JOIN generations g ON g.key = p.key
        LEFT JOIN scores s ON s.key = p.key
        WHERE p.role = 'assistant' ORDER BY p.model, p.dataset, p.item_id
        """
        answers = []
        for r in self.db.execute(query):
            fields = {**dict(r), **typed_fields(r), "correct": _correct(r["correct"]),
                      "details": json.loads(r["details"]) if r["details"] else {}}
            del fields["user_variant"]  # answers are native's: every variant follows them
            answers.append(Answer(**fields))
        # By the name the tables print, as when a thinking variant was a model of its own.
        return sorted(answers, key=lambda a: (Probed(a.model, enable_thinking=a.enable_thinking).name,
                                              a.dataset, a.item_id))


LABEL_COLUMNS = "key, source, version, label, rationale, error, probability"


def _correct(stored: int | None) -> bool | None:
    return None if stored is None else bool(stored)


def _generation_row(r: sqlite3.Row) -> GenerationRow:
    request = Request(r["prompt"], GenerationParams(r["temperature"], r["top_p"],
                                                    r["max_tokens"]),
                      tuple(json.loads(r["stop"])), r["seed"])
    generation = Generation(r["text"], r["raw_text"], cast(FinishReason, r["finish_reason"]),
                            r["prompt_tokens"], r["completion_tokens"], r["error"],
                            r["thinking"])
    return GenerationRow(r["key"], r["role"], r["model"], r["revision"], r["template_hash"],
                         request, r["sample_index"], generation)


for _name, _method in list(vars(RunStore).items()):
    if callable(_method) and not _name.startswith("_") and _name not in (
            "create", "open", "read", "check", "writing", "check_present", "close"):
        setattr(RunStore, _name, storage_errors(_method))
