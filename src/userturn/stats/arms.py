"""The continuation arm beside the opened one, condition by condition.

Per condition of the continuation arm (model, answerer, dataset, perturbation, temperature),
with intervals clustered by item: the share of continuations that open a user turn, the
follow-up rate over every continuation (the unforced rate: a continuation that had another role
speak is no follow-up) and over the user turns written, and the mean next-role probabilities at
the prompt's end. The opened arm's rate of the same condition stands beside it, and the unforced
rate minus the opened one is paired over items (same items, same answers).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Sequence

from userturn.records import DEFAULT_ARM, NEXT_ROLES, Condition, Turn
from userturn.stats.rates import Difference, Rate, clustered_rate, paired_difference

ROLE_OPTIONS = ("user", "assistant", "end", "other")  # the next-role probabilities, in order


@dataclass(frozen=True)
class ArmRow:
    condition: Condition  # the continuation arm's condition
    continuations: int  # generated (failed generations are not in any rate)
    roles: dict[str, int]  # what each continuation opened first, by role (NEXT_ROLES)
    opens_user: Rate  # share of continuations that open a user turn
    unforced: Rate  # follow-ups over every continuation
    written: Rate | None  # follow-ups over the user turns written (None: none written)
    opened: Rate | None  # the opened arm's follow-up rate in the same condition
    difference: Difference | None  # unforced minus opened, paired over items
    next_role: dict[str, float] | None  # mean next-role probabilities (None: none scored)
    scored: int = 0  # continuations whose prompt was scored


def arm_rows(turns: Sequence[Turn]) -> list[ArmRow]:
    """One row per condition of the continuation arm, in condition order."""
    groups: dict[Condition, list[Turn]] = defaultdict(list)
    for turn in turns:
        if turn.counts_toward_rate:
            groups[Condition.of(turn)].append(turn)
    rows = []
    for condition, group in sorted(groups.items()):
        if condition.arm == DEFAULT_ARM:
            continue
        opened_group = groups.get(replace(condition, arm=DEFAULT_ARM), [])
        unforced = [(t.item_id, t.follow_up) for t in group]
        written = [(t.item_id, t.follow_up) for t in group if t.is_user_turn]
        forced = [(t.item_id, t.follow_up) for t in opened_group]
        roles = Counter(t.next_role or "none" for t in group)
        scored = [t.role_probabilities for t in group if t.role_probabilities]
        rows.append(ArmRow(
            condition=condition, continuations=len(group),
            roles={role: roles[role] for role in NEXT_ROLES if roles[role]},
            opens_user=clustered_rate((t.item_id, t.is_user_turn) for t in group),
            unforced=clustered_rate(unforced),
            written=clustered_rate(written) if written else None,
            opened=clustered_rate(forced) if forced else None,
            difference=paired_difference(forced, unforced) if forced else None,
            next_role={role: sum(p[role] for p in scored) / len(scored)
                       for role in ROLE_OPTIONS} if scored else None,
            scored=len(scored)))
    return rows
