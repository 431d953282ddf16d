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
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from . import __version__
from .backends import Backend, load_backend
from .config import Experiment
from .data import Dataset, load_dataset
from .errors import TemplateError
from .judge import Judge, judge_from_spec
from .lock import RunLock
from .perturb import Perturbation, parse_perturbations
from .records import HUMAN, Case, Generation, GenerationParams, Item, Message, Request
from .render import Prompt, render_assistant_turn, render_user_turn
from .rules import RulesClassifier
from .store import RunStore, generation_key
from .thinking import prompt_opens_thinking, split_thinking, thinking_format
from .variants import thinking_variants

Progress = Callable[[str, int], Callable[[int], None]]  # (description, total) -> advance(n)


@dataclass(frozen=True)
class Job:
    """One planned generation: its request and where it sits in the experiment."""

    key: str
    request: Request
    sample_index: int
    dataset: str
    item_id: str
    context: str
    temperature: float = 0.0
    assistant_key: str | None = None
    answerer: str = "self"
    perturbation: str = "none"


def run_experiment(exp: Experiment, *, backends: Mapping[str, Backend] | None = None,
                   progress: Progress | None = None,
                   datasets: Sequence[Dataset] | None = None) -> RunStore:
    """Run (or resume) an experiment into ``exp.output`` and return its open store.

    ``datasets`` replaces loading ``exp.datasets`` (training draws its items from a split)."""
    progress = progress or _silent
    if datasets is None:
        datasets = [load_dataset(spec, limit=exp.limit, seed=exp.seed, fields=exp.fields,
                                 skip_invalid=exp.skip_invalid, context_turns=exp.context_turns)
                    for spec in exp.datasets]
    perturbations = parse_perturbations(exp.perturbations)
    if backends is None:
        backends = {spec: load_backend(spec, batch_size=exp.batch_size, base_url=exp.base_url,
                                       tokenizer=exp.tokenizer, prompt_as=exp.prompt_as,
                                       backend_args=exp.backend_args or None)
                    for spec in dict.fromkeys([*exp.models, *_answer_models(exp, exp.models)])}
    for backend in backends.values():  # misuse fails here, before the run folder is written
        _check_renders(backend, datasets[0].items[0], exp)
    backends, probers = thinking_variants(backends, _conversation(datasets[0].items[0], exp), exp)
    judge = _judge(exp)
    for dataset in datasets:
        for note in dataset.notes:  # a truncation, a skip count: said once, kept in the meta
            warnings.warn(note, stacklevel=2)
    with RunLock(exp.output, "run"):  # one writer: a second run here fails naming this one
        store = RunStore.create(exp.output)
        store.set_meta({"config": exp.model_dump(mode="json"), "versions": versions(),
                        "started": time.time(), "finished": None, "models": _model_meta(backends),
                        "skipped": {d.name: d.skipped for d in datasets if d.skipped},
                        "dataset_notes": {d.name: list(d.notes) for d in datasets if d.notes}})
        _run_stages(store, exp, datasets, backends, probers, perturbations, judge, progress)
        store.check_present()
        store.set_meta({"finished": time.time()})
    return store


def _run_stages(store: RunStore, exp: Experiment, datasets: Sequence[Dataset],
                backends: Mapping[str, Backend], probers: Sequence[str],
                perturbations: Sequence[Perturbation], judge: Judge | None,
                progress: Progress) -> None:
    answer_models = _answer_models(exp, probers)
    store.keep_plan([*backends, HUMAN], [dataset.name for dataset in datasets])
    for dataset in datasets:
        store.put_items(dataset.name, [_item_record(item) for item in dataset.items])
    for dataset in datasets:
        # Each answer is generated once per answering model and shared by every prober,
        # temperature and perturbation that uses it.
        answers = {spec: _assistant_stage(store, backends[spec], dataset, exp, progress)
                   for spec in answer_models}
        references = _reference_answers(dataset)
        for spec in probers:
            sets = {answerer: answers[spec] if answerer == "self" else
                    references if answerer == "reference" else
                    _data_answers(dataset) if answerer == "data" else answers[answerer]
                    for answerer in exp.answerers}
            _user_stage(store, backends[spec], dataset, sets, perturbations, exp, progress)
        _human_stage(store, dataset, answers.get(probers[0], {}))
    _classify_stage(store, backends)
    if judge is not None:
        judge_turns(store, judge, exp.judge_scope, progress)


