"""Blind human annotation of generated user turns: ``userturn annotate RUN``.

A standard-library HTTP server on 127.0.0.1 serves one self-contained page and a small JSON API:

- ``GET /``               the page (no external resources)
- ``GET /api/config``     the annotator name and the labels (the taxonomy's rows) with their
  definitions and keys
- ``GET /api/next``       the next unlabelled context of the sample, or ``done``
- ``GET /api/progress``   ``{"done": n, "total": N, "to_correction", "conditions", "short"}``:
  per condition of the sample (unnamed, in the run's order: the page stays blind) the labels
  made and planned, those of other people included, against the minimum a corrected rate
  needs; ``to_correction``: how many more until every condition that can get there has it;
  ``short``: conditions this sample cannot bring to that minimum
- ``POST /api/label``     ``{"key", "label", "note"}``: store the label, answer like ``/api/next``
- ``POST /api/undo``      remove this annotator's last label and answer with that context again

The page only ever sees the query, the assistant answer and the user turn: never the model, the
temperature or any other source's label, so the human labels stay blind. Every label is written
to the run store on the click that makes it, so closing the browser loses nothing.
"""

from __future__ import annotations

import json
import random
import re
import secrets
import threading
import webbrowser
from contextlib import closing
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from userturn.errors import Terminated, UserturnError
from userturn.labels.calibration import calibration_sample, condition_plans, progress_of
from userturn.records import LABELS, Label, Turn
from userturn.stats.correction import MIN_HUMAN_LABELS
from userturn.store.database import RunStore
from userturn.store.meta import AnnotationSample
from userturn.store.rows import LabelRow
from userturn.store.view import StoredRun, read_stored_run
from userturn.taxonomy import TAXONOMY

DEFAULT_SIZE = 100
DEFAULT_SEED = 0
HUMAN_VERSION = "human"
MAX_NOTE = 4000
MAX_BODY = 64 * 1024
UNDECIDED = "undecided"  # the stratum of turns the strata source could not label
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

# One line per label, condensed from docs/labels.md (the specification annotators follow): the
# taxonomy's guide lines.
DEFINITIONS: dict[str, str] = {kind.name: kind.guide for kind in TAXONOMY.kinds}
# The keys that label, 1 to the number of labels, in the taxonomy's order (the page is told them
# in its config; its hint and key handler are filled in when it is served).
LABEL_KEYS = "".join(str(i + 1) for i in range(len(LABELS)))


class AnnotationError(UserturnError):
    """The annotation session cannot start (bad name, empty run, a conflicting stored sample)."""


