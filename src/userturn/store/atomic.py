"""Writes that cannot destroy: every file userturn writes goes to a temporary name beside it and
is renamed into place, so a reader, a kill or a full disk never sees half a file.

A path the user names is not replaced unless they say ``force``; a run's database (or anything
that is a SQLite file) is never written over, ``force`` or not. A full disk or a permission error
becomes one ``StoreError`` line naming the path, with the temporary file removed.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Callable

from userturn.credentials import scrub
from userturn.errors import StoreError

SQLITE_HEADER = b"SQLite format 3\x00"
RUN_FILES = ("userturn.db", "userturn.db-wal", "userturn.db-shm", "userturn.lock")

# Where a written file is forced to disk: the seam where a full or read-only disk is injected
# (tests replace it; every write of this module goes through it).
sync_to_disk = os.fsync


def write_file(path: Path, write: Callable[[Path], object], *, force: bool = True) -> Path:
    """``write(temporary path)``, then rename it to ``path``. ``force`` False: an existing file is
    refused (one line saying to give --force)."""
    path = Path(path)
    refuse_to_replace(path, force)
    make_folder(path.parent)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        with open(temporary, "rb+") as handle:  # on disk before the rename makes it visible
            sync_to_disk(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        _discard(temporary)
        raise StoreError(describe(exc, path)) from None
    except BaseException:
        _discard(temporary)
        raise
    return path


def _discard(temporary: Path) -> None:
    """Remove a temporary that failed, where the file system lets us. On the error path the
    failure already raised is what the user must hear: a read-only file system refuses the
    unlink too (EROFS), and that second error must not bury the first under two tracebacks."""
    try:
        temporary.unlink(missing_ok=True)
    except OSError:
        pass


def write_folder(folder: Path, write: Callable[[Path], object]) -> Path:
    """``write(temporary folder)`` makes a set of files, fsynced, then the set replaces
    ``folder`` whole: a kill or a full disk leaves the earlier set or none, never part of one."""
    folder = Path(folder)
    make_folder(folder.parent)
    if folder.exists() and not folder.is_dir():
        raise StoreError(f"{folder} is a file, not a folder: choose another path")
    staging, old = (folder.with_name(f".{folder.name}.{os.getpid()}.{end}")
                    for end in ("tmp", "old"))
    for stale in (staging, old):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        staging.mkdir()
        write(staging)
        for path in staging.iterdir():
            with open(path, "rb+") as handle:
                sync_to_disk(handle.fileno())
        if folder.exists():
            os.rename(folder, old)
        os.rename(staging, folder)
    except OSError as exc:
        if old.exists() and not folder.exists():
            try:
                os.rename(old, folder)  # the earlier set stays in place
            except OSError:
                pass  # it stays under its temporary name (kept below): the first error is said
        raise StoreError(describe(exc, folder)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if folder.exists():  # never the earlier set while it is the only one
            shutil.rmtree(old, ignore_errors=True)
    return folder


def write_text(path: Path, text: str, *, force: bool = True) -> Path:
    """Text (scrubbed of API keys) written atomically."""
    clean = scrub(text)
    return write_file(path, lambda tmp: tmp.write_text(clean, encoding="utf-8"), force=force)


def refuse_to_replace(path: Path, force: bool) -> None:
    if path.is_dir():
        raise StoreError(f"{path} is a directory: give a file name")
    if path.name in RUN_FILES or _is_sqlite(path):
        raise StoreError(f"refusing to write over {path}: it is a run's database "
                         "(choose another file name)")
    if path.exists() and not force:
        raise StoreError(f"{path} exists: give --force to replace it, or choose another name")


def make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise StoreError(f"{folder} is a file, not a folder: choose another path") from None
    except OSError as exc:
        raise StoreError(describe(exc, folder)) from None


def describe(exc: OSError, path: Path) -> str:
    """One line: which path, what happened, what to do."""
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return (f"cannot write {path}: no space left on the device; free some space and run the "
                "same command again (nothing half-written was left)")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"cannot write {path}: permission denied (a read-only folder?); choose a "
                "writable place")
    if exc.errno == errno.ENOTDIR:
        return f"cannot write {path}: a part of the path is a file, not a folder"
    if exc.errno == errno.EISDIR:
        return f"cannot write {path}: it is a directory"
    return f"cannot write {path}: {exc.strerror or exc}"


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False