def _human_stage(store: RunStore, dataset: Dataset,
                 model_answers: Mapping[str, tuple[str, str]]) -> None:
    """The human baseline: where the data holds the real next user turn, it is stored as a user
    turn of the pseudo-model ``human`` and labelled like the models' own. Its context is the
    data's assistant answer, or (MT-Bench: a scripted second turn) the first model's answer."""
    rows, jobs, contexts = [], [], []
    for item in dataset.items:
        real = item.metadata.get("next_user_turn")
        answer = item.metadata.get("data_answer") or model_answers.get(item.id, (None, ""))[1]
        if not real or not answer:
            continue
        context = hashlib.sha256(f"human|{item.id}|{answer}".encode()).hexdigest()[:16]
        request = Request("", GenerationParams(0.0, 1.0, 0), (), 0)
        key = generation_key("user", HUMAN, "data", "", Request(real, request.params), 0)
        jobs.append(Job(key, request, 0, dataset.name, item.id, context,
                        answerer="data" if item.metadata.get("data_answer") else "self"))
        contexts.append((context, "none", answer))
        rows.append((key, "user", HUMAN, "data", "", request, 0,
                     Generation(real, real, "stop", 0, 0)))
    store.put_contexts(contexts)
    store.put_generations(rows)
    _replan(store, "user", HUMAN, dataset.name, jobs)


def _answer_models(exp: Experiment, probers: Sequence[str]) -> list[str]:
    """Models whose greedy answers the probe needs: the probers' own (answerer ``self``) and
    every other model named as an answerer."""
    own = probers if "self" in exp.answerers else []
    others = [a for a in exp.answerers if a not in ("self", "reference", "data")]
    return list(dict.fromkeys([*own, *others]))


def _data_answers(dataset: Dataset) -> dict[str, tuple[str | None, str]]:
    """The conversation's own assistant turn (items without one are left out)."""
    return {item.id: (None, str(item.metadata["data_answer"])) for item in dataset.items
            if item.metadata.get("data_answer")}


def _reference_answers(dataset: Dataset) -> dict[str, tuple[str | None, str]]:
    """The dataset's own solution as the assistant answer (no generation, no score)."""
    return {item.id: (None, str(item.metadata.get("solution") or item.reference or ""))
            for item in dataset.items}


def _judge(exp: Experiment) -> Judge | None:
    if exp.judge is None:
        return None
    judge = judge_from_spec(exp.judge, base_url=exp.judge_base_url)
    judge.concurrency = exp.judge_concurrency
    return judge


def judge_turns(store: RunStore, judge: Judge, scope: str, progress: Progress | None = None,
                chunk: int = 32) -> int:
    """Label the run's user turns with an LLM judge: those the rules left undecided, or all.

    Cached by judge name (which carries the rubric version) and generation key: turns this judge
    already labelled successfully are not sent again; a failed verdict (an error label) is
    retried by the next call. Verdicts are committed as they arrive, ``chunk`` at a time and
    whatever was received when interrupted. Returns the number of turns sent; the outcome
    (sent, failed, first error) is counted in ``store.tally``. The run's label sources become
    rules-then-judge (or the judge alone).
    """
    rules = store.labels_by_source().get("rules", {})
    done = store.labelled_keys(judge.name, judge.version)
    turns = [t for t in store.user_turns(judge.name) if t["error"] is None
             and t["key"] not in done and (scope == "all" or rules.get(t["key"]) is None)]
    advance = (progress or _silent)(f"judge {judge.name}", len(turns))
    received: list[tuple[str, str, Any]] = []
    verdicts = judge.classify_as_done([_case(turn, "") for turn in turns])
    try:
        for index, label in verdicts:
            received.append((turns[index]["key"], judge.version, label))
            store.tally.count("judge", label.error)
            if len(received) >= chunk:
                store.put_labels(received)
                advance(len(received))
                received = []
    finally:
        verdicts.close()  # cancels what was not sent (Ctrl-C)
        store.put_labels(received)  # every verdict received is kept
    sources = ["rules", judge.name] if scope == "undecided" else [judge.name]
    store.set_meta({"label_sources": sources})
    return len(turns)


def _case(turn: Mapping[str, Any], assistant_header: str) -> Case:
    # Classifiers see the visible text only: where thinking was split off, the raw text (which
    # still holds it) is replaced by the visible text.
    thinking = turn.get("thinking")
    raw = turn["raw_text"] if thinking is None else turn["text"]
    return Case(turn["query"], turn["answer"] or "", turn["text"], raw, assistant_header,
                thinking or "")


def _silent(description: str, total: int) -> Callable[[int], None]:
    return lambda n: None


def _conversation(item: Item, exp: Experiment) -> list[Message]:
    system = [{"role": "system", "content": exp.system_prompt}] if exp.system_prompt else []
    return [*system, *item.messages]


def _check_renders(backend: Backend, item: Item, exp: Experiment) -> None:
    messages = _conversation(item, exp)
    render_assistant_turn(backend.template, messages)
    render_user_turn(backend.template, [*messages, {"role": "assistant", "content": "42"}])


