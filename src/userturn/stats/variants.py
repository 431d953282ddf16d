"""Each user-turn variant against the native opening, paired over items.

A variant is a typed field of its turns (``Turn.user_variant``: ``prefill:Thanks``, ...), probed
on the same answers as native (``probe.user_variants``): a variant's condition and the same
condition with ``user_variant`` native share items, so the difference of their follow-up rates
is a paired one. :mod:`userturn.report.terminal` prints these; the HTML report draws them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Sequence

from userturn.records import NATIVE, Condition, Turn, probed_name
from userturn.stats.rates import Difference, paired_difference


@dataclass(frozen=True)
class VariantComparison:
    model: str  # the probed model's spec
    variant: str  # the variant's spec, e.g. prefill:Thanks
    dataset: str
    answerer: str
    perturbation: str
    temperature: float
    follow_up: Difference  # variant minus native on shared items
    enable_thinking: str  # the thinking both sides were probed under

    @property
    def native(self) -> str:
        """The native side's name as the tables print it (``MODEL``, ``MODEL[thinking=on]``)."""
        return probed_name(self.model, NATIVE, self.enable_thinking)


def variant_comparisons(turns: Sequence[Turn]) -> list[VariantComparison]:
    """Every variant's follow-up rate minus native's, paired over items, in each condition the
    variant shares with native (model and its thinking, dataset, answerer, perturbation,
    temperature, arm), in condition order."""
    groups: dict[Condition, list[tuple[str, bool]]] = defaultdict(list)
    for t in turns:
        if t.counts_toward_rate:
            groups[Condition.of(t)].append((t.item_id, t.follow_up))
    out = []
    for condition, hits in sorted(groups.items()):
        if condition.user_variant == NATIVE:
            continue
        native = groups.get(replace(condition, user_variant=NATIVE))
        if native:
            out.append(VariantComparison(condition.model, condition.user_variant,
                                         condition.dataset, condition.answerer,
                                         condition.perturbation, condition.temperature,
                                         paired_difference(native, hits),
                                         condition.enable_thinking))
    return out
