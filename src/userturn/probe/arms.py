"""How the probe asks a model for a user turn: the arms, one row each.

An arm turns one conversation of the run (an item, the answer it is shown, perturbed or not)
into the generation jobs of that context, at every temperature and sample, and reads what came
back where reading needs more than the generated text. The user-turn stage runs every arm the
plan names (``arms:``) on the same contexts with the same seeds, so the arms pair item by item.

- ``opened`` (:class:`OpenedArm`): the USER header is opened in the model's own template and
  the model fills the turn; its keys are those of runs before the arms.
- ``continuation`` (:class:`userturn.probe.continuation.ContinuationArm`): the assistant's turn
  is closed as the template closes a past turn and the model goes on.

A new arm is a module with a class like these and one row of ``probe.user_stage.ARM_TABLE`` (and its name
in ``records.Arm``): the plan, the store, the statistics and the report take it from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from userturn.backends import Backend
from userturn.probe.generation import Job
from userturn.probe.user_variants import probed, user_prompt_of
from userturn.records import GenerationParams, Message, Request
from userturn.store.database import RunStore
from userturn.store.rows import GenerationRow
from userturn.store.sqlite import generation_key


@dataclass(frozen=True)
class ArmContext:
    """One context of a prober's user-turn stage, as every arm receives it."""

    messages: Sequence[Message]  # [system?, the item's messages, assistant: the answer shown]
    thinking: str | None  # the answer's thinking where the run keeps it (thinking: keep)
    seeds: Sequence[tuple[float, int, int]]  # (temperature, sample index, seed) of each turn
    dataset: str
    item_id: str
    context: str
    assistant_key: str | None
    answerer: str
    perturbation: str


@dataclass(frozen=True)
class ArmBudget:
    """The plan's settings an arm reads."""

    top_p: float
    user_max_tokens: int
    continuation_max_tokens: int
    thinking_policy: str  # the plan's ``thinking`` (drop or keep), part of opened keys


class ProbeArm(Protocol):
    name: str

    def runs_on(self, backend: Backend) -> bool:
        """Whether this prober runs the arm (a user-turn variant changes the opened turn only)."""
        ...

    def check(self, backend: Backend) -> None:
        """Refuse, in one line and before anything is written, an engine the arm cannot use."""
        ...

    def jobs(self, backend: Backend, context: ArmContext, budget: ArmBudget) -> list[Job]:
        """The context's jobs, one per (temperature, sample)."""
        ...

    def read(self, store: RunStore, backend: Backend, jobs: Sequence[Job],
             rows: Mapping[str, GenerationRow]) -> None:
        """What the arm stores beside its generations once they are there (nothing for the
        opened arm); never a model call for what is stored."""
        ...


class OpenedArm:
    """The probe as the paper has it: the model's own template with the USER turn opened."""

    name = "opened"

    def runs_on(self, backend: Backend) -> bool:
        return True

    def check(self, backend: Backend) -> None:
        return None

    def jobs(self, backend: Backend, context: ArmContext, budget: ArmBudget) -> list[Job]:
        prompt = user_prompt_of(backend, context.messages, context.thinking)
        jobs, who = [], probed(backend)
        for temperature, sample, seed in context.seeds:
            request = Request(prompt.text,
                              GenerationParams(temperature, budget.top_p, budget.user_max_tokens),
                              prompt.stop, seed)
            key = generation_key("user", who.model, backend.revision, prompt.template_hash,
                                 request, sample, budget.thinking_policy,
                                 user_variant=who.user_variant,
                                 enable_thinking=who.enable_thinking)
            jobs.append(Job(key, request, sample, context.dataset, context.item_id,
                            context.context, temperature, context.assistant_key,
                            context.answerer, context.perturbation))
        return jobs

    def read(self, store: RunStore, backend: Backend, jobs: Sequence[Job],
             rows: Mapping[str, GenerationRow]) -> None:
        return None
