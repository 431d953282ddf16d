"""The continuation arm: the model is not handed the user's seat.

The opened arm writes the USER header itself and has the model fill it; a family post-trained so
that whatever follows a user header is a fresh query reads that turn as one, whatever it knows of
the conversation. Here the conversation ``[system?, user: q, assistant: a]`` ends as the template
ends a past turn, and the model goes on, past the end-of-turn and end-of-text tokens the template
writes between turns, until the turn it opened is closed or its budget is spent
(``continuation_max_tokens``). Which role it opened first and, when it is the user's, that turn
(:mod:`userturn.chat.continuation` parses both with the template's own markers) are stored beside
the raw text, with the next-role probabilities at the prompt's end: one forward pass on the
scoring seam a local judge uses (``score_options``).

Keys: a continuation's generation key names its arm, so it never meets an opened-arm key; the
opened arm's keys are those of runs before the arms.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from userturn.backends import Backend
from userturn.backends.options import can_score_prompts, engine_end_texts
from userturn.chat.continuation import (
    continuation_markers,
    next_role_options,
    next_role_probabilities,
    parse_continuation,
    render_continuation,
)
from userturn.errors import ConfigError
from userturn.probe.arms import ArmBudget, ArmContext
from userturn.probe.generation import Job, engine_of
from userturn.probe.user_variants import UserVariantBackend, probed
from userturn.records import GenerationParams, Request
from userturn.store.database import RunStore
from userturn.store.rows import ContinuationRow, GenerationRow
from userturn.store.sqlite import generation_key


class ContinuationArm:
    """The conversation closed after the assistant's turn; the model goes on."""

    name = "continuation"

    def runs_on(self, backend: Backend) -> bool:
        # A user-turn variant changes the opened USER turn, which this arm never opens.
        return not isinstance(backend, UserVariantBackend)

    def check(self, backend: Backend) -> None:
        """The arm needs an engine that goes on past the end of sequence and scores a prompt's
        next tokens: a chat-only endpoint does neither."""
        if not can_score_prompts(engine_of(backend)):
            raise ConfigError(
                f"{backend.spec}: the continuation arm needs a completions engine that scores "
                "prompt tokens (transformers, llama.cpp, vLLM, or a /v1/completions server "
                "that returns prompt log-probabilities); run it with --arms opened")

    def jobs(self, backend: Backend, context: ArmContext, budget: ArmBudget) -> list[Job]:
        prompt = render_continuation(backend.template, context.messages, context.thinking,
                                     ends=engine_end_texts(engine_of(backend)))
        jobs, who = [], probed(backend)
        for temperature, sample, seed in context.seeds:
            request = Request(prompt.text, GenerationParams(
                temperature, budget.top_p, budget.continuation_max_tokens), prompt.stop, seed,
                past_end=True)
            key = generation_key("user", who.model, backend.revision, prompt.template_hash,
                                 request, sample, arm=self.name, user_variant=who.user_variant,
                                 enable_thinking=who.enable_thinking)
            jobs.append(Job(key, request, sample, context.dataset, context.item_id,
                            context.context, temperature, context.assistant_key,
                            context.answerer, context.perturbation, arm=self.name))
        return jobs

    def read(self, store: RunStore, backend: Backend, jobs: Sequence[Job],
             rows: Mapping[str, GenerationRow]) -> None:
        read_continuations(store, backend, jobs, rows)


def read_continuations(store: RunStore, backend: Backend, jobs: Sequence[Job],
                       rows: Mapping[str, GenerationRow]) -> int:
    """Parse each generated continuation the store has not read, and score the next-role
    probabilities of each prompt among them (once per prompt). A stored reading is kept: a
    finished run re-run makes no model call. Returns the continuations read."""
    done = store.continuations([job.key for job in jobs])
    todo = [job for job in jobs if job.key not in done and job.key in rows
            and rows[job.key].generation.error is None]
    if not todo:
        return 0
    markers = continuation_markers(backend.template, engine_end_texts(engine_of(backend)))
    options = next_role_options(markers)
    scores = {prompt: next_role_scores(backend, prompt, options)
              for prompt in dict.fromkeys(job.request.prompt for job in todo)}
    readings = []
    for job in todo:
        generation = rows[job.key].generation
        parsed = parse_continuation(markers, generation.raw_text or generation.text)
        probabilities = scores[job.request.prompt]
        readings.append(ContinuationRow(
            job.key, parsed.role, parsed.user_turn, parsed.content_at,
            probabilities.get("user"), probabilities.get("assistant"), probabilities.get("end")))
    store.put_continuations(readings)
    return len(readings)


def next_role_scores(backend: Backend, prompt: str, options: Sequence[tuple[str, str]]
                     ) -> dict[str, float]:
    """P(the next tokens are the user header / the assistant header / an end of sequence) at
    the prompt's end, each option scored whole in one pass over the prompt; ``other`` is the
    rest."""
    engine: Any = engine_of(backend)
    logprobs = engine.score_options(prompt, [option for _, option in options], whole=True)
    return next_role_probabilities([role for role, _ in options], logprobs)

