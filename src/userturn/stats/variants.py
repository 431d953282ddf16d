"""Each user-turn variant against the native opening, paired over items.

A variant is probed as a model of its own, ``MODEL[user=SPEC]`` (``probe.user_variants`` names
it so), on the same answers as ``MODEL``: its turns and native's share items condition by
condition, so the difference of their follow-up rates is a paired one.
:mod:`userturn.report.terminal` prints these; the HTML report draws them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Sequence

from userturn.records import Condition, Turn
from userturn.stats.rates import Difference, paired_difference


@dataclass(frozen=True)
class VariantComparison:
    native: str
    variant: str  # the variant's spec, e.g. prefill:Thanks
    dataset: str
    answerer: str
    perturbation: str
    temperature: float
    follow_up: Difference  # variant minus native on shared items


def split_variant_spec(model: str) -> tuple[str, str] | None:
    """``MODEL[user=SPEC]`` -> (MODEL, SPEC); None for a model without a user-turn variant."""
    at = model.rfind("[user=")
    if at < 0 or not model.endswith("]"):
        return None
    return model[:at], model[at + len("[user="):-1]


def variant_comparisons(turns: Sequence[Turn]) -> list[VariantComparison]:
    """Every variant's follow-up rate minus native's, paired over items, in each condition the
    variant shares with native (dataset, answerer, perturbation, temperature), in condition
    order."""
    groups: dict[Condition, list[tuple[str, bool]]] = defaultdict(list)
    for t in turns:
        if t.counts_toward_rate:
            groups[Condition.of(t)].append((t.item_id, t.follow_up))
    out = []
    for condition, hits in sorted(groups.items()):
        split = split_variant_spec(condition.model)
        native = groups.get(replace(condition, model=split[0])) if split else None
        if split and native:
            out.append(VariantComparison(split[0], split[1], condition.dataset,
                                         condition.answerer, condition.perturbation,
                                         condition.temperature, paired_difference(native, hits)))
    return out
