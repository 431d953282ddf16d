"""The probe as one straight line.

    load items -> render assistant prompt -> generate a (greedy) -> score task accuracy on a
    -> render OPEN USER TURN after [q, a] -> generate user turns (greedy and sampled)
    -> classify (rules) -> statistics

Every stage writes to the run store before the next one reads it, so a killed run resumes where it
stopped and a finished run re-run makes no model calls.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
import warnings
from dataclasses import replace
from typing import Any, Callable, Mapping, Protocol, Sequence

from userturn.backends import Backend, BackendSpec
from userturn.chat.render import (
    Prompt,
    render_assistant_turn,
    render_user_turn,
    with_placeholder_answer,
)
from userturn.data import Dataset, load_dataset
from userturn.errors import ConfigError, TemplateError
from userturn.labels.judge import Judge
from userturn.labels.plan import LabellingPlan
from userturn.labels.stages import judge_with_all, label_offline, record_sources
from userturn.probe.engine import EngineSpec
from userturn.probe.executor import Executor, LocalExecutor
from userturn.probe.generation import Job, generate_jobs
from userturn.probe.plan import ProbePlan
from userturn.probe.thinking_variants import thinking_variants
from userturn.probe.timing import StageClock
from userturn.probe.user_stage import ARM_TABLE, conversation, replan, user_stage
from userturn.probe.user_variants import (
    answers_as,
    expand_user_variants,
    probed,
    user_prompt_of,
    variant_meta,
)
from userturn.records import (
    HUMAN,
    Generation,
    GenerationParams,
    Item,
    Message,
    Progress,
    Request,
    silent_progress,
)
from userturn.store.database import RunStore
from userturn.store.lock import RunLock
from userturn.store.meta import RunMeta, StageTime
from userturn.store.rows import ContextRow, GenerationRow, Probed, ScoreRow
from userturn.store.sqlite import DB_NAME, generation_key
from userturn.store.turns import read_labels, with_labels
from userturn.store.view import StoredRun, read_stored_run
from userturn.version import __version__


class RunSpec(Protocol):
    """What a run is given (``userturn.config.Experiment``): each stage's own spec, and the whole
    experiment as the run stores it."""

    @property
    def plan(self) -> ProbePlan: ...

    @property
    def engine(self) -> EngineSpec: ...

    @property
    def labelling(self) -> LabellingPlan: ...

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


def run_experiment(exp: RunSpec, *, backends: Mapping[str, Backend] | None = None,
                   progress: Progress | None = None,
                   datasets: Sequence[Dataset] | None = None,
                   executor: Executor | None = None,
                   judge_sleep: Callable[[float], None] | None = None) -> RunStore:
    """Run (or resume) an experiment into its plan's ``output`` and return its open store.

    ``datasets`` replaces loading the plan's datasets (training draws its items from a split).
    ``executor`` with ``backends`` (its handles) replaces the executor the engine names.
    ``judge_sleep`` is how the judge's API client waits between retries."""
    return run_and_read(exp, backends=backends, progress=progress, datasets=datasets,
                        executor=executor, judge_sleep=judge_sleep)[0]


def run_and_read(exp: RunSpec, *, backends: Mapping[str, Backend] | None = None,
                 progress: Progress | None = None,
                 datasets: Sequence[Dataset] | None = None,
                 executor: Executor | None = None,
                 judge_sleep: Callable[[float], None] | None = None
                 ) -> tuple[RunStore, StoredRun]:
    """:func:`run_experiment`, with the run as its labelling stages read it, their labels read
    again (the turns are read once, for labelling; a report of the run made from this reads
    nothing more but where it stands, which changes when the folder's lock is let go)."""
    progress = progress or silent_progress
    plan, engine = exp.plan, exp.engine
    if (plan.output / DB_NAME).exists():  # not a whole store: refused before the lock is made
        RunStore.check(plan.output)
    # The folder first: a second run into a busy folder is refused before any dataset or model
    # loads (which takes seconds to minutes), not after.
    with RunLock(plan.output, "run"):
        if datasets is None:
            datasets = [load_dataset(spec, limit=plan.limit, seed=plan.seed, fields=plan.fields,
                                     skip_invalid=plan.skip_invalid,
                                     context_turns=plan.context_turns)
                        for spec in plan.datasets]
        if executor is not None:
            return _run(exp, dict(backends or {}), executor, progress, datasets, judge_sleep)
        if backends is None and engine.executor == "ray":
            from userturn.probe.ray_executor import RayExecutor

            with RayExecutor.start(backend_specs(plan, engine), engine) as ray_executor:
                return _run(exp, ray_executor.backends, ray_executor, progress, datasets,
                            judge_sleep)
        loading = 0.0
        if backends is None:
            start = time.perf_counter()
            backends = {spec.spec: spec.build() for spec in backend_specs(plan, engine)}
            loading = time.perf_counter() - start
        return _run(exp, backends, LocalExecutor(backends), progress, datasets, judge_sleep,
                    loading)