def _assistant_stage(store: RunStore, backend: Backend, dataset: Dataset, exp: Experiment,
                     progress: Progress) -> dict[str, tuple[str, str]]:
    """Greedy assistant answers; returns item id -> (generation key, answer text)."""
    params = GenerationParams(temperature=0.0, max_tokens=exp.max_tokens)
    jobs = []
    for item in dataset.items:
        prompt = render_assistant_turn(backend.template, _conversation(item, exp))
        request = Request(prompt.text, params, prompt.stop, seed=0)
        key = _key("assistant", backend, prompt, request, 0)
        jobs.append(Job(key, request, 0, dataset.name, item.id, context=""))
    _replan(store, "assistant", backend.spec, dataset.name, jobs)
    rows = _generate(store, backend, "assistant", jobs, progress,
                     f"{backend.spec} · {dataset.name} · assistant turns")
    _score(store, dataset, rows)
    return {job.item_id: (job.key, rows[job.key]["text"]) for job in jobs
            if rows[job.key]["error"] is None}


def _score(store: RunStore, dataset: Dataset, rows: Mapping[str, Any]) -> None:
    if dataset.scorer is None:  # open conversations: no task accuracy
        return
    done = store.scored_keys(dataset.scorer.name)
    items = {item.id: item for item in dataset.items}
    scores = [(key, dataset.scorer.name, dataset.scorer.score(items[row["item_id"]], row["text"]))
              for key, row in rows.items() if key not in done and row["error"] is None]
    store.put_scores(scores)


def _user_stage(store: RunStore, backend: Backend, dataset: Dataset,
                answer_sets: Mapping[str, Mapping[str, tuple[str | None, str]]],
                perturbations: Sequence[Perturbation], exp: Experiment,
                progress: Progress) -> None:
    """Plan and generate the user turns of one prober on one dataset: for every answerer, the
    original context and each perturbed one, at every temperature and sample."""
    jobs: list[Job] = []
    contexts: list[tuple[str, str, str]] = []
    thoughts = _answer_thinking(store, answer_sets) if exp.thinking == "keep" else {}
    for answerer, answers in answer_sets.items():
        texts = {item_id: text for item_id, (_, text) in answers.items()}
        for item in dataset.items:
            if item.id not in answers:
                continue  # the assistant turn failed: counted as an error, retried on re-run
            assistant_key, answer = answers[item.id]
            # keep: the original answer's thinking stays in every context of that answer, so a
            # perturbation changes the visible answer only.
            thought = thoughts.get(assistant_key) if assistant_key else None
            for spec, shown in _variants(answer, item.id, texts, perturbations):
                policy = "|keep" if thought else ""
                context = hashlib.sha256(
                    f"{assistant_key}|{answerer}|{spec}|{shown}{policy}".encode()).hexdigest()[:16]
                contexts.append((context, spec, shown))
                messages = [*_conversation(item, exp), {"role": "assistant", "content": shown}]
                prompt = render_user_turn(backend.template, messages, thinking=thought)
                jobs.extend(_user_jobs(backend, dataset, item, prompt, context, assistant_key,
                                       answerer, spec, exp))
    store.put_contexts(contexts)
    _replan(store, "user", backend.spec, dataset.name, jobs)
    _generate(store, backend, "user", jobs, progress,
              f"{backend.spec} · {dataset.name} · user turns")


def _answer_thinking(store: RunStore, answer_sets: Mapping[str, Mapping[str, tuple[str | None, str]]]
                     ) -> dict[str, str]:
    """assistant generation key -> its thinking, for the answers that have one."""
    keys = sorted({key for answers in answer_sets.values() for key, _ in answers.values() if key})
    rows = store.generations(keys)
    return {key: row["thinking"] for key, row in rows.items() if row["thinking"]}


def _variants(answer: str, item_id: str, texts: Mapping[str, str],
              perturbations: Sequence[Perturbation]) -> list[tuple[str, str]]:
    """The original answer and every perturbation that applies to it, as (spec, answer)."""
    variants = [("none", answer)]
    for perturbation in perturbations:
        changed = perturbation.apply(answer, item_id, texts)
        if changed is not None:
            variants.append((perturbation.spec, changed))
    return variants


def _user_jobs(backend: Backend, dataset: Dataset, item: Item, prompt: Prompt, context: str,
               assistant_key: str | None, answerer: str, perturbation: str,
               exp: Experiment) -> list[Job]:
    jobs = []
    for temperature in exp.temperatures:
        params = GenerationParams(temperature, exp.top_p, exp.user_max_tokens)
        for sample in range(exp.samples_at(temperature)):
            seed = _sample_seed(exp.seed, backend.spec, dataset.name, item.id, context,
                                temperature, sample) if temperature > 0 else 0
            request = Request(prompt.text, params, prompt.stop, seed)
            key = _key("user", backend, prompt, request, sample, exp.thinking)
            jobs.append(Job(key, request, sample, dataset.name, item.id, context, temperature,
                            assistant_key, answerer, perturbation))
    return jobs


