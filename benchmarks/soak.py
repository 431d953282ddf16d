"""Soak: a long run under every fault at once, killed with SIGKILL at random moments, resumed until
it finishes; at the end nothing is lost, nothing is duplicated and the store passes `doctor`.

    PYTHONPATH=src python benchmarks/soak.py --kills 20 --items 40 --samples 4

Each attempt is a child process running the real pipeline (the real SQLite store, the run lock)
with the scripted fake backend, and judging every user turn with an LLM judge against the fake
OpenAI-compatible server on 127.0.0.1. Faults injected:

- backend errors (a generation comes back as an error, retried by the next attempt) and backend
  exceptions (``complete`` raises: the attempt crashes with a traceback);
- judge 429 storms (runs of 429s with Retry-After: 0) and hangs (the server says nothing past
  the client's timeout), and dropped connections;
- a full disk: SQLite's own SQLITE_FULL, by capping the database's page count a few pages above
  its size at a random moment of some attempts;
- SIGKILL of the attempt after a random delay, ``--kills`` times;
- SIGTERM while a fault-free attempt is judging (into a folder of its own): it must exit 143
  with every verdict it received stored, then resume to the same result.

Then attempts without faults run until one exits 0 with the run finished. The result is checked
against an uninterrupted, fault-free run of the same experiment: the same generation keys and
texts (zero lost, zero duplicated: a key is stored once or not at all), every user turn judged
once, and `userturn doctor` exits 0; the readers (doctor, report, export elsewhere) leave the run
folder byte for byte as it was, so they work on a full disk. Prints the figures; exit 1 if any
check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the fake OpenAI server lives with the tests


def experiment(folder: Path, dataset: Path, items: int, samples: int):  # type: ignore[no-untyped-def]
    from userturn.config import Experiment

    return Experiment(models=["fake/soak"], datasets=[str(dataset)], limit=items,
                      temperatures=[0.0, 1.0], samples=samples, output=folder, batch_size=4)


def script(request) -> str:  # type: ignore[no-untyped-def]
    """Deterministic per request: the same turn whichever attempt generates it."""
    import hashlib

    digest = hashlib.sha256(f"{request.prompt}|{request.seed}".encode()).hexdigest()[:8]
    if request.prompt.endswith("<|im_start|>user\n"):
        return f"Why is it {digest}?" if request.params.temperature else "Thanks!"
    return f"The answer is {int(digest, 16) % 100}. #### {int(digest, 16) % 100}"


def child(args: argparse.Namespace) -> int:
    """One attempt: run the experiment (faults on unless --clean), then judge every user turn."""
    from userturn.backends.fake import ScriptedBackend
    from userturn.cli.main import main
    from userturn.cli.signals import stop_on_sigterm
    from userturn.errors import Terminated
    from userturn.labels.judge import Judge, OpenAIChatClient
    from userturn.labels.stages import judge_turns
    from userturn.probe.pipeline import run_experiment
    from userturn.store.database import RunStore
    from userturn.store.lock import RunLock

    rng = random.Random(args.seed)
    log = open(args.log, "a", encoding="utf-8")
    stop_on_sigterm()  # as the CLI does

    def note(kind: str) -> None:
        log.write(kind + "\n")
        log.flush()

    if not args.clean and rng.random() < 0.3:  # this attempt meets a full disk
        # Every connection this process opens to the run's database gets the cap: the store
        # opens its connections through sqlite3.connect.
        connect = sqlite3.connect

        def small_disk(database, *args, **kwargs):  # type: ignore[no-untyped-def]
            db = connect(database, *args, **kwargs)
            if "userturn.db" in str(database):
                pages = db.execute("PRAGMA page_count").fetchone()[0]
                db.execute(f"PRAGMA max_page_count = {max(pages, 8) + rng.randint(2, 12)}")
                note("disk_full_armed")
            return db

        sqlite3.connect = small_disk  # type: ignore[assignment]

    class Faulty(ScriptedBackend):
        def complete(self, requests):  # type: ignore[no-untyped-def]
            time.sleep(0.01 * len(requests))  # slow enough for kills to land mid-chunk
            if not args.clean and rng.random() < 0.02:
                note("backend_exception")
                raise RuntimeError("injected backend exception")
            return super().complete(requests)

    def fail(request) -> bool:  # type: ignore[no-untyped-def]
        if not args.clean and rng.random() < 0.05:
            note("backend_error")
            return True
        return False

    exp = experiment(Path(args.child), Path(args.dataset), args.items, args.samples)
    backend = Faulty(script, spec="fake/soak", chunk_size=4, fail=fail)
    from userturn.errors import StoreError

    try:
        run_experiment(exp, backends={"fake/soak": backend}).close()
    except StoreError as exc:  # the full disk, as the CLI would print it: one line, exit 2
        note("disk_full_hit" if "disk is full" in str(exc) else "store_error")
        print(f"userturn: error: {exc}", file=sys.stderr)
        return 2
    client = OpenAIChatClient("soak-judge", base_url=args.judge_url, api_key="sk-soak-unused",
                              timeout=args.judge_timeout, max_attempts=3, backoff=0.01,
                              max_backoff=0.05)
    store = RunStore.open(exp.plan.output)
    try:
        with RunLock(exp.plan.output, "judge"):
            judge_turns(store, Judge(client, concurrency=4), "all")
    except Terminated:
        note(f"judge_received {store.tally.sent.get('judge', 0)}")
        return 143
    finally:
        store.close()
    return main(["doctor", str(exp.plan.output)])


def dataset_file(folder: Path, items: int) -> Path:
    path = folder / "soak.jsonl"
    rows = [{"question": f"Item {n}: what is {n} + {n * 7}?", "answer": f"#### {n * 8}"}
            for n in range(items)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def attempt(args: argparse.Namespace, folder: Path, dataset: Path, url: str, log: Path,
            seed: int, clean: bool) -> subprocess.Popen:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(folder),
               "--dataset", str(dataset), "--items", str(args.items), "--samples",
               str(args.samples), "--judge-url", url, "--log", str(log), "--seed", str(seed),
               "--judge-timeout", str(getattr(args, "judge_timeout", 0.5))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(log.with_suffix(".out"), "ab") as out:
        return subprocess.Popen(command + (["--clean"] if clean else []), stdout=out,
                                stderr=subprocess.STDOUT, env=env)


def _read_only(folder: Path) -> sqlite3.Connection:
    """The run's database for reading; never creates it (an empty file would not be a run)."""
    path = (folder / "userturn.db").resolve()
    return sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=5)


