"""Where a run stands: finished, in progress (a writer holds the folder) or incomplete (it
stopped early), with planned vs stored per stage and the rows skipped at load. Every reader
(``report``, the HTML page, ``summary`` after ``run``/``judge``, ``doctor``) says the same."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from userturn.errors import DamagedStore, UserturnError
from userturn.store.database import RunStore
from userturn.store.lock import holder
from userturn.store.sqlite import storage_faults

STAGE_NAMES = {"assistant": "assistant turns", "user": "user turns"}


@dataclass(frozen=True)
class Stage:
    role: str
    planned: int
    stored: int  # generated without error
    failed: int  # stored as errors (retried by the next run)


@dataclass(frozen=True)
class RunState:
    finished: bool
    writer: str | None  # "pid 123, userturn run" while one holds the folder
    stages: tuple[Stage, ...]
    skipped: dict[str, int] = field(default_factory=dict)  # dataset -> rows skipped at load

    @property
    def complete(self) -> bool:
        return self.finished and self.writer is None and all(
            s.stored + s.failed >= s.planned for s in self.stages)

    def counts(self) -> str:
        return ", ".join(f"{STAGE_NAMES.get(s.role, s.role)} {s.stored} of {s.planned} stored"
                         + (f" ({s.failed} failed)" if s.failed else "") for s in self.stages)

    def line(self) -> str | None:
        """One line on a run that is not finished and whole; None for one that is."""
        if self.writer is not None:
            return (f"run in progress ({self.writer}): {self.counts()} so far; these tables "
                    "show what is stored now")
        if not self.complete:
            return (f"incomplete run: {self.counts() or 'nothing stored'}; the run stopped "
                    "before it finished: run the same command again to resume")
        return None

    def skipped_line(self) -> str | None:
        if not self.skipped:
            return None
        parts = ", ".join(f"{name}: {count}" for name, count in self.skipped.items())
        return f"rows skipped at load (invalid, counted in the run's metadata): {parts}"


def run_state(store: RunStore) -> RunState:
    meta = store.meta()
    with storage_faults(store.path):  # damage found here is one line, as in every other read
        rows = store.db.execute(
            "SELECT p.role, COUNT(*) AS planned, "
            "SUM(g.key IS NOT NULL AND g.error IS NULL) AS stored, "
            "SUM(g.error IS NOT NULL) AS failed "
            "FROM plan p LEFT JOIN generations g ON g.key = p.key "
            "WHERE p.model != 'human' GROUP BY p.role ORDER BY p.role")
        stages = tuple(Stage(r["role"], r["planned"], r["stored"] or 0, r["failed"] or 0)
                       for r in rows)
    return RunState(meta.finished_now, holder(store.folder), stages, dict(meta.skipped))


class StoredSettings(Protocol):
    def lost_settings(self) -> list[str]: ...


StoredReader = Callable[[Mapping[str, Any]], StoredSettings]


@dataclass(frozen=True)
class Checkup:
    """What ``userturn doctor`` found: the problems of a run folder's store (none: it is whole)
    and, for a whole one, where the run stands."""

    problems: list[str]
    state: RunState | None


def checkup(folder: Path, settings: StoredReader | None = None) -> Checkup:
    """Check the run in ``folder`` (read only). A store too damaged to open is a finding, as
    any other damage; a folder that is no userturn store (or of a newer schema) is refused
    with its ``StoreError``, as every command refuses it."""
    try:
        store = RunStore.read(folder)
    except DamagedStore as exc:
        return Checkup([f"integrity: the database is damaged ({exc.detail}); copy out what "
                        "reads, then run again into a new folder"], None)
    with closing(store):
        problems = doctor(store, settings)
        return Checkup(problems, None if problems else run_state(store))


def doctor(store: RunStore, settings: StoredReader | None = None) -> list[str]:
    """Problems of a run's store (none: it is whole): SQLite's integrity check, plan rows
    without a unique key, planned rows that point at missing answers, and (``settings``: the
    typed reader of a stored experiment, ``Experiment.stored``, from the floor above) a
    stored experiment that does not read, which every later command would refuse, or that
    lost what the run probed."""
    try:
        problems = [f"integrity: {r[0]}" for r in store.db.execute("PRAGMA integrity_check")
                    if r[0] != "ok"]
    except sqlite3.DatabaseError as exc:  # too damaged for the check itself to read
        return [f"integrity: the database is damaged ({exc})"]
    if problems:
        return problems
    with storage_faults(store.path):
        return problems + _table_problems(store, settings)


def _table_problems(store: RunStore, settings: StoredReader | None) -> list[str]:
    """The problems the integrity check cannot see: lost metadata, a stored experiment that no
    longer reads, duplicate and dangling plan rows."""
    problems: list[str] = []
    try:
        config = store.meta().config
    except DamagedStore as exc:
        counts = ", ".join(f"{n} {table}" for table, n in (
            (table, store.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("plan", "generations", "labels", "scores", "items")))
        problems.append(f"meta: {exc.detail} (the run's settings and labelling record are lost); "
                        f"the tables are whole and can be recovered ({counts} rows, e.g. with "
                        "`sqlite3 RUN/userturn.db .dump`): run the experiment again into a new "
                        "folder to have a readable run")
    else:
        problems += _settings_problems(config, settings)
    duplicates = store.db.execute(
        "SELECT COUNT(*) - COUNT(DISTINCT key) FROM plan").fetchone()[0]
    if duplicates:
        problems.append(f"plan: {duplicates} planned generation(s) listed twice")
    dangling = store.db.execute(
        "SELECT COUNT(*) FROM plan p WHERE p.assistant_key IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM generations g WHERE g.key = p.assistant_key)").fetchone()[0]
    if dangling:
        problems.append(f"plan: {dangling} user turn(s) planned after an answer that is not "
                        "stored")
    return problems


def _settings_problems(config: Mapping[str, Any], settings: StoredReader | None) -> list[str]:
    if settings is None:
        return []
    try:
        lost = settings(config).lost_settings()
    except UserturnError as exc:
        return [f"config: {exc}"]
    return [f"config: the run's stored experiment names no {' and no '.join(lost)} (every run "
            "stores them; read without, the defaults would make it another run)"] if lost else []
