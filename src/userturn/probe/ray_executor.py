"""``executor: ray``: work units on Ray Core actors, each holding one backend.

Every replica of a model is an actor that builds its backend once, from a
:class:`~userturn.backends.BackendSpec` (plain values), and then completes the units it is sent.
The driver (the ``userturn run`` process) keeps two units in flight per actor (one running, the
next already queued on it, so the actor never waits on the driver), receives the results in
completion order and writes them; actors never open the run store.

Failures are routine, each handled by the driver:

- an actor that dies (OOM, a lost node, a dead engine) is restarted by Ray (``max_restarts``);
  its running unit is requeued and counted, the unit queued behind it requeued uncounted; the
  restarted actor gets work again once it has rebuilt its backend and reports the same model;
- a unit that runs past ``unit_timeout`` is cancelled and requeued, counted: a running task of a
  (synchronous) actor cannot be interrupted, so the actor is killed and restarted;
- a unit counted more than ``unit_retries`` times is given up: its requests are stored as
  errors, which the next run retries, and the run goes on;
- an actor out of restarts, or not back within ``unit_timeout``, leaves the pool; a model with
  no replica left has its remaining requests stored as errors.

Ray is imported here only: the local executor never imports it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from userturn.backends import BackendSpec
from userturn.backends.options import can_score_prompts, engine_end_texts
from userturn.chat.render import ChatTemplate
from userturn.errors import ConfigError, ModelError
from userturn.probe.engine import EngineSpec
from userturn.probe.executor import UnitResult, WorkUnit
from userturn.records import Generation, Request

IN_FLIGHT = 2  # units per actor: one running, one queued behind it
PROBES = 10  # failed probes in a row before a restarting actor counts as gone


@dataclass(frozen=True)
class Described:
    """What a replica reports of its backend: what the driver's keys, prompts and arms need."""

    spec: str
    revision: str
    template: ChatTemplate
    chunk_size: int
    end_texts: tuple[str, ...]  # every end of generation (the continuation arm's stops)
    scores_prompts: bool  # whether it has score_options (next-role probabilities, local judges)


class BackendActor:
    """One replica: a backend built once from its spec (the Ray actor's class)."""

    def __init__(self, spec: BackendSpec) -> None:
        self.backend = spec.build()

    def describe(self) -> Described:
        b = self.backend
        return Described(b.spec, b.revision, b.template, b.chunk_size,
                         engine_end_texts(b), can_score_prompts(b))

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        return self.backend.complete(requests)

    def score_options(self, prompt: str, options: Sequence[str], whole: bool) -> list[float]:
        scorer: Any = self.backend  # described with scores_prompts: it has score_options
        return list(scorer.score_options(prompt, options, whole=whole))


class RemoteBackend:
    """The driver's view of a model whose replicas are actors: what keys and prompts need (spec,
    revision, template, end texts), as the replicas reported them; ``complete`` runs one unit on
    them."""

    def __init__(self, executor: RayExecutor, described: Described) -> None:
        self.executor, self.spec, self.revision = executor, described.spec, described.revision
        self.template, self.chunk_size = described.template, described.chunk_size
        self.end_texts = described.end_texts

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        unit = WorkUnit(-1, self.spec, ("",) * len(requests), tuple(requests))
        return [g for result in self.executor.run([unit]) for g in result.generations]


class RemoteScoringBackend(RemoteBackend):
    """A model whose replicas score a prompt's continuations (``score_options``): one replica
    scores each prompt, as the engine in process would."""

    def score_options(self, prompt: str, options: Sequence[str], *,
                      whole: bool = False) -> list[float]:
        return self.executor.score_options(self.spec, prompt, options, whole)


def remote_backend(executor: RayExecutor, described: Described) -> RemoteBackend:
    kind = RemoteScoringBackend if described.scores_prompts else RemoteBackend
    return kind(executor, described)


@dataclass
class _Task:
    unit: WorkUnit
    attempts: int = 0
    reasons: list[str] = field(default_factory=list)


@dataclass
class _Replica:
    engine: str
    lane: int
    handle: Any
    deaths: int = 0
    probe_failures: int = 0
    state: str = "alive"  # alive | restarting | dead
    running: deque = field(default_factory=deque)  # (ref, task), in the order they run
    head_started: float = 0.0
    lost_at: float = 0.0