def backend_specs(plan: ProbePlan, engine: EngineSpec) -> list[BackendSpec]:
    """What every model of the plan is built from (each once: a prober and an answerer share
    one)."""
    return engine.backend_specs([*plan.models, *_answer_models(plan, plan.models)])


def _run(exp: RunSpec, backends: Mapping[str, Backend], executor: Executor,
         progress: Progress, datasets: Sequence[Dataset],
         judge_sleep: Callable[[float], None] | None, loading: float = 0.0
         ) -> tuple[RunStore, StoredRun]:
    """``loading``: the seconds it took to load the models here (0: loaded elsewhere)."""
    plan, labelling = exp.plan, exp.labelling
    engines = list(backends.values())  # the loaded engines (the variants below wrap them)
    for backend in backends.values():  # misuse fails here, before the store is written
        _check_renders(backend, datasets[0].items[0], plan)
    first = conversation(datasets[0].items[0], plan)
    backends, probers = thinking_variants(backends, first, plan)
    backends, probers = expand_user_variants(
        backends, probers, plan.user_turn_variants, with_placeholder_answer(first))
    answer_models = _answer_models(plan, [answers_as(backends[spec]) for spec in probers])
    for spec in probers:  # an engine an arm cannot use is refused before anything is written
        for arm in plan.arms:
            if ARM_TABLE[arm].runs_on(backends[spec]):
                ARM_TABLE[arm].check(backends[spec])
    judges = labelling.build_judges(judge_sleep)
    # A labeller this machine cannot run (a classifier without its scorer) fails before
    # generating.
    labelling.offline.build(labelling.classifier)
    for dataset in datasets:
        for note in dataset.notes:  # a truncation, a skip count: said once, kept in the meta
            warnings.warn(note, stacklevel=2)
    store = RunStore.create(plan.output)  # the caller holds the folder's RunLock
    replaced = _replaced_settings(store.meta(), exp)
    if replaced:
        warnings.warn(f"{plan.output} held another experiment ({replaced}): its plan is replaced "
                      "by this one, so reports show this one; everything it generated stays "
                      "stored, and running it again here shows it again with no model calls "
                      "(give another --output to keep both)", stacklevel=2)
    store.update_meta(config=exp.model_dump(mode="json"), versions=versions(),
                      started=time.time(), finished=None,
                      models=_model_meta(backends, first),
                      skipped={d.name: d.skipped for d in datasets if d.skipped},
                      dataset_notes={d.name: list(d.notes) for d in datasets if d.notes})
    clock = StageClock(store, loading=lambda: sum(
        getattr(engine, "load_seconds", 0.0) for engine in engines))
    if loading:
        clock.add(StageTime(stage="model load", seconds=loading, count=len(backends),
                            unit="models"))
    run = _run_stages(store, plan, labelling, datasets, backends, probers, answer_models,
                      judges, executor, progress, clock)
    store.check_present()
    store.update_meta(finished=time.time())
    return store, replace(run, meta=store.meta())


# What a run plans (and so what its report shows) besides the output folder: the plan's
# settings and the two engine settings that change the prompts. The others say how it runs
# (batch sizes, executors, servers) or how it is labelled.
PROMPT_SETTINGS = ("tokenizer", "prompt_as")