def _count(folder: Path) -> int:
    try:
        with _read_only(folder) as db:
            return db.execute("SELECT COUNT(*) FROM generations WHERE error IS NULL").fetchone()[0]
    except sqlite3.Error:
        return 0


def _work(folder: Path) -> int:
    """Generations and verdicts stored so far."""
    try:
        with _read_only(folder) as db:
            return db.execute("SELECT (SELECT COUNT(*) FROM generations WHERE error IS NULL) + "
                              "(SELECT COUNT(*) FROM labels WHERE error IS NULL AND source "
                              "LIKE 'judge:%')").fetchone()[0]
    except sqlite3.Error:
        return 0


def stored(folder: Path) -> tuple[dict[str, str], Counter]:
    with _read_only(folder) as db:
        rows = db.execute("SELECT key, text FROM generations WHERE error IS NULL").fetchall()
        labels = Counter(r[0] for r in db.execute(
            "SELECT source FROM labels WHERE error IS NULL AND source LIKE 'judge:%'"))
    return dict(rows), labels


def soak(kills: int = 20, items: int = 40, samples: int = 4, seed: int = 0,
         max_delay: float = 6.0, workdir: Path | None = None) -> dict[str, object]:
    """Run the soak; returns its figures (``ok`` says whether every check passed)."""
    from openai_fake import Answer, Drop, Fail, FakeOpenAI, Hang

    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="userturn-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    dataset, log = dataset_file(base, items), base / "faults.log"
    soaked, reference = base / "soaked", base / "reference"
    judge_faults: Counter = Counter()
    storm = {"left": 0}

    def respond(request):  # type: ignore[no-untyped-def]
        if storm["left"] == 0 and rng.random() < 0.03:
            storm["left"] = rng.randint(5, 30)  # a storm: a run of 429s
        if storm["left"] > 0:
            storm["left"] -= 1
            judge_faults["judge_429"] += 1
            return Fail(429, retry_after="0")
        roll = rng.random()
        if roll < 0.02:
            judge_faults["judge_hang"] += 1
            return Hang(1.0)  # past the client's 0.5 s timeout
        if roll < 0.03:
            judge_faults["judge_drop"] += 1
            return Drop()
        return Answer()

    started = time.monotonic()
    exits: Counter = Counter()
    at_kill: list[int] = []  # generations stored when each SIGKILL landed
    work_total = items * (2 + samples) + items * (1 + samples)  # generations + verdicts
    with FakeOpenAI() as fake:
        fake.responder = respond
        done, attempts = 0, 0
        while done < kills and attempts < 5 * kills + 20:  # a run that cannot resume stops here
            attempts += 1
            process = attempt(argparse.Namespace(items=items, samples=samples), soaked, dataset,
                              fake.url, log, rng.randrange(2 ** 31), clean=False)
            # A random point of the work (generations, then verdicts), not of the clock: kills
            # land in every stage, whatever the start-up time.
            now = _work(soaked)
            if now >= work_total:
                break  # all done before every kill landed: the figures say how many did
            # Spread the kills over what is left, so each lands before the end.
            target = now + rng.randint(1, max(1, (work_total - now) // (kills - done + 1)))
            deadline = time.monotonic() + max_delay + 30
            while process.poll() is None and _work(soaked) < target \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            if process.poll() is not None:
                code = process.returncode
                exits["exit 0" if code == 0 else f"exit {code}"] += 1
                continue
            time.sleep(rng.uniform(0, 0.05))  # and anywhere within a chunk
            process.send_signal(signal.SIGKILL)
            process.wait()
            done += 1
            exits["SIGKILL"] += 1
            at_kill.append(_count(soaked))
        fake.responder = lambda request: Answer()
        for _ in range(10):  # no faults: resume until the run finishes and doctor passes
            attempts += 1
            process = attempt(argparse.Namespace(items=items, samples=samples), soaked, dataset,
                              fake.url, log, 0, clean=True)
            code = process.wait(timeout=600)
            if code == 0:
                break
        final_exit = code
        sigterm = _sigterm_while_judging(fake, base, dataset, items, samples)
        reference_run = attempt(argparse.Namespace(items=items, samples=samples), reference,
                                dataset, fake.url, base / "reference.log", 0, clean=True)
        reference_exit = reference_run.wait(timeout=600)
    faults = Counter(line.strip() for line in log.read_text().splitlines() if line.strip())
    faults.update(judge_faults)
    got, got_labels = stored(soaked)
    want, want_labels = stored(reference)
    lost = len(set(want) - set(got))
    extra = len(set(got) - set(want))
    changed = sum(1 for key in set(want) & set(got) if want[key] != got[key])
    from userturn.cli.main import main

    before = _snapshot(soaked)
    doctor = main(["doctor", str(soaked)])
    readers = [main(["report", str(soaked)]),
               main(["export", str(soaked), "--out", str(base / "turns.csv"), "--format", "csv"])]
    reader_writes = before != _snapshot(soaked)
    terminated, _ = stored(base / "terminated")
    figures = {
        "kills": exits["SIGKILL"], "kills_while_generating": sum(
            n < len(want) for n in at_kill), "generations_at_kills": at_kill,
        "attempts": attempts, "exits": dict(exits),
        "faults": dict(faults), "generations": len(got), "expected": len(want),
        "lost": lost, "duplicated_or_extra": extra, "changed": changed,
        "judged": sum(got_labels.values()), "judged_expected": sum(want_labels.values()),
        "final_exit": final_exit, "reference_exit": reference_exit, "doctor_exit": doctor,
        "reader_exits": readers, "readers_wrote_into_the_run": reader_writes, **sigterm,
        "seconds": round(time.monotonic() - started, 1), "folder": str(soaked),
    }
    figures["ok"] = (final_exit == 0 and reference_exit == 0 and doctor == 0 and lost == 0
                     and extra == 0 and changed == 0 and got_labels == want_labels
                     and len(want) > 0 and readers == [0, 0] and not reader_writes
                     and sigterm["sigterm_exit"] == 143 and sigterm["sigterm_verdicts_lost"] == 0
                     and sigterm["sigterm_verdicts_received"] > 0
                     and sigterm["sigterm_resume_exit"] == 0 and terminated == want)
    return figures


def _sigterm_while_judging(fake, base: Path, dataset: Path, items: int,  # type: ignore[no-untyped-def]
                           samples: int) -> dict[str, int]:
    """A fault-free attempt, SIGTERMed once it has stored some verdicts: the judge answers the
    first two at once and holds the rest, so the signal lands mid-way on any machine (a uniform
    delay let a fast one store every verdict before the signal). It exits 143 having stored every
    verdict it received; then it resumes."""
    import itertools

    from openai_fake import Answer

    folder, log = base / "terminated", base / "terminated.log"
    asked = itertools.count()
    fake.responder = lambda request: Answer(delay=0.0 if next(asked) < 2 else 3.0)
    args = argparse.Namespace(items=items, samples=samples, judge_timeout=30.0)
    process = attempt(args, folder, dataset, fake.url, log, 0, clean=True)
    deadline = time.monotonic() + 300
    while process.poll() is None and _verdicts(folder) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=120)
    received = sum(int(line.split()[1]) for line in log.read_text().splitlines()
                   if line.startswith("judge_received"))
    kept = _verdicts(folder)
    fake.responder = lambda request: Answer()
    resumed = attempt(args, folder, dataset, fake.url, log, 0, clean=True).wait(timeout=600)
    return {"sigterm_exit": code, "sigterm_verdicts_received": received,
            "sigterm_verdicts_lost": received - kept, "sigterm_resume_exit": resumed}


def _verdicts(folder: Path) -> int:
    try:
        with _read_only(folder) as db:
            return db.execute("SELECT COUNT(*) FROM labels WHERE source LIKE 'judge:%'"
                              ).fetchone()[0]
    except sqlite3.Error:
        return 0


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=6.0,
                        help="an attempt that makes no progress is killed after this plus 30 s")
    parser.add_argument("--workdir", type=Path)
    # the child attempt (internal)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--judge-url", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    parser.add_argument("--judge-timeout", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--clean", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    figures = soak(args.kills, args.items, args.samples, args.seed, args.max_delay, args.workdir)
    print(json.dumps(figures, indent=2))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
