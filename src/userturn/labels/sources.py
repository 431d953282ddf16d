"""In which order a run's label sources decide a turn: the one place that says so.

A turn's label is the first label among the run's sources, in order (``read_turns``). The
labelling stages (:mod:`.stages`), the judges' majority (:mod:`.majority`) and the evaluation after
training (:mod:`userturn.train.evaluate`) all take the order from :func:`source_order`.
"""

from __future__ import annotations

from typing import Sequence, cast

from userturn.errors import ConfigError
from userturn.records import LABELLERS, Labeller
from userturn.records import JudgeScopeName as JudgeScope

RULES = "rules"
CLASSIFIER = "classifier"
MAJORITY = "judges:majority"
OFFLINE = (RULES, CLASSIFIER)


def checked_labeller(name: object) -> Labeller:
    """``name`` as an offline labeller, or the one error every caller gives for another name."""
    if name not in LABELLERS:
        raise ConfigError(f"unknown labeller {name!r}: the labellers are {', '.join(LABELLERS)}")
    return cast(Labeller, name)


def source_order(labeller: Labeller, judges: Sequence[str] = (),
                 scope: JudgeScope = "undecided") -> list[str]:
    """The label sources of a run, in the order they decide a turn.

    - The rules come first, and only when the labeller uses them (``cascade``, ``rules``):
      their clear cases stand. A ``classifier`` run never brings them back.
    - Then the judges: one judge under its own name; two or more through their majority
      (``judges:majority``), so that no judge decides by being listed first. A source that is
      already the majority stays as it is.
    - The learned classifier comes last (``cascade``, ``classifier``): the judge is asked where
      the classifier is unsure, so its verdict goes before the classifier's guess.
    - With scope ``all`` the judges decide alone: they labelled every turn.
    """
    deciding = ([] if not judges else [judges[0]] if len(judges) == 1 else [MAJORITY])
    if deciding and scope == "all":
        return deciding
    rules = [RULES] if labeller in ("cascade", "rules") else []
    learned = [CLASSIFIER] if labeller in ("cascade", "classifier") else []
    return [*rules, *deciding, *learned]


def judge_sources(sources: Sequence[str]) -> list[str]:
    """The judge sources among a run's deciding ``sources`` (neither rules nor classifier)."""
    return [source for source in sources if source not in OFFLINE]
