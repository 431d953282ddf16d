"""Where a run's time goes: wall seconds, work done and tokens generated, stage by stage.

Each stage is timed around its call; what it did is read from the store's tally of requests
(counted as they are stored, so generations read back on a resumed run cost nothing and count
nothing). The stages are written to the run's metadata as each ends, so a run stopped halfway
keeps the times of the stages it finished; a run resumed (or re-run when finished) adds to the
times the earlier runs of the folder measured, never replaces them.

A backend may load its weights on first use (``load_seconds``: the seconds it has spent loading
so far): that time is taken out of the stage it happened in and counted as ``model load``.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from userturn.store.database import RunStore
from userturn.store.meta import StageTime


class StageClock:
    def __init__(self, store: RunStore, clock: Callable[[], float] = time.perf_counter,
                 loading: Callable[[], float] = lambda: 0.0) -> None:
        """``loading``: the seconds the run's backends have spent loading weights so far."""
        self.store, self.clock, self.loading = store, clock, loading
        self.stages: list[StageTime] = list(store.meta().stages)  # what earlier runs measured

    def add(self, stage: StageTime) -> None:
        """Record a stage; a stage that runs again (one per dataset) adds to its entry."""
        for index, known in enumerate(self.stages):
            if known.stage == stage.stage:
                tokens = (None if known.tokens is None and stage.tokens is None
                          else (known.tokens or 0) + (stage.tokens or 0))
                self.stages[index] = StageTime(stage=stage.stage,
                                               seconds=known.seconds + stage.seconds,
                                               count=known.count + stage.count,
                                               unit=stage.unit or known.unit, tokens=tokens)
                break
        else:
            self.stages.append(stage)
        self.store.update_meta(stages=self.stages)

    @contextmanager
    def generating(self, stage: str) -> Iterator[None]:
        """Times a generation stage: the generations it stored and their tokens."""
        tally = self.store.tally
        sent, tokens = tally.sent.get("generation", 0), tally.tokens.get("generation", 0)
        start, loaded = self.clock(), self.loading()
        yield
        loading = self.loading() - loaded
        if loading > 0:
            self.add(StageTime(stage="model load", seconds=loading, count=0, unit="models"))
        self.add(StageTime(stage=stage, seconds=self.clock() - start - loading,
                           count=tally.sent.get("generation", 0) - sent, unit="generations",
                           tokens=tally.tokens.get("generation", 0) - tokens))

    def timed(self, stage: str, unit: str, work: Callable[[], int]) -> int:
        """Runs ``work`` (which returns how many ``unit`` it did) as a stage; returns that."""
        start = self.clock()
        done = work()
        self.add(StageTime(stage=stage, seconds=self.clock() - start, count=done, unit=unit))
        return done