class _Reject(Exception):
    """A request the API refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


# -- the sample ----------------------------------------------------------------------------------
def build_sample(turns: Sequence[Turn], *, size: int = DEFAULT_SIZE, seed: int = 0) -> list[str]:
    """A stratified sample of user-turn keys: rare labels get as many slots as common ones.

    Strata are the turns' labels (read them with the source to stratify by, e.g.
    ``read_turns(store, "rules")``; undecided turns form their own stratum); slots are
    shared as evenly as the strata sizes allow, and the result is shuffled so strata interleave.
    Failed generations are left out: there is no user turn to judge. Deterministic per seed.
    """
    if size < 1:
        raise ValueError(f"sample size must be at least 1, got {size}")
    strata: dict[str, list[str]] = {}
    for turn in turns:
        if turn.labellable:
            strata.setdefault(turn.label or UNDECIDED, []).append(turn.key)
    rng = random.Random(seed)
    chosen: list[str] = []
    for name, take in _allocate({k: len(v) for k, v in strata.items()}, size, rng).items():
        keys = sorted(strata[name])  # sorted first: the store's row order must not matter
        rng.shuffle(keys)
        chosen.extend(keys[:take])
    rng.shuffle(chosen)
    return chosen


def _allocate(sizes: dict[str, int], size: int, rng: random.Random) -> dict[str, int]:
    """Slots per stratum, handed out one round at a time; a full stratum passes its turn on."""
    take = dict.fromkeys(sizes, 0)
    order = sorted(sizes)
    rng.shuffle(order)  # which strata get the remainder depends on the seed, not the name
    left = min(size, sum(sizes.values()))
    while left:
        for name in order:
            if left and take[name] < sizes[name]:
                take[name] += 1
                left -= 1
    return take


def _sample_for(store: RunStore, run: StoredRun, annotator: str, size: int | None,
                seed: int | None, strata_source: str, calibration: int | None = None
                ) -> list[str]:
    """The annotator's stored sample, or a new one stored right away (reopening gives the same)
    from ``run``, the store's run as read. ``calibration``: a calibration sample of that size
    instead (:mod:`.calibration`)."""
    stored = store.meta().annotation_samples.get(annotator)
    if calibration is not None:
        size = calibration
        if stored is not None and not stored.calibration:
            raise AnnotationError(f"{annotator} already has an annotation sample that is not a "
                                  "calibration sample: calibrate under another name")
    if stored is not None:
        for name, given in (("size", size), ("seed", seed)):
            if given is not None and given != getattr(stored, name):
                raise AnnotationError(
                    f"{annotator} already has a sample with {name} {getattr(stored, name)}, "
                    f"not {given}: "
                    f"reopen without --{name} to continue it, or annotate under another name")
        return list(stored.keys)
    size = DEFAULT_SIZE if size is None else size
    seed = DEFAULT_SEED if seed is None else seed
    if size < 1:
        raise AnnotationError(f"sample size must be at least 1, got {size}")
    if calibration is not None:
        # Stratified by the run's own labeller (its label sources), the one being corrected.
        keys, inclusion = calibration_sample(run.turns, size, seed, store.label_sources())
        if not keys:
            raise AnnotationError(
                f"no condition of {store.folder} has the {MIN_HUMAN_LABELS} turns a corrected "
                "rate needs, or every turn is labelled: no calibration sample can correct a "
                "rate here (userturn annotate RUN --annotator NAME labels a sample for agreement)")
        store.put_annotation_sample(annotator, AnnotationSample(
            keys=keys, size=size, seed=seed, labeller=store.label_sources(), inclusion=inclusion))
        return keys
    keys = build_sample(run.with_sources(strata_source).turns, size=size, seed=seed)
    if not keys:
        raise AnnotationError(f"{store.folder} has no generated user turns to annotate")
    store.put_annotation_sample(annotator, AnnotationSample(keys=keys, size=size, seed=seed,
                                                            strata_source=strata_source))
    return keys


def _contexts(turns: Sequence[Turn], keys: list[str]) -> dict[str, dict[str, str]]:
    """What the page may see of each sampled turn: query, answer, user turn; nothing else."""
    wanted = set(keys)
    return {turn.key: {"key": turn.key, "user_turn": turn.user_turn or "",
                       "answer": turn.answer, "query": turn.query}
            for turn in turns if turn.key in wanted}


# -- the server ----------------------------------------------------------------------------------
class AnnotationServer:
    """The annotation page of one run folder and one annotator, on 127.0.0.1 only."""

    def __init__(self, folder: Path | str, annotator: str, size: int | None = None,
                 seed: int | None = None, *, port: int = 0, strata_source: str = "rules",
                 calibration: int | None = None) -> None:
        if not NAME_PATTERN.fullmatch(annotator):
            raise AnnotationError(f"annotator name {annotator!r}: use letters, digits, _ . -")
        self.folder, self.annotator = Path(folder), annotator
        self.source = f"human:{annotator}"
        # The port first: a server that cannot start stores nothing (no sample to conflict with
        # a later --size).
        try:
            self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        except OSError as exc:
            raise AnnotationError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}): choose "
                                  "another --port, or leave it out for a free one") from None
        try:
            with closing(RunStore.open(self.folder)) as store:
                run = read_stored_run(store)  # read once: the sample, the page, the plans
                sample = _sample_for(store, run, annotator, size, seed, strata_source,
                                     calibration)
                self.contexts = _contexts(run.turns, sample)
                self.plans = condition_plans(run.turns, sample, self.source)
        except BaseException:
            self._httpd.server_close()
            raise
        # A key whose turn left the plan (the run was changed) cannot be shown: skip it.
        self.keys = [key for key in sample if key in self.contexts]
        self._lock = threading.Lock()  # one label/undo at a time: undo must see a settled state
        self._httpd.app = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None
        port = self._httpd.server_address[1]
        self.host = f"127.0.0.1:{port}"
        self.hosts = {self.host, f"localhost:{port}"}  # what a browser may call us

    @property
    def url(self) -> str:
        return f"http://{self.host}/"

    def start(self) -> AnnotationServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="userturn-annotate")
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for a loop, so only if one runs
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> AnnotationServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API (each call opens its own store: sqlite3 connections stay in their thread) ------
    def config(self) -> dict[str, Any]:
        labels = [{"name": name, "key": key, "definition": DEFINITIONS[name]}
                  for key, name in zip(LABEL_KEYS, LABELS)]
        return {"annotator": self.annotator, "labels": labels}

    def next(self) -> dict[str, Any]:
        with self._lock, closing(RunStore.open(self.folder)) as store:
            return self._next(store)

    def progress(self) -> dict[str, int]:
        with self._lock, closing(RunStore.open(self.folder)) as store:
            return self._progress(self._mine(store))

    def label(self, body: dict[str, Any]) -> dict[str, Any]:
        key, label, note = body.get("key"), body.get("label"), body.get("note", "")
        if not isinstance(key, str) or key not in self.contexts:
            raise _Reject(HTTPStatus.BAD_REQUEST, "key is not in this annotator's sample")
        if label not in LABELS:
            raise _Reject(HTTPStatus.BAD_REQUEST, f"label must be one of {', '.join(LABELS)}")
        if not isinstance(note, str) or len(note) > MAX_NOTE:
            raise _Reject(HTTPStatus.BAD_REQUEST, f"note must be text of at most {MAX_NOTE} chars")
        with self._lock, closing(RunStore.open(self.folder)) as store:
            store.put_labels([LabelRow(key, HUMAN_VERSION,
                                       Label(label, source=self.source, rationale=note.strip()))])
            return self._next(store)

    def undo(self) -> dict[str, Any]:
        with self._lock, closing(RunStore.open(self.folder)) as store:
            last = self._last(store)
            if last is None:
                return {**self._next(store), "undone": None}
            store.delete_label(last["key"], self.source)
            return {"done": False, "item": self.contexts[last["key"]], "undone": last,
                    "progress": self._progress(self._mine(store))}

    def _next(self, store: RunStore) -> dict[str, Any]:
        mine = self._mine(store)
        key = next((k for k in self.keys if k not in mine), None)
        return {"done": key is None, "item": self.contexts.get(key or ""),
                "progress": self._progress(mine)}

    def _mine(self, store: RunStore) -> set[str]:
        return {row.key for row in store.keys_labelled_by(self.source)}

    def _last(self, store: RunStore) -> dict[str, str] | None:
        """This annotator's newest label in the sample (rowid breaks ties of equal times)."""
        for row in store.keys_labelled_by(self.source):
            if row.key in self.contexts:
                return {"key": row.key, "label": row.label,  # type: ignore[dict-item]
                        "note": row.rationale or ""}
        return None

    def _progress(self, mine: set[str]) -> dict[str, Any]:
        done = sum(k in mine for k in self.keys)
        # Per condition: a corrected rate needs MIN_HUMAN_LABELS in its own row, not in all.
        return {"done": done, "total": len(self.keys), **progress_of(self.plans, mine)}

    def plan_lines(self) -> list[str]:
        """What the sample holds per condition, for the terminal (the page names none)."""
        lines = []
        for p in self.plans:
            c = p.condition
            planned = p.others + len(p.keys)
            what = ("a corrected rate needs " f"{MIN_HUMAN_LABELS}: this sample cannot give one"
                    if planned < MIN_HUMAN_LABELS else "")
            lines.append(f"  {c.probed} {c.dataset} {c.perturbation} T={c.temperature:g}: "
                         f"{len(p.keys)} to label" + (f" (+{p.others} by others)" if p.others
                                                      else "") + (f"; {what}" if what else ""))
        return lines


