"""The executor seam: work units in, results out in completion order.

The pipeline plans what the store lacks, cuts it into work units of one (model, stage) and hands
them to an executor; it stores each result as it comes, in one transaction, and ignores keys it
already has. Where the generations are made is the executor's business:

- :class:`LocalExecutor`: in this process, one unit after the other, on the backends the pipeline
  loaded (the path userturn always had: units are the backend's ``chunk_size``).
- ``userturn.probe.ray_executor.RayExecutor``: Ray actors, each holding one backend (``executor: ray``).

An executor never opens the run store: only the driver writes it, so a killed driver, a dead
actor or a unit that ran twice never leaves half a unit or a duplicate behind.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Protocol, Sequence

from userturn.backends import Backend
from userturn.records import Generation, Request


@dataclass(frozen=True)
class WorkUnit:
    """Requests of one (model, stage), generated together. ``engine`` is the spec of the backend
    that generates them (a thinking variant's base model); ``lane`` the replica it prefers."""

    id: int
    engine: str
    keys: tuple[str, ...]
    requests: tuple[Request, ...]
    lane: int = 0


@dataclass(frozen=True)
class UnitResult:
    """One generation per request of ``unit``, in the unit's order (failures are data)."""

    unit: WorkUnit
    generations: tuple[Generation, ...]


class Executor(Protocol):
    # Units are cut to ``unit_size`` requests (None: the backend's own chunk_size), in ``lanes``
    # affinity lanes (replicas): the requests of one item share a lane in every stage, so a
    # replica finds the answer it wrote in its prefix cache when it writes the user turns.
    unit_size: int | None
    lanes: int

    def run(self, units: Iterable[WorkUnit]) -> Iterator[UnitResult]:
        """Generate every unit; yield each result as it completes (any order)."""
        ...


class LocalExecutor:
    """Units one after the other on in-process backends (keyed by spec), each result yielded
    before the next unit starts."""

    unit_size: int | None = None
    lanes = 1

    def __init__(self, backends: Mapping[str, Backend]) -> None:
        # By each backend's own spec (what a unit names), and by the names it was given.
        self.backends = {**{b.spec: b for b in backends.values()}, **backends}

    def run(self, units: Iterable[WorkUnit]) -> Iterator[UnitResult]:
        for unit in units:
            generations = self.backends[unit.engine].complete(list(unit.requests))
            yield UnitResult(unit, tuple(generations))


def cut_units(engine: str, work: Sequence[tuple[str, Request, str]], size: int,
              lanes: int = 1, first_id: int = 0) -> list[WorkUnit]:
    """Units of at most ``size`` (key, request, item) triples, longest prompts first within a
    lane (similar lengths batch with less padding; the order changes no result). An item's
    requests all go to one lane, chosen from the item alone, so every stage agrees on it."""
    by_lane: dict[int, list[tuple[str, Request, str]]] = {}
    for entry in work:
        by_lane.setdefault(lane_of(entry[2], lanes), []).append(entry)
    units: list[WorkUnit] = []
    for lane in sorted(by_lane):
        entries = sorted(by_lane[lane], key=lambda e: len(e[1].prompt), reverse=True)
        for start in range(0, len(entries), size):
            chunk = entries[start:start + size]
            units.append(WorkUnit(first_id + len(units), engine, tuple(e[0] for e in chunk),
                                  tuple(e[1] for e in chunk), lane))
    return units


def lane_of(item: str, lanes: int) -> int:
    if lanes <= 1:
        return 0
    return int.from_bytes(hashlib.sha256(item.encode()).digest()[:4], "big") % lanes