class RayExecutor:
    """Units on ``replicas`` actors per model. Use :meth:`start` (connects to or starts a
    cluster) or the constructor (Ray already initialized); close it (or use ``with``)."""

    def __init__(self, specs: Sequence[BackendSpec], *, replicas: int = 1,
                 gpus_per_replica: float = 0.0, unit_size: int = 256,
                 unit_timeout: float = 1800.0, unit_retries: int = 2, max_restarts: int = 3,
                 owns_cluster: bool = False) -> None:
        import ray

        self.unit_size: int | None = unit_size
        self.lanes = replicas
        self.unit_timeout, self.unit_retries = unit_timeout, unit_retries
        self.max_restarts, self._owns_cluster = max_restarts, owns_cluster
        self.restarts = 0  # actor deaths seen (kills after a timeout included), for reports
        actor = ray.remote(BackendActor).options(  # type: ignore[attr-defined]
            num_cpus=1, num_gpus=gpus_per_replica, max_restarts=max_restarts,
            max_task_retries=0)
        self.replicas = [_Replica(spec.spec, lane, actor.remote(spec))
                         for spec in specs for lane in range(replicas)]
        self._probes: dict[Any, _Replica] = {}
        try:
            self.backends = self._describe(specs)
        except BaseException:
            self.close()
            raise

    @classmethod
    def start(cls, specs: Sequence[BackendSpec], engine: EngineSpec) -> RayExecutor:
        try:
            import ray
        except ImportError:
            raise ConfigError("executor ray needs Ray: pip install 'userturn[ray]'") from None
        owns = not ray.is_initialized()
        if owns:
            ray.init(address=engine.ray_address, include_dashboard=False,
                     log_to_driver=False)
        try:
            return cls(specs, replicas=engine.replicas, gpus_per_replica=engine.gpus_per_replica,
                       unit_size=engine.unit_size, unit_timeout=engine.unit_timeout,
                       unit_retries=engine.unit_retries, max_restarts=engine.max_restarts,
                       owns_cluster=owns)
        except BaseException:
            if owns:
                ray.shutdown()
            raise

    def _describe(self, specs: Sequence[BackendSpec]) -> dict[str, RemoteBackend]:
        """Every replica's model, as it reports it; replicas of one model must agree (the same
        files on every node), or their generations would be keyed as one model's."""
        import ray

        backends: dict[str, RemoteBackend] = {}
        for replica in self.replicas:
            try:
                described = ray.get(replica.handle.describe.remote())
            except ray.exceptions.RayError as exc:
                raise ModelError(f"a replica of {replica.engine} could not build its backend: "
                                 f"{_last_line(exc)}") from None
            known = backends.get(replica.engine)
            if known is None:
                backends[replica.engine] = remote_backend(self, described)
            elif (known.revision, known.template.hash) != (described.revision,
                                                           described.template.hash):
                raise ModelError(f"the replicas of {replica.engine} hold different models "
                                 f"({known.revision} and {described.revision}): give every "
                                 "node the same model files")
        return backends

    def score_options(self, engine: str, prompt: str, options: Sequence[str],
                      whole: bool) -> list[float]:
        """``score_options`` on a live replica of ``engine`` (the first that answers)."""
        import ray

        failures = []
        for replica in (r for r in self.replicas if r.engine == engine and r.state == "alive"):
            try:
                return list(ray.get(replica.handle.score_options.remote(prompt, options, whole),
                                    timeout=self.unit_timeout))
            except (ray.exceptions.RayError, TimeoutError) as exc:
                failures.append(_last_line(exc))
        raise ModelError(f"no replica of {engine} could score a prompt"
                         + (f": {failures[-1]}" if failures else ": none is alive"))

    # -- the one method --------------------------------------------------------------------
    def run(self, units: Iterable[WorkUnit]) -> Iterator[UnitResult]:
        import ray

        waiting = deque(_Task(unit) for unit in units)
        while waiting or any(r.running for r in self.replicas):
            yield from self._give_up_orphans(waiting)
            self._dispatch(waiting)
            flights = {ref: replica for replica in self.replicas for ref, _ in replica.running}
            refs = [*flights, *self._probes]
            if not refs:
                continue
            ready, _ = ray.wait(refs, num_returns=1, timeout=self._wait_time())
            for ref in ready:
                if ref in self._probes:
                    self._restarted(ref)
                elif any(r == ref for r, _ in flights[ref].running):  # not lost meanwhile
                    yield from self._finished(ref, flights[ref], waiting)
            yield from self._time_out(waiting)

    def _dispatch(self, waiting: deque[_Task]) -> None:
        now = time.monotonic()
        for replica in self.replicas:
            while replica.state == "alive" and len(replica.running) < IN_FLIGHT:
                task = _pick(waiting, replica)
                if task is None:
                    break
                ref = replica.handle.complete.remote(list(task.unit.requests))
                if not replica.running:
                    replica.head_started = now
                replica.running.append((ref, task))

    def _finished(self, ref: Any, replica: _Replica, waiting: deque[_Task]
                  ) -> Iterator[UnitResult]:
        import ray

        task = next(t for r, t in replica.running if r == ref)
        try:
            generations = ray.get(ref)
        except ray.exceptions.RayActorError:
            yield from self._lost(replica, waiting, "its replica died")
            return
        except ray.exceptions.RayError as exc:  # the backend raised: the actor lives on
            replica.running = deque((r, t) for r, t in replica.running if r != ref)
            yield from self._failed(task, waiting, _last_line(exc))
            return
        replica.running = deque((r, t) for r, t in replica.running if r != ref)
        replica.head_started = time.monotonic()
        if len(generations) != len(task.unit.requests):
            yield from self._failed(task, waiting, f"{len(generations)} generations came back "
                                    f"for {len(task.unit.requests)} requests")
            return
        yield UnitResult(task.unit, tuple(generations))

    def _time_out(self, waiting: deque[_Task]) -> Iterator[UnitResult]:
        import ray

        now = time.monotonic()
        for replica in self.replicas:
            if replica.state == "restarting" and now - replica.lost_at > self.unit_timeout:
                replica.state = "dead"  # not back within a unit's budget (a lost node)
                self._probes = {ref: r for ref, r in self._probes.items() if r is not replica}
            if replica.running and now - replica.head_started > self.unit_timeout:
                ray.kill(replica.handle, no_restart=False)
                yield from self._lost(replica, waiting,
                                      f"it ran past its time budget ({self.unit_timeout:g} s)")

    def _lost(self, replica: _Replica, waiting: deque[_Task], reason: str
              ) -> Iterator[UnitResult]:
        """The actor died (or was killed): the unit it was running is counted and requeued, the
        ones queued behind it requeued as they were; the actor is probed until it is back."""

        running, replica.running = list(replica.running), deque()
        for _, task in reversed(running[1:]):
            waiting.appendleft(task)
        self.restarts += 1
        replica.deaths += 1
        replica.lost_at = time.monotonic()
        if replica.deaths > self.max_restarts:
            replica.state = "dead"
        else:
            replica.state = "restarting"
            self._probes[replica.handle.describe.remote()] = replica
        if running:
            yield from self._failed(running[0][1], waiting, reason)

    def _restarted(self, ref: Any) -> None:
        import ray

        replica = self._probes.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            # A probe sent in the moment of the death can fail before Ray restarts the actor
            # (while it restarts, a probe waits); failing again and again, it cannot come back.
            replica.probe_failures += 1
            if replica.probe_failures > PROBES:
                replica.state = "dead"
            else:
                time.sleep(0.5)
                self._probes[replica.handle.describe.remote()] = replica
            return
        replica.state, replica.head_started = "alive", time.monotonic()
        replica.probe_failures = 0

    def _failed(self, task: _Task, waiting: deque[_Task], reason: str) -> Iterator[UnitResult]:
        task.attempts += 1
        task.reasons.append(reason)
        if task.attempts <= self.unit_retries:
            waiting.appendleft(task)
            return
        yield _errors(task.unit, f"gave up on the unit after {task.attempts} failed attempts "
                      f"(last: {reason}); re-run to retry")

    def _give_up_orphans(self, waiting: deque[_Task]) -> Iterator[UnitResult]:
        """Units of a model whose every replica is dead can never run: stored as errors."""
        live = {r.engine for r in self.replicas if r.state != "dead"}
        orphans = [t for t in waiting if t.unit.engine not in live]
        for task in orphans:
            waiting.remove(task)
            yield _errors(task.unit, f"no replica of {task.unit.engine} is left (each died more "
                          f"than max_restarts={self.max_restarts} times); re-run to retry")

    def _wait_time(self) -> float:
        heads = [r.head_started for r in self.replicas if r.running]
        if not heads:
            return 1.0
        return max(0.05, min(1.0, min(heads) + self.unit_timeout - time.monotonic()))

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        import ray

        for replica in self.replicas:
            ray.kill(replica.handle, no_restart=True)
        self.replicas = []
        if self._owns_cluster:
            ray.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pick(waiting: deque[_Task], replica: _Replica) -> _Task | None:
    """The first waiting unit of the replica's model and lane, else of its model (a replica
    whose lane ran dry helps the others)."""
    fallback = None
    for task in waiting:
        if task.unit.engine == replica.engine:
            if task.unit.lane == replica.lane:
                waiting.remove(task)
                return task
            fallback = fallback or task
    if fallback is not None:
        waiting.remove(fallback)
    return fallback


def _errors(unit: WorkUnit, message: str) -> UnitResult:
    return UnitResult(unit, tuple(Generation("", "", "error", 0, 0, message)
                                  for _ in unit.requests))


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__

