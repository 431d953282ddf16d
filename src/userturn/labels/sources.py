"""The offline labellers, and in which order a run's label sources decide: the one table.

``LABELLERS`` says, for each labeller a run or a command can name, which offline sources it
brings (the rules, the learned classifier on every turn or only on the rules' undecided ones),
how it labels a single case, and where each source stands in the order. A turn's label is the
first label among the run's sources, in order (``read_turns``). The labelling stages
(:mod:`.stages`), the judges' majority (:mod:`.majority`), ``userturn classify``, the notebook API,
the Inspect scorer, the lm-eval import and the evaluation after training all take their labeller
from here (:func:`labeller_named`: the one "unknown labeller" error).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Sequence

from userturn.errors import ConfigError
from userturn.records import CLASSIFIER_SOURCE, Labeller
from userturn.records import JudgeScopeName as JudgeScope

if TYPE_CHECKING:
    from userturn.labels.classifier import Labelling, LearnedClassifier
    from userturn.store.meta import RunMeta

RULES = "rules"
CLASSIFIER = CLASSIFIER_SOURCE
"""The shipped classifier's source; other parameters are other sources: ``classifier:form`` (the
shipped form-only set), ``classifier:STEM-DIGEST`` (a file of the user's), so that labelling a
run with other parameters never passes their labels off as the shipped classifier's."""
MAJORITY = "judges:majority"


def is_classifier(source: str) -> bool:
    """Whether ``source`` is a learned classifier's (the shipped one or other parameters)."""
    return source == CLASSIFIER or source.startswith(CLASSIFIER + ":")


def is_offline(source: str) -> bool:
    """Whether ``source`` reads turns offline: the rules or a learned classifier."""
    return source == RULES or is_classifier(source)


def classifier_of(sources: Sequence[str]) -> str:
    """The learned classifier's source among a run's ``sources`` (the shipped one's name where
    none is)."""
    return next((source for source in sources if is_classifier(source)), CLASSIFIER)


@dataclass(frozen=True)
class OfflineLabeller:
    """One offline labeller: what it brings and where each of its sources decides."""

    name: Labeller
    rules: bool
    """The rules' clear cases stand (they come first in the order)."""
    learned: Literal["undecided", "all"] | None
    """The learned classifier labels the turns the rules leave undecided, every turn, or none."""

    def sources(self, judges: Sequence[str] = (), scope: JudgeScope = "undecided",
                classifier: str = CLASSIFIER) -> list[str]:
        """The label sources of a run, in the order they decide a turn (``classifier``: the
        learned classifier's source, :func:`classifier_source`).

        - The rules come first, and only when the labeller uses them (``cascade``, ``rules``):
          their clear cases stand. A ``classifier`` run never brings them back.
        - Then the judges: one judge under its own name; two or more through their majority
          (``judges:majority``), so that no judge decides by being listed first. A source that is
          already the majority stays as it is.
        - The learned classifier comes last (``cascade``, ``classifier``): the judge is asked
          where the classifier is unsure, so its verdict goes before the classifier's guess.
        - With scope ``all`` the judges come first: they labelled every turn. The offline
          sources follow them, so that where a verdict failed the turn keeps its offline label
          (a failed verdict never stands in for a label).
        """
        deciding = ([] if not judges else [judges[0]] if len(judges) == 1 else [MAJORITY])
        rules, learned = [RULES] if self.rules else [], [classifier] if self.learned else []
        if deciding and scope == "all":
            return [*deciding, *rules, *learned]
        return [*rules, *deciding, *learned]

    def learned_classifier(self, path: Path | None = None) -> LearnedClassifier | None:
        """The classifier this labeller uses (its parameters from ``path``, default the
        shipped ones), loaded now, so a bad file fails before any labelling; None for rules."""
        if self.learned is None:
            return None
        from userturn.labels.classifier import LearnedClassifier

        return LearnedClassifier(path=path) if path else LearnedClassifier()

    def classifier_source(self, path: Path | None = None) -> str:
        """The source the learned classifier's labels are stored under, with its parameters
        from ``path`` (default the shipped ones)."""
        from userturn.labels.classifier import source_name

        return source_name(path) if self.learned else CLASSIFIER

    def case_labeller(self, path: Path | None = None) -> Labelling:
        """How this labeller labels one case outside a run (``userturn classify``, the API)."""
        from userturn.labels.classifier import Cascade
        from userturn.labels.rules import RulesClassifier

        learned = self.learned_classifier(path)
        if learned is None:
            return RulesClassifier()
        return Cascade(learned) if self.rules else learned


LABELLERS: dict[str, OfflineLabeller] = {labeller.name: labeller for labeller in (
    OfflineLabeller("cascade", rules=True, learned="undecided"),
    OfflineLabeller("classifier", rules=False, learned="all"),
    OfflineLabeller("rules", rules=True, learned=None),
)}


def labeller_named(name: object) -> OfflineLabeller:
    """The offline labeller called ``name``, or the one error every caller gives for another."""
    if not isinstance(name, str) or name not in LABELLERS:
        raise ConfigError(f"unknown labeller {name!r}: the labellers are {', '.join(LABELLERS)}")
    return LABELLERS[name]


def run_labeller(meta: RunMeta) -> OfflineLabeller:
    """A run's offline labeller: the one it recorded, else (a run labelled before it was
    recorded) the one whose offline sources its label sources show."""
    if meta.labeller is not None:
        return labeller_named(meta.labeller)
    offline = [CLASSIFIER if is_classifier(source) else source
               for source in meta.label_sources if is_offline(source)]
    return next((labeller for labeller in LABELLERS.values()
                 if labeller.sources() == offline), LABELLERS["rules"])


def judge_sources(sources: Sequence[str]) -> list[str]:
    """The judge sources among a run's deciding ``sources`` (neither rules nor classifier)."""
    return [source for source in sources if not is_offline(source)]
