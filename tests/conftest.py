"""Shared fixtures: the tiny real model (built once per session) and a small offline dataset."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from userturn.backends.hf import TransformersBackend
from userturn.backends.models import resolve_model
from userturn.labels.classifier import MODEL_FILE as SHIPPED_MODEL_FILE

# The tests are offline (as CI is): a hub id must fail at once, not after minutes of retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex


class NetworkUse(RuntimeError):
    """A test tried to reach a host other than this machine."""


def _check_local(sock: socket.socket, address: object) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0] if isinstance(address, tuple) else address
        if host not in LOCAL_HOSTS:
            raise NetworkUse(f"tests may open sockets to 127.0.0.1 only, not {address!r}")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread_in_the_quick_suite(request):
    """`make test` (and any run of test files by hand) runs torch on one thread: the tiny
    model's operations take microseconds, and two threads on two cores wait for each other at
    every one (milliseconds, far more when the cores are shared). A run that selects the
    real-model tests (`make test-slow`, -m slow) keeps torch's default."""
    markexpr = request.config.getoption("markexpr") or ""
    torch = None
    if "slow" not in markexpr or "not slow" in markexpr:
        try:
            import torch
        except ImportError:  # the suite without the transformers extra
            torch = None
    threads = torch.get_num_threads() if torch else None
    if torch:
        torch.set_num_threads(1)
    yield
    if torch and threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def local_sockets_only(monkeypatch):
    """Every test: a connection to anything but 127.0.0.1 / localhost fails at once, so no test
    can reach the network by accident (as CI must not)."""
    def connect(self, address):
        _check_local(self, address)
        return _connect(self, address)

    def connect_ex(self, address):
        _check_local(self, address)
        return _connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


def _reads_in_context(node) -> bool:
    return bool(node.get_closest_marker("context_reader") or node.get_closest_marker("slow"))


@pytest.fixture(autouse=True, scope="module")
def form_classifier_for_module_fixtures(request):
    """The same rule (below) for a test file's module-scoped fixtures (a run built once per
    file): they are set up before any per-test fixture runs, so they are covered here."""
    if _reads_in_context(request.node):
        yield
        return
    from userturn.labels import classifier

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(classifier, "MODEL_FILE", classifier.FORM_MODEL_FILE)
        yield


@pytest.fixture(autouse=True)
def form_classifier_unless_reading_in_context(request, monkeypatch):
    """Every test labels with the form-only classifier (numpy alone) where a run or a caller
    takes the shipped default, unless the test is about the default's context reader (marked
    ``context_reader``) or runs the real model anyway (``slow``). The default reads each turn
    with SmolLM2 (seconds a turn on 2 cores); what a labelling test checks (the cascade's order,
    versions, stored probabilities, resume) holds for either parameter file, and the context
    reader's own behaviour is tested where it is marked. An explicit ``--classifier context`` or
    path still loads what it names."""
    from userturn.labels import classifier

    monkeypatch.setattr(classifier, "MODEL_FILE", SHIPPED_MODEL_FILE
                        if _reads_in_context(request.node) else classifier.FORM_MODEL_FILE)


QUESTIONS = [
    ("Tom has 3 boxes of 12 pencils. He gives away 10 pencils. How many are left?", "26"),
    ("A shop sells 45 apples on Monday and twice as many on Tuesday. How many in total?", "135"),
    ("Mia reads 20 pages a day for 6 days. How many pages does she read?", "120"),
    ("A train travels 60 km per hour for 3 hours. How far does it go?", "180"),
    ("Sam had $50 and spent $18 on a book. How much money does he have left?", "32"),
    ("There are 7 rows of 8 chairs. How many chairs are there?", "56"),
]


@pytest.fixture(scope="session")
def tiny_backend() -> TransformersBackend:
    return TransformersBackend(resolve_model("tiny"), batch_size=4)


@pytest.fixture
def gsm_file(tmp_path: Path) -> Path:
    """A local GSM8K-format JSONL file of six items."""
    path = tmp_path / "mini_gsm.jsonl"
    rows = [{"question": q, "answer": f"Work it out.\n#### {a}"} for q, a in QUESTIONS]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="session")
def browser():
    """Headless Debian Chromium driven by Playwright (no `playwright install`: offline)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} missing (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
