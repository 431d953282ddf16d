"""enable_thinking as an experiment factor: each value makes a prober of its own.

Thinking on and off share the base backend (one set of weights) and differ in the template
variable. Each is its own prober and its own condition: the plan stores the base model with
``enable_thinking`` (``on``, ``off``) typed beside it, and the tables print it as
``MODEL[thinking=on]`` (records.probed_name), as runs before the typed field named it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from userturn.backends import Backend
from userturn.chat.render import (
    ChatTemplate,
    render_assistant_turn,
    render_user_turn,
    with_placeholder_answer,
)
from userturn.errors import ConfigError
from userturn.probe.plan import ProbePlan
from userturn.records import Generation, Message, Request
from userturn.store.rows import Probed


class ThinkingVariant:
    """A probed model with ``enable_thinking`` fixed: a prober of its own (``probed``, its
    base model and the typed value; ``spec``, its name, tells it from the other probers of the
    run); generation is the base backend's."""

    def __init__(self, base: Backend, enable: bool) -> None:
        self.base, self.enable = base, enable
        self.probed = Probed(base.spec, enable_thinking="on" if enable else "off")
        self.spec = self.probed.name
        self.template: ChatTemplate = replace(
            base.template, variables={**base.template.variables, "enable_thinking": enable})
        self.revision, self.chunk_size = base.revision, base.chunk_size

    def complete(self, requests: Sequence[Request]) -> list[Generation]:
        return self.base.complete(requests)


def thinking_variants(backends: Mapping[str, Backend], messages: Sequence[Message],
                      plan: ProbePlan) -> tuple[dict[str, Backend], list[str]]:
    """The backends with each prober split into its enable_thinking variants, and the probers.

    A template that ignores enable_thinking would give variants that differ in name only: that is
    refused up front rather than reported as two identical models."""
    if plan.enable_thinking is None:
        return dict(backends), list(plan.models)
    out = {spec: b for spec, b in backends.items() if spec not in plan.models
           or spec in plan.answerers}
    probers = []
    for spec in plan.models:
        on, off = ThinkingVariant(backends[spec], True), ThinkingVariant(backends[spec], False)
        if _probe_prompts(on, messages, plan) == _probe_prompts(off, messages, plan):
            raise ConfigError(
                f"enable_thinking has no effect on the chat template of {spec}: thinking on and "
                "off render the same prompts; leave enable_thinking out for this model")
        for enable in plan.enable_thinking:
            variant = on if enable else off
            out[variant.spec] = variant
            probers.append(variant.spec)
    return out, probers


def _probe_prompts(backend: Backend, messages: Sequence[Message], plan: ProbePlan
                   ) -> tuple[str, ...]:
    """The prompts a prober is given for one conversation: its answer prompt (if it answers
    itself) and the user-turn prompt."""
    user = render_user_turn(backend.template, with_placeholder_answer(messages))
    if "self" not in plan.answerers:
        return (user.text,)
    return (render_assistant_turn(backend.template, messages).text, user.text)