def _replaced_settings(stored: RunMeta, exp: RunSpec) -> str:
    """What differs between the folder's experiment and this one ("" when it is the same one,
    or the folder is new), as "limit 6 -> 3; temperatures [0.0, 1.0] -> [0.0]"."""
    if not stored.config:
        return ""
    try:
        before = [(stored.stored(ProbePlan), exp.plan), (stored.stored(EngineSpec), exp.engine)]
    except ConfigError:
        return "an experiment this version does not read"
    changes = []
    for (old, new), names in zip(before, ([n for n in ProbePlan.model_fields if n != "output"],
                                          PROMPT_SETTINGS)):
        shown_old, shown_new = old.model_dump(mode="json"), new.model_dump(mode="json")
        changes += [f"{name} {_shown(shown_old[name])} -> {_shown(shown_new[name])}"
                    for name in names
                    if name in old.model_fields_set and shown_old[name] != shown_new[name]]
    return "; ".join(changes)


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:80]


def _run_stages(store: RunStore, plan: ProbePlan, labelling: LabellingPlan,
                datasets: Sequence[Dataset], backends: Mapping[str, Backend],
                probers: Sequence[str], answer_models: Sequence[str], judges: Sequence[Judge],
                executor: Executor, progress: Progress, clock: StageClock) -> StoredRun:
    """Every stage; returns the run as labelled (its turns read once, its labels again)."""
    store.keep_plan([*(probed(b) for b in backends.values()), Probed(HUMAN)],
                    [dataset.name for dataset in datasets])
    for dataset in datasets:
        store.put_items(dataset.name, dataset.items)
    for dataset in datasets:
        # Each answer is generated once per answering model and shared by every prober,
        # temperature and perturbation that uses it.
        with clock.generating("answers"):
            answers = {spec: _assistant_stage(store, backends[spec], dataset, plan, executor,
                                              progress)
                       for spec in answer_models}
        references = _reference_answers(dataset)
        for spec in probers:
            sets = {answerer: answers[answers_as(backends[spec])] if answerer == "self" else
                    references if answerer == "reference" else
                    _data_answers(dataset) if answerer == "data" else answers[answerer]
                    for answerer in plan.answerers}
            with clock.generating("user turns"):
                user_stage(store, backends[spec], dataset, sets, plan, executor, progress)
        _human_stage(store, dataset, answers.get(answers_as(backends[probers[0]]), {}))
    # The run is read once, for the labelling stages; the judges see the offline labels, and
    # the caller the last labels, by reading the labels alone again.
    run = read_stored_run(store)
    turns = run.turns
    clock.timed("labelling", "labels", lambda: label_offline(
        store, labelling.offline, backends, classifier_path=labelling.classifier,
        progress=progress, turns=turns))
    classifier = labelling.offline.classifier_source(labelling.classifier)
    try:
        if judges:
            labelled = with_labels(turns, read_labels(store), store.label_sources())
            clock.timed("judge", "requests", lambda: judge_with_all(
                store, judges, labelling.judge_scope, progress,
                threshold=labelling.judge_threshold, record=False, classifier=classifier,
                turns=labelled, offline=labelling.offline))
    finally:
        # The run's label sources, worked out once from its plan and the judges' names; also
        # when judging stops early (Ctrl-C), so the labels it has decide where they exist.
        record_sources(store, labelling.offline, [judge.name for judge in judges],
                       labelling.judge_scope, classifier)
    return run.relabelled(store)


def _human_stage(store: RunStore, dataset: Dataset,
                 model_answers: Mapping[str, tuple[str, str]]) -> None:
    """The human baseline: where the data holds the real next user turn, it is stored as a user
    turn of the pseudo-model ``human`` and labelled like the models' own. Its context is the
    data's assistant answer, or (MT-Bench: a scripted second turn) the first model's answer."""
    rows: list[GenerationRow] = []
    jobs: list[Job] = []
    contexts: list[ContextRow] = []
    for item in dataset.items:
        real = item.next_user_turn
        answer = item.data_answer or model_answers.get(item.id, (None, ""))[1]
        if not real or not answer:
            continue
        context = hashlib.sha256(f"human|{item.id}|{answer}".encode()).hexdigest()[:16]
        request = Request("", GenerationParams(0.0, 1.0, 0), (), 0)
        key = generation_key("user", HUMAN, "data", "", Request(real, request.params), 0)
        jobs.append(Job(key, request, 0, dataset.name, item.id, context,
                        answerer="data" if item.data_answer else "self"))
        contexts.append(ContextRow(context, "none", answer))
        rows.append(GenerationRow(key, "user", HUMAN, "data", "", request, 0,
                                  Generation(real, real, "stop", 0, 0)))
    store.put_contexts(contexts)
    store.put_generations(rows)
    replan(store, "user", Probed(HUMAN), dataset.name, jobs)


