"""The user-turn stage: every arm of the plan on every context of one prober and dataset.

For every answerer, the original context and each perturbed one, each arm of
:data:`ARM_TABLE` the plan names makes its jobs at every temperature and sample (the arms share
contexts and seeds, so they pair item by item); the jobs are planned and generated together, and
each arm then reads what it needs beside its generations (the continuation arm: the role its
continuations opened, the next-role probabilities).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from userturn.backends import Backend
from userturn.data import Dataset
from userturn.probe.arms import ArmBudget, ArmContext, OpenedArm, ProbeArm
from userturn.probe.continuation import ContinuationArm
from userturn.probe.executor import Executor
from userturn.probe.generation import Job, generate_jobs
from userturn.probe.perturb import Perturbation
from userturn.probe.plan import ProbePlan
from userturn.probe.user_variants import probed
from userturn.records import ARMS, Item, Message, Progress
from userturn.store.database import RunStore
from userturn.store.rows import ContextRow, PlanRow, Probed

# How the probe asks for a user turn, by arm name (records.Arm): a new arm is its module and a
# row here.
ARM_TABLE: dict[str, ProbeArm] = {"opened": OpenedArm(), "continuation": ContinuationArm()}
assert tuple(ARM_TABLE) == ARMS, "records.Arm and ARM_TABLE name the same arms, in one order"


def conversation(item: Item, plan: ProbePlan) -> list[Message]:
    """The item's conversation as the model is shown it: the run's system prompt, if any, then
    the item's messages."""
    system = [{"role": "system", "content": plan.system_prompt}] if plan.system_prompt else []
    return [*system, *item.messages]


def replan(store: RunStore, role: str, who: Probed, dataset: str, jobs: Sequence[Job]) -> None:
    """The plan of one role, probed model (its base model and variants, typed) and dataset,
    replaced by these jobs."""
    rows = [PlanRow(job.key, role, who.model, job.dataset, job.item_id, job.context,
                    job.temperature, job.sample_index, job.assistant_key, job.answerer,
                    job.perturbation, job.arm, who.user_variant, who.enable_thinking)
            for job in jobs]
    store.replace_plan(rows, role=role, probed=who, dataset=dataset)


def user_stage(store: RunStore, backend: Backend, dataset: Dataset,
                answer_sets: Mapping[str, Mapping[str, tuple[str | None, str]]],
                plan: ProbePlan, executor: Executor, progress: Progress) -> None:
    """Plan and generate the user turns of one prober on one dataset: for every answerer, the
    original context and each perturbed one, at every temperature and sample."""
    jobs: list[Job] = []
    contexts: list[ContextRow] = []
    thoughts = _answer_thinking(store, answer_sets) if plan.thinking == "keep" else {}
    arms = [ARM_TABLE[name] for name in plan.arms if ARM_TABLE[name].runs_on(backend)]
    budget = ArmBudget(plan.top_p, plan.user_max_tokens, plan.continuation_max_tokens,
                       plan.thinking)
    for answerer, answers in answer_sets.items():
        texts = {item_id: text for item_id, (_, text) in answers.items()}
        for item in dataset.items:
            if item.id not in answers:
                continue  # the assistant turn failed: counted as an error, retried on re-run
            assistant_key, answer = answers[item.id]
            # keep: the original answer's thinking stays in every context of that answer, so a
            # perturbation changes the visible answer only.
            thought = thoughts.get(assistant_key) if assistant_key else None
            for spec, shown in _variants(answer, item.id, texts, plan.perturbations):
                policy = "|keep" if thought else ""
                context = hashlib.sha256(
                    f"{assistant_key}|{answerer}|{spec}|{shown}{policy}".encode()).hexdigest()[:16]
                contexts.append(ContextRow(context, spec, shown))
                messages = [*conversation(item, plan), {"role": "assistant", "content": shown}]
                seeds = _sample_seeds(backend, dataset, item, context, plan)
                where = ArmContext(messages, thought, seeds, dataset.name, item.id, context,
                                   assistant_key, answerer, spec)
                for arm in arms:
                    jobs.extend(arm.jobs(backend, where, budget))
    store.put_contexts(contexts)
    replan(store, "user", probed(backend), dataset.name, jobs)
    rows = generate_jobs(store, backend, "user", jobs, executor, progress,
                         f"{backend.spec} · {dataset.name} · user turns")
    for arm in arms:
        arm.read(store, backend, [job for job in jobs if job.arm == arm.name], rows)


def _answer_thinking(store: RunStore, answer_sets: Mapping[str, Mapping[str, tuple[str | None, str]]]
                     ) -> dict[str, str]:
    """assistant generation key -> its thinking, for the answers that have one."""
    keys = sorted({key for answers in answer_sets.values() for key, _ in answers.values() if key})
    rows = store.generations(keys)
    return {key: row.generation.thinking for key, row in rows.items()
            if row.generation.thinking}


def _variants(answer: str, item_id: str, texts: Mapping[str, str],
              perturbations: Sequence[Perturbation]) -> list[tuple[str, str]]:
    """The original answer and every perturbation that applies to it, as (spec, answer)."""
    variants = [("none", answer)]
    for perturbation in perturbations:
        changed = perturbation.apply(answer, item_id, texts)
        if changed is not None:
            variants.append((perturbation.spec, changed))
    return variants


def _sample_seeds(backend: Backend, dataset: Dataset, item: Item, context: str,
                  plan: ProbePlan) -> list[tuple[float, int, int]]:
    """(temperature, sample index, seed) of every user turn of one context: greedy once, each
    temperature's samples with their own seeds. Both arms draw with the same seeds."""
    return [(temperature, sample,
             _sample_seed(plan.seed, backend.spec, dataset.name, item.id, context, temperature,
                          sample) if temperature > 0 else 0)
            for temperature in plan.temperatures for sample in range(plan.samples_at(temperature))]


def _sample_seed(run_seed: int, *parts: Any) -> int:
    """Every sampled generation gets its own seed, derived from its key: reusing one seed across
    items draws each item's first token from the same point of its distribution."""
    text = json.dumps([run_seed, *parts])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1