def _sample_seed(run_seed: int, *parts: Any) -> int:
    """Every sampled generation gets its own seed, derived from its key: reusing one seed across
    items draws each item's first token from the same point of its distribution."""
    text = json.dumps([run_seed, *parts])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def _key(role: str, backend: Backend, prompt: Prompt, request: Request, sample: int,
         thinking: str = "drop") -> str:
    return generation_key(role, backend.spec, backend.revision, prompt.template_hash, request,
                          sample, thinking)


def _replan(store: RunStore, role: str, model: str, dataset: str, jobs: Sequence[Job]) -> None:
    rows = [{"key": job.key, "role": role, "model": model, "dataset": job.dataset,
             "item_id": job.item_id, "context": job.context, "temperature": job.temperature,
             "sample_index": job.sample_index, "assistant_key": job.assistant_key,
             "answerer": job.answerer, "perturbation": job.perturbation}
            for job in jobs]
    store.replace_plan(rows, role=role, model=model, dataset=dataset)


def _generate(store: RunStore, backend: Backend, role: str, jobs: Sequence[Job],
              progress: Progress, description: str) -> dict[str, Any]:
    """Generate what the store lacks, chunk by chunk, committing each chunk; return all rows."""
    keys = [job.key for job in jobs]
    finished = store.finished_keys(keys)
    missing = [job for job in jobs if job.key not in finished]
    # Similar lengths batch with less padding; the order does not change any result.
    missing.sort(key=lambda job: len(job.request.prompt), reverse=True)
    advance = progress(description, len(jobs))
    advance(len(jobs) - len(missing))
    for start in range(0, len(missing), backend.chunk_size):
        chunk = missing[start:start + backend.chunk_size]
        fmt = thinking_format(backend.template.source)
        generations = [_split(generation, job.request, fmt) for job, generation in
                       zip(chunk, backend.complete([job.request for job in chunk]))]
        for generation in generations:
            store.tally.count("generation", generation.error)
        store.put_generations([
            (job.key, role, backend.spec, backend.revision, backend.template.hash, job.request,
             job.sample_index, generation) for job, generation in zip(chunk, generations)])
        advance(len(chunk))
    rows = store.generations(keys)
    return {job.key: {**dict(rows[job.key]), "item_id": job.item_id} for job in jobs}


def _split(generation: Generation, request: Request, fmt: str) -> Generation:
    """Thinking out of the generated text, once for every backend: ``text`` becomes the visible
    part (what is scored, shown and labelled), ``thinking`` is kept apart, ``raw_text`` as is."""
    if generation.error is not None:
        return generation
    body = generation.raw_text or generation.text
    for marker in request.stop:
        if marker and body.endswith(marker):
            body = body[:-len(marker)]
            break
    thinking, visible = split_thinking(body, fmt,  # type: ignore[arg-type]
                                       opened=prompt_opens_thinking(request.prompt))
    if thinking is None and visible == body.strip():
        return generation  # nothing to split: the backend's own text stands
    return replace(generation, text=visible, thinking=thinking)


def _classify_stage(store: RunStore, backends: Mapping[str, Backend]) -> None:
    """Rules label every user turn they have not labelled at this version."""
    rules = RulesClassifier()
    done = store.labelled_keys(rules.name, rules.version)
    headers = {spec: _assistant_header(b) for spec, b in backends.items()}
    labels: list[tuple[str, str, Any]] = []
    for turn in store.user_turns(rules.name):
        if turn["key"] in done or turn["error"] is not None:
            continue
        case = _case(turn, headers.get(turn["model"], ""))
        labels.append((turn["key"], rules.version, rules.classify(case)))
    store.put_labels(labels)


def _assistant_header(backend: Backend) -> str:
    try:
        from .render import derive_markers

        return derive_markers(backend.template).assistant_header.strip()
    except TemplateError:
        return ""


def _item_record(item: Item) -> dict[str, Any]:
    return {"id": item.id, "messages": [dict(m) for m in item.messages],
            "reference": item.reference, "metadata": dict(item.metadata)}


def _model_meta(backends: Mapping[str, Backend]) -> dict[str, Any]:
    return {spec: {"revision": b.revision, "template_hash": b.template.hash,
                   **({"template_variables": dict(b.template.variables)}
                      if b.template.variables else {})}
            for spec, b in backends.items()}


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
