"""The run folder is owned: one writer at a time holds an exclusive lock on RUN/userturn.lock.

``fcntl.flock`` on an open file: held for the writer's life and released by the operating system
when the process ends however it ends (SIGKILL included), so a stale lock cannot exist. The file
holds the writer's PID and command, for the one line a second writer gets and for readers, which
never take the lock: they read what is stored and say the run is in progress.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO, NamedTuple

from userturn.errors import StoreError
from userturn.store.atomic import RUN_FILES, describe, make_folder

LOCK_NAME = "userturn.lock"


class _Found(NamedTuple):
    """The lock file as a command found it: put back when the command fails."""

    record: bytes
    atime_ns: int
    mtime_ns: int


class RunLock:
    """``with RunLock(folder, "run"):`` the folder is this process's until the block ends."""

    def __init__(self, folder: Path, command: str) -> None:
        self.folder, self.command = Path(folder), command
        self._handle: IO[bytes] | None = None
        self._found: _Found | None = None
        self._made_folder = self._made_lock = False

    def __enter__(self) -> RunLock:
        refuse_links(self.folder)
        self._made_folder = not self.folder.exists()
        make_folder(self.folder)
        path = self.folder / LOCK_NAME
        made = not path.exists()
        try:
            handle = open(path, "a+b")
        except OSError as exc:
            self._tidy(made)
            raise StoreError(describe(exc, path)) from None
        # A reader peeking at the lock (``held``) holds it for microseconds: a few short tries
        # outlast it, and a busy folder is still refused at once.
        deadline = time.monotonic() + 0.1
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise _busy(self.folder) from None
                time.sleep(0.01)
        found = None
        try:
            found = None if made else _read_found(handle)
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()} {self.command}\n".encode())
            handle.flush()
        except OSError as exc:  # a full disk: one line, and no 0-byte lock left behind
            self._release(handle, made, found)
            raise StoreError(describe(exc, path)) from None
        self._handle, self._made_lock, self._found = handle, made, found
        return self

    def __exit__(self, failed: object, *exc: object) -> None:
        if self._handle is not None:
            # A run that failed before its store was made (misuse, a dataset that will not load)
            # leaves the folder as it found it.
            self._release(self._handle, self._made_lock and failed is not None and not any(
                p.name != LOCK_NAME for p in self.folder.iterdir()),
                self._found if failed is not None else None)
            self._handle = None

    def _release(self, handle: IO[bytes], remove: bool, found: _Found | None) -> None:
        """Unlock and close; ``found``: first put back the lock file this command found.

        The record names a writer only while one holds the lock, so the one found is as true
        as this command's once it lets go: a command refused after taking the lock (a dataset
        that will not load, a template that will not render) leaves the file byte for byte and
        mtime for mtime as it was, like every other refusal. Closing can report a write the
        disk could not take (a full disk tells some file systems only then): the lock record is
        a courtesy to the next reader, and the run's data is in its database, so that is no
        failure of the command."""
        try:
            if found is not None:
                handle.seek(0)
                handle.truncate()
                handle.write(found.record)
                handle.flush()
                os.utime(handle.fileno(), ns=(found.atime_ns, found.mtime_ns))
            if remove:  # made by this command a moment ago, for a run that never started
                (self.folder / LOCK_NAME).unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)
        except OSError:
            pass  # closing the handle below releases the lock all the same
        try:
            handle.close()
        except OSError:
            pass  # the descriptor is closed (and the lock released) even when close reports
        self._tidy(remove)

    def _tidy(self, removed_lock: bool) -> None:
        if removed_lock and self._made_folder:
            try:
                self.folder.rmdir()
            except OSError:  # something else is in it now: it stays
                pass


def _read_found(handle: IO[bytes]) -> _Found:
    stat = os.fstat(handle.fileno())  # before the read, which may touch the access time
    handle.seek(0)
    return _Found(handle.read(), stat.st_atime_ns, stat.st_mtime_ns)


def refuse_links(folder: Path) -> None:
    """A run file (the database, its WAL, the lock) that is a symbolic link is refused. The
    lock is the folder's, so a database linked into a second folder would have two locks, one
    per folder, and two writers at once; a linked lock file would have this command truncate
    and write whatever the link points at. Taking the lock in the link's folder instead would
    write into a folder the user did not name, and still follow a linked lock file: a run
    folder holds its own files, so a link is a mistake to say, not to follow."""
    for name in RUN_FILES:
        path = Path(folder) / name
        if path.is_symlink():
            raise StoreError(f"{path} is a symbolic link: a run folder holds its own database "
                             "and lock (one lock per database); copy the run folder instead of "
                             "linking its files")


def refuse_if_busy(folder: Path) -> None:
    """The refusal a writer would get, now: lets a command refuse a busy folder before it
    imports and loads what its work needs (``RunLock`` still decides, when it is taken)."""
    refuse_links(Path(folder))
    if held(folder):
        raise _busy(Path(folder))


def _busy(folder: Path) -> StoreError:
    return StoreError(f"{folder} is in use by another writer: "
                      f"{_describe_holder(folder / LOCK_NAME)}; wait for it to finish or choose "
                      "another output folder")


def holder(folder: Path) -> str | None:
    """Who is writing the run now ("pid 123, userturn run"), or None when nobody is."""
    path = Path(folder) / LOCK_NAME
    if not held(folder):
        return None
    record = _lock_record(path)
    if record is not None and record[0] == str(os.getpid()):
        return None  # this command reporting on its own work is not "in progress"
    return _describe_holder(path)


def held(folder: Path) -> bool:
    """Whether any process (this one included) holds the folder's lock now: a shared lock that
    cannot be had means an exclusive one is held."""
    try:
        handle = open(Path(folder) / LOCK_NAME, encoding="utf-8")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _lock_record(path: Path) -> tuple[str, str] | None:
    """(pid, command) as the holder wrote them; None where unreadable."""
    try:
        pid, _, command = path.read_text(encoding="utf-8").strip().partition(" ")
    except OSError:
        return None
    return pid, command


def _describe_holder(path: Path) -> str:
    record = _lock_record(path)
    if record is None:
        return "pid unknown"
    pid, command = record
    return f"pid {pid or 'unknown'}, userturn {command or 'run'}"
