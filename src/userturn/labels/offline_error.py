"""How far the offline labeller was from people on sources it was never fit to, said beside a rate.

A rate labelled by the rules and the learned classifier alone is only as good as they are on the
run's model, which they were not fit to. ``offline_error.json`` ships the leave-one-model-out
figures of the labelled corpus (``benchmarks/offline_error_card.py`` writes it from the output of
``benchmarks/leave_one_model_out.py --context``, and ``benchmarks/unseen_people.py`` for people's
ShareGPT turns): per held-out group (each generator, people), the
shipped labeller's kappa against the adjudicated labels and how far the follow-up rate it printed
was from the adjudicated rate in each condition. The summary and the report say so beside every
rate that comes from offline labels alone, with the way to correct it.

Each group also has its follow-up confusion table against the adjudicated labels
(``follow_up_confusion``, laid out as the judge check's), for the shipped cascades and for the
rules alone: :func:`offline_confusion` pools them, and the plan of a human sample
(``userturn annotate RUN --plan``, :mod:`userturn.stats.planning`) reads the labeller's error
from it. The tables come from each group's turns, follow-up precision and recall in the same
benchmark outputs and its adjudicated follow-ups (``docs/corpus.md``); they give back each
group's follow-up kappa to within 0.005 (docs/statistics.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from userturn.records import CLASSIFIER_SOURCE, RULES_SOURCE, variant_source

CARD_FILE = Path(__file__).with_name("offline_error.json")
# The card's figures for each shipped classifier's source, and for a run the rules label alone.
CARDS = {CLASSIFIER_SOURCE: "context", variant_source(CLASSIFIER_SOURCE, "form"): "form",
         RULES_SOURCE: "rules"}
PLAN_HINT = ("userturn annotate RUN --plan --half-width 0.05 sizes the human sample for the "
             "interval you need")
Confusion = tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class OfflineError:
    labeller: str  # "context" (the shipped default) or "form"
    source: str  # the benchmark output the figures come from
    groups: tuple[str, ...]  # the held-out groups (generators, people)
    kappa_follow_up: tuple[float, float]  # lowest and highest over the held-out groups
    max_gap: float  # the largest |printed - adjudicated| follow-up rate in a condition, points
    mean_gap: float  # the mean of those, points
    conditions: int

    def note(self, what: str = "offline labels only (rules and classifier)",
             fix: str = PLAN_HINT) -> str:
        """The note beside offline rates; ``what``: which labels of the run it speaks of;
        ``fix``: how to correct them with human labels (a size that can succeed, or the plan)."""
        low, high = self.kappa_follow_up
        return (f"{what}: on models and people such labels were never fit to, the follow-up "
                f"rate they gave was off from people's by {self.mean_gap:.1f} points on average "
                f"and up to {self.max_gap:.0f} in one condition ({', '.join(self.groups)}; "
                f"kappa {low:.2f}-{high:.2f}, follow-up vs rest; docs/classifier.md). Correct it "
                f"with human labels: {fix}; or let a judge read the turns they are unsure of: "
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


@lru_cache(maxsize=4)
def offline_confusion(labeller: str = "context", path: Path = CARD_FILE) -> Confusion | None:
    """The follow-up confusion table of ``labeller`` summed over the held-out groups (None where
    the card lacks one): its error on sources it was never fit to, as one table."""
    try:
        folds = json.loads(path.read_text(encoding="utf-8"))["labellers"][labeller]
        tables = [fold["follow_up_confusion"] for fold in folds.values()]
        cells = [[sum(int(t[r][c]) for t in tables) for c in (0, 1)] for r in (0, 1)]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    if not tables or min(min(row) for row in cells) < 0:
        return None
    return (cells[0][0], cells[0][1]), (cells[1][0], cells[1][1])


@lru_cache(maxsize=4)
def offline_gap(labeller: str = "context", path: Path = CARD_FILE) -> float:
    """The card's typical per-condition rate gap of ``labeller`` on sources it was never fit
    to, as a fraction: the 75th percentile of ``|printed - adjudicated|`` over its conditions
    (the shipped cascade's where ``labeller`` has none). The plan of a human sample takes the
    rate people give that much nearer 50% than the confusion table predicts."""
    def gaps(name: str) -> list[float]:
        try:
            folds = json.loads(path.read_text(encoding="utf-8"))["labellers"][name]
            return sorted(abs(float(g)) for fold in folds.values() for g in fold.get("gaps", []))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []

    found = gaps(labeller) or gaps("context")
    if not found:
        return DEFAULT_GAP
    return found[min(len(found) - 1, round(0.75 * (len(found) - 1)))] / 100


DEFAULT_GAP = 0.07  # the shipped cascade's, where the card cannot be read