class _Handler(BaseHTTPRequestHandler):
    server_version = "userturn-annotate"

    @property
    def app(self) -> AnnotationServer:
        return self.server.app  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        try:
            self._check_origin()
            self._route(method, urlsplit(self.path).path)
        except _Reject as exc:
            self._json(exc.status, {"error": str(exc)})
        except UserturnError as exc:  # a store fault: one line the page shows
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)})
        except Exception:  # noqa: BLE001 (a bug: no internals to the page; the server goes on)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})

    def _route(self, method: str, path: str) -> None:
        app = self.app
        if method == "GET" and path == "/":
            return self._page()
        if method == "GET" and path == "/favicon.ico":  # answered, so the browser logs no 404
            return self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        gets = {"/api/config": app.config, "/api/next": app.next, "/api/progress": app.progress}
        if method == "GET" and path in gets:
            return self._json(HTTPStatus.OK, gets[path]())
        if method == "POST" and path == "/api/label":
            return self._json(HTTPStatus.OK, app.label(self._body()))
        if method == "POST" and path == "/api/undo":
            self._body()  # the same JSON-only rule as every POST
            return self._json(HTTPStatus.OK, app.undo())
        raise _Reject(HTTPStatus.NOT_FOUND, f"no {method} {path}")

    def _check_origin(self) -> None:
        """Only our own origin: a web page elsewhere (DNS rebinding, cross-site POST) is refused."""
        host, origin = self.headers.get("Host"), self.headers.get("Origin")
        hosts = self.app.hosts
        if host not in hosts or (origin is not None and origin.removeprefix("http://") != host):
            raise _Reject(HTTPStatus.FORBIDDEN, "wrong host or origin")

    def _body(self) -> dict[str, Any]:
        # JSON only: a cross-site form cannot send it without a preflight we never allow.
        if self.headers.get_content_type() != "application/json":
            raise _Reject(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send application/json")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            raise _Reject(HTTPStatus.BAD_REQUEST, "Content-Length must be a byte count")
        if length > MAX_BODY:
            raise _Reject(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request too large")
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client hung up mid-body: apply nothing
            self.close_connection = True
            raise _Reject(HTTPStatus.BAD_REQUEST, "body cut short")
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise _Reject(HTTPStatus.BAD_REQUEST, "body is not JSON") from None
        if not isinstance(body, dict):
            raise _Reject(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        return body

    def _page(self) -> None:
        nonce = secrets.token_urlsafe(16)
        html = _template().replace("__NONCE__", nonce).encode()
        csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
               "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
               "frame-ancestors 'none'")
        self._send(HTTPStatus.OK, html, "text/html; charset=utf-8", {"Content-Security-Policy": csp})

    def _json(self, status: HTTPStatus, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": content_type, "Content-Length": str(len(body)),
                   "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                   "Referrer-Policy": "no-referrer", **(extra or {})}
        for name, value in headers.items():
            self.send_header(name, value)
        try:
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client hung up before the answer: nothing to tell it
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per click would bury the CLI's own output


def _template() -> str:
    """The page with the label keys written in: with seven labels, ``1–7`` in its hint and
    ``1234567`` in its key handler."""
    page = resources.files("userturn.labels").joinpath("annotate_page.html").read_text(
        encoding="utf-8")
    return (page.replace("__KEY_RANGE__", f"1–{LABEL_KEYS[-1]}" if len(LABEL_KEYS) > 1 else "1")
            .replace("__LABEL_KEYS__", LABEL_KEYS))


def serve(folder: Path | str, annotator: str, *, size: int | None = None,
          seed: int | None = None, port: int = 0, open_browser: bool = True,
          calibration: int | None = None,
          announce: Callable[[str], None] = lambda line: None) -> int:
    """Run the page until Ctrl+C (the ``userturn annotate`` command). ``announce`` is given the
    page's address and how to stop it once the server listens (the CLI prints it)."""
    server = AnnotationServer(folder, annotator, size, seed, port=port, calibration=calibration)
    announce("\n".join([f"annotating {len(server.keys)} user turns as {annotator}: {server.url}",
                        *server.plan_lines(),
                        "every label is saved as you make it; Ctrl+C stops the server"]))
    if open_browser:
        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):  # every label is stored already; the CLI says so
            raise
    finally:
        server.stop()
    return 0