def _answer_models(plan: ProbePlan, probers: Sequence[str]) -> list[str]:
    """Models whose greedy answers the probe needs: the probers' own (answerer ``self``) and
    every other model named as an answerer."""
    own = probers if "self" in plan.answerers else []
    others = [a for a in plan.answerers if a not in ("self", "reference", "data")]
    return list(dict.fromkeys([*own, *others]))


def _data_answers(dataset: Dataset) -> dict[str, tuple[str | None, str]]:
    """The conversation's own assistant turn (items without one are left out)."""
    return {item.id: (None, item.data_answer) for item in dataset.items if item.data_answer}


def _reference_answers(dataset: Dataset) -> dict[str, tuple[str | None, str]]:
    """The dataset's own solution as the assistant answer (no generation, no score)."""
    return {item.id: (None, str(item.metadata.get("solution") or item.reference or ""))
            for item in dataset.items}


def _check_renders(backend: Backend, item: Item, plan: ProbePlan) -> None:
    messages = conversation(item, plan)
    render_assistant_turn(backend.template, messages)
    render_user_turn(backend.template, with_placeholder_answer(messages))


def _assistant_stage(store: RunStore, backend: Backend, dataset: Dataset, plan: ProbePlan,
                     executor: Executor, progress: Progress) -> dict[str, tuple[str, str]]:
    """Greedy assistant answers; returns item id -> (generation key, answer text)."""
    params = GenerationParams(temperature=0.0, max_tokens=plan.max_tokens)
    jobs = []
    for item in dataset.items:
        prompt = render_assistant_turn(backend.template, conversation(item, plan))
        request = Request(prompt.text, params, prompt.stop, seed=0)
        key = _key("assistant", backend, prompt, request, 0)
        jobs.append(Job(key, request, 0, dataset.name, item.id, context=""))
    replan(store, "assistant", probed(backend), dataset.name, jobs)
    rows = generate_jobs(store, backend, "assistant", jobs, executor, progress,
                     f"{backend.spec} · {dataset.name} · assistant turns")
    _score(store, dataset, jobs, rows)
    return {job.item_id: (job.key, rows[job.key].generation.text) for job in jobs
            if rows[job.key].generation.error is None}


def _score(store: RunStore, dataset: Dataset, jobs: Sequence[Job],
           rows: Mapping[str, GenerationRow]) -> None:
    if dataset.scorer is None:  # open conversations: no task accuracy
        return
    done = store.scored_keys(dataset.scorer.name)
    items = {item.id: item for item in dataset.items}
    item_ids = {job.key: job.item_id for job in jobs}
    scores = [ScoreRow(key, dataset.scorer.name,
                       dataset.scorer.score(items[item_ids[key]], row.generation.text))
              for key, row in rows.items() if key not in done and row.generation.error is None]
    store.put_scores(scores)


def _key(role: str, backend: Backend, prompt: Prompt, request: Request, sample: int,
         thinking: str = "drop") -> str:
    who = probed(backend)  # an answerer: a model, or a thinking variant of one
    return generation_key(role, who.model, backend.revision, prompt.template_hash, request,
                          sample, thinking, user_variant=who.user_variant,
                          enable_thinking=who.enable_thinking)


def _model_meta(backends: Mapping[str, Backend], conversation: Sequence[Message]
                ) -> dict[str, Any]:
    return {spec: {"revision": b.revision, "template_hash": b.template.hash,
                   **({"template_variables": dict(b.template.variables)}
                      if b.template.variables else {}),
                   "system_message": _system_verdict(b, conversation), **variant_meta(b)}
            for spec, b in backends.items()}


def _system_verdict(backend: Backend, conversation: Sequence[Message]) -> str:
    """What the probe prompt does with the run's system message, in plain words."""
    try:
        return user_prompt_of(backend, with_placeholder_answer(conversation), None).system
    except TemplateError as exc:
        return f"not rendered: {exc}"


def versions(packages: Sequence[str] = ("torch", "transformers", "tokenizers", "numpy")
              ) -> dict[str, str]:
    """What a result depends on: userturn, Python and the installed versions of ``packages``."""
    versions = {"userturn": __version__, "python": platform.python_version()}
    for package in packages:
        try:
            from importlib.metadata import version

            versions[package] = version(package)
        except Exception:  # not installed: nothing to record
            pass
    return versions
