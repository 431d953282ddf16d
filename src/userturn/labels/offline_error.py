"""How far the offline labeller was from people on sources it was never fit to, said beside a rate.

A rate labelled by the rules and the learned classifier alone is only as good as they are on the
run's model, which they were not fit to. ``offline_error.json`` ships the leave-one-model-out
figures of the labelled corpus (``benchmarks/offline_error_card.py`` writes it from the output of
``benchmarks/leave_one_model_out.py --context``, and ``benchmarks/unseen_people.py`` for people's
ShareGPT turns): per held-out group (each generator, people), the
shipped labeller's kappa against the adjudicated labels and how far the follow-up rate it printed
was from the adjudicated rate in each condition. The summary and the report say so beside every
rate that comes from offline labels alone, with the way to correct it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CARD_FILE = Path(__file__).with_name("offline_error.json")


@dataclass(frozen=True)
class OfflineError:
    labeller: str  # "context" (the shipped default) or "form"
    source: str  # the benchmark output the figures come from
    groups: tuple[str, ...]  # the held-out groups (generators, people)
    kappa_follow_up: tuple[float, float]  # lowest and highest over the held-out groups
    max_gap: float  # the largest |printed - adjudicated| follow-up rate in a condition, points
    mean_gap: float  # the mean of those, points
    conditions: int

    def note(self, what: str = "offline labels only (rules and classifier)") -> str:
        """The note beside offline rates; ``what``: which labels of the run it speaks of."""
        low, high = self.kappa_follow_up
        return (f"{what}: on sources it was never fit to "
                f"({', '.join(self.groups)}), its kappa with people was {low:.2f}-{high:.2f} "
                f"(follow-up vs rest) and the follow-up rate it printed was off by "
                f"{self.mean_gap:.1f} points on average, up to {self.max_gap:.0f}, in a "
                f"condition ({self.source}; docs/classifier.md). Correct it with human labels: "
                "userturn annotate RUN --calibration 100; or judge the turns it is unsure of: "
                "userturn judge RUN --judge SPEC --scope uncertain")


@lru_cache(maxsize=4)
def offline_error(labeller: str = "context", path: Path = CARD_FILE) -> OfflineError | None:
    """The shipped figures for ``labeller`` (None where the card is missing or lacks it)."""
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
        folds = card["labellers"][labeller]
        gaps = [abs(float(g)) for fold in folds.values() for g in fold.get("gaps", [])]
        kappas = [float(fold["kappa_follow_up"]) for fold in folds.values()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a damaged card loses the note, never the report
    if not gaps or not kappas:
        return None
    return OfflineError(labeller, str(card.get("source", "")), tuple(folds), (min(kappas),
                        max(kappas)), max(gaps), sum(gaps) / len(gaps), len(gaps))
