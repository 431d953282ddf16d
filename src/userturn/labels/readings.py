"""Readings of turns in context, kept: caches that runs and training resume from, and the
corpus's readings shipped beside it.

A reading costs a few forward passes of the embedded SmolLM2 (:mod:`.context`), so every reading
is kept where it will be wanted again: a JSON Lines cache appended as readings come (a killed
training resumes from it), and ``corpus_readings.npz`` in the package, every turn of the shipped
corpus read once, so that labelling or fitting a corpus turn never runs the model. Readings are
keyed by :func:`.context.turn_key`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from userturn.labels.context import ContextReading, ContextScorer, turn_key
from userturn.records import Case, Progress, silent_progress
from userturn.settings import parse_json

# The corpus's turns read in context by the embedded scorer, so that `userturn train-classifier
# --with-corpus` does not spend an hour re-reading them, and a corpus turn is labelled at once.
CORPUS_READINGS = Path(__file__).with_name("corpus_readings.npz")


def reading_of(row: dict[str, Any]) -> ContextReading:
    return ContextReading(np.asarray(row["features"], dtype=np.float32),
                          np.asarray(row["embedding"], dtype=np.float32))


def reading_row(key: str, scorer: str, reading: ContextReading) -> dict[str, Any]:
    """One line of a readings cache (JSON): rounded, since the cache is for fitting, not checks."""
    return {"key": key, "scorer": scorer,
            "features": [round(float(v), 5) for v in reading.features],
            "embedding": [round(float(v), 4) for v in reading.embedding]}


def load_readings(paths: Iterable[Path]) -> tuple[dict[str, ContextReading], set[str]]:
    """Every cached reading by turn key, and the scorers that made them. A torn last line (a
    killed writer) is skipped."""
    readings: dict[str, ContextReading] = {}
    scorers: set[str] = set()
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                row = parse_json(line)
                readings[row["key"]] = reading_of(row)
            except (KeyError, TypeError, ValueError):  # ValueError: not JSON, or too deep
                continue
            scorers.add(str(row.get("scorer", "")))
    return readings, scorers


def read_cases(cases: Sequence[Case], cache: Path | None = None, known: dict[str, ContextReading]
               | None = None, description: str = "reading turns in context",
               progress: Progress | None = None) -> list[ContextReading]:
    """Every case's reading: from ``known`` (by turn key) where it is there, else scored now
    (counted on ``progress``: the caller's bars, so a command shows one kind) and appended to
    ``cache`` (JSON Lines) as it comes, so a killed run loses at most the turns in flight (one
    batch) and the next one starts where it stopped."""
    known = dict(known or {})
    if cache is not None and cache.exists():
        known.update(load_readings([cache])[0])
    keys = [turn_key(c.query, c.answer, c.user_turn) for c in cases]
    # The turns after one answer side by side: the scorer reads them together.
    missing = sorted((i for i, key in enumerate(keys) if key not in known),
                     key=lambda i: (cases[i].query, cases[i].answer))
    if missing:
        scorer = ContextScorer()
        sink = open(cache, "a", encoding="utf-8") if cache is not None else None
        if sink is not None and sink.tell() and not _ends_a_line(cache):  # type: ignore[arg-type]
            sink.write("\n")  # a killed writer's torn last line stays alone on its line
        advance = (progress or silent_progress)(description, len(missing))
        try:
            for start in range(0, len(missing), scorer.batch_size):
                chunk = missing[start:start + scorer.batch_size]
                for index, reading in zip(chunk, scorer.read_many([cases[i] for i in chunk])):
                    known[keys[index]] = reading
                    if sink is not None:
                        sink.write(json.dumps(reading_row(keys[index], scorer.name, reading))
                                   + "\n")
                if sink is not None:
                    sink.flush()
                advance(len(chunk))
        finally:
            if sink is not None:
                sink.close()
    return [known[key] for key in keys]


def _ends_a_line(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, 2)
        return handle.read(1) == b"\n"


def corpus_readings(path: Path = CORPUS_READINGS) -> tuple[dict[str, ContextReading], str]:
    """The shipped readings of the corpus's turns by turn key, and the scorer that made them
    (nothing where the file is absent: they are then computed)."""
    if not path.is_file():
        return {}, ""
    with np.load(path, allow_pickle=False) as data:
        keys, features, embedding = data["keys"], data["features"], data["embedding"]
        scorer = str(data["scorer"])
    return ({str(key): ContextReading(features[i].astype(np.float32),
                                      embedding[i].astype(np.float32))
             for i, key in enumerate(keys)}, scorer)


def shipped_and_cached(caches: Iterable[Path]) -> tuple[dict[str, ContextReading], set[str]]:
    """The shipped corpus's readings with every reading of ``caches`` over them, and the scorers
    that made them (a corpus being built is read only where the shipped one lacks a turn)."""
    shipped, scorer = corpus_readings()
    cached, scorers = load_readings(caches)
    return {**shipped, **cached}, ({scorer} if shipped else set()) | scorers


def save_corpus_readings(readings: dict[str, ContextReading], scorer: str, path: Path,
                         embedding: int) -> None:
    """Write ``readings`` (their first ``embedding`` hidden dimensions, in float16)."""
    from userturn.store.atomic import write_file

    keys = sorted(readings)

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as handle:
            np.savez_compressed(
                handle, keys=np.array(keys), scorer=np.array(scorer),
                features=np.stack([readings[k].features for k in keys]).astype(np.float32),
                embedding=np.stack([readings[k].embedding[:embedding] for k in keys]
                                   ).astype(np.float16))

    write_file(path, write)
