"""Writing an export folder whole: it is built beside its destination and renamed into place,
so a failed or interrupted export never leaves a half-written folder under the name asked for."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from userturn.errors import StoreError
from userturn.store.atomic import describe, make_folder
from userturn.store.database import DB_NAME


def write_folder(out: Path, build: Callable[[Path], None], *, force: bool = False) -> Path:
    """``build(empty temporary folder)``, then the folder renamed to ``out``. An existing
    non-empty ``out`` is replaced only with ``force``, and a run folder never."""
    out = Path(out)
    if out.is_file():
        raise StoreError(f"{out} is a file: give a folder to write the export into")
    if (out / DB_NAME).exists():
        raise StoreError(f"refusing to write over {out}: it is a run folder (choose another)")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise StoreError(f"{out} exists and is not empty: give --force to replace it, or "
                         "choose another folder")
    make_folder(out.parent)
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir()
        build(temporary)
        if out.exists():
            shutil.rmtree(out)
        os.replace(temporary, out)
    except OSError as exc:
        raise StoreError(describe(exc, out)) from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return out
