"""The offline labellers, and in which order a run's label sources decide: the one table.

``LABELLERS`` holds one row per labeller a run or a command can name (``--labeller``, the
``labeller:`` of an experiment, what a run records): the offline sources it brings, each with
the name its labels are stored under, how it is built, which turns it reads (every turn, or the
ones the sources before it left undecided: :mod:`.cascade`) and whether its verdicts stand
before the judges' or yield to them. Adding a labeller is its class and one row here. A turn's
label is the first label among the run's sources, in order (``read_turns``). The labelling
stages (:mod:`.stages`), the judges' majority (:mod:`.majority`), ``userturn classify``, the
notebook API, the Inspect scorer, the lm-eval import and the evaluation after training all take
their labeller from here (:func:`labeller_named`: the one "unknown labeller" error). The source
names themselves are written once, in :mod:`userturn.records`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Sequence

from userturn.errors import ConfigError
from userturn.labels.cascade import Cascade, Labelling, Reads, Step
from userturn.records import CLASSIFIER_SOURCE as CLASSIFIER
from userturn.records import MAJORITY_SOURCE as MAJORITY
from userturn.records import RULES_SOURCE as RULES
from userturn.records import JudgeScopeName as JudgeScope
from userturn.records import Labeller, source_family

if TYPE_CHECKING:
    from userturn.store.meta import RunMeta

Decides = Literal["first", "last", "never"]
"""Where an offline source decides a turn, against the judges (:attr:`OfflineSource.decides`)."""


def is_classifier(source: str) -> bool:
    """Whether ``source`` is a learned classifier's (the shipped one or other parameters)."""
    return source_family(source) == CLASSIFIER


def is_offline(source: str) -> bool:
    """Whether ``source`` reads turns offline: a source some labeller of the table brings (the
    rules, a learned classifier), under its own name or another parameters' variant of it."""
    return source_family(source) in {offline.family for labeller in LABELLERS.values()
                                     for offline in labeller.brings}


def classifier_of(sources: Sequence[str]) -> str:
    """The learned classifier's source among a run's ``sources`` (the shipped one's name where
    none is)."""
    return next((source for source in sources if is_classifier(source)), CLASSIFIER)


@dataclass(frozen=True)
class OfflineSource:
    """One offline source a labeller brings."""

    family: str
    """The source its labels are stored under (:mod:`userturn.records` names them)."""
    build: Callable[[Path | None], Labelling]
    """How it is built, given the ``--classifier`` parameters (None: the shipped ones)."""
    reads: Reads
    """Which turns it labels: every one, or those the sources before it left undecided."""
    decides: Decides
    """Where it decides a turn: ``first``, before the judges, who are asked where it abstains
    (its clear cases stand: the rules); ``last``, after them, a judge's verdict going before its
    guess (the learned classifier); ``never``: labelled for what else reads it (a
    ``classifier`` run's rules tell its judge which turns they leave undecided)."""
    variant: Callable[[Path], str] | None = None
    """Where it takes the ``--classifier`` parameters: the source name they are stored under
    (``classifier:form``, ``classifier:STEM-DIGEST``; the shipped ones keep ``family``)."""

    def source(self, path: Path | None = None) -> str:
        """The source its labels are stored under, with the parameters from ``path``."""
        return self.variant(path) if path is not None and self.variant is not None \
            else self.family


@dataclass(frozen=True)
class OfflineLabeller:
    """One offline labeller: its name, what it says it does (``--labeller``'s help), and the
    offline sources it brings, in the order they decide."""

    name: Labeller
    summary: str
    brings: tuple[OfflineSource, ...]

    def __post_init__(self) -> None:
        # The cascade needs a first deciding source that reads every turn, and a source that
        # decides before the judges cannot come after one that decides after them.
        deciding = [offline for offline in self.brings if offline.decides != "never"]
        places = [offline.decides for offline in deciding]
        ranks = [("first", "last").index(place) for place in places]
        if not deciding or deciding[0].reads != "all" or ranks != sorted(ranks):
            raise ValueError(f"labeller {self.name!r}: its first deciding source must read "
                             "every turn, and the sources that decide first come first")

    def sources(self, judges: Sequence[str] = (), scope: JudgeScope = "undecided",
                classifier: str = CLASSIFIER) -> list[str]:
        """The label sources of a run, in the order they decide a turn (``classifier``: the
        source of the one that takes ``--classifier`` parameters, :meth:`classifier_source`).

        - The sources that decide ``first`` come first (the rules, in ``cascade`` and
          ``rules``): their clear cases stand. A ``classifier`` run never lets the rules decide.
        - Then the judges: one judge under its own name; two or more through their majority
          (``judges:majority``), so that no judge decides by being listed first. A source that is
          already the majority stays as it is.
        - The sources that decide ``last`` come last (the learned classifier, in ``cascade`` and
          ``classifier``): the judge is asked where the classifier is unsure, so its verdict
          goes before the classifier's guess.
        - With scope ``all`` the judges come first: they labelled every turn. The offline
          sources follow them, so that where a verdict failed the turn keeps its offline label
          (a failed verdict never stands in for a label).
        """
        deciding = ([] if not judges else [judges[0]] if len(judges) == 1 else [MAJORITY])
        names = {place: [classifier if offline.variant else offline.family
                         for offline in self.brings if offline.decides == place]
                 for place in ("first", "last")}
        if deciding and scope == "all":
            return [*deciding, *names["first"], *names["last"]]
        return [*names["first"], *deciding, *names["last"]]

    def screens(self) -> list[str]:
        """The sources whose clear cases a judge with scope ``undecided`` is not asked about:
        all but those that decide last (the rules, in the shipped labellers, even where they
        never decide: a ``classifier`` run's judge is asked what the rules leave undecided)."""
        return [offline.family for offline in self.brings if offline.decides != "last"]

    def build(self, path: Path | None = None, learned: Labelling | None = None, *,
              deciding: bool = False) -> list[Step]:
        """Its sources, built now (a bad parameters file fails before any labelling), each with
        the turns it reads (``deciding``: only those that decide). ``learned``: a source built
        by the caller (a classifier trained in memory) in the place of the one that takes
        parameters."""
        return [Step(learned if learned is not None and offline.variant else
                     offline.build(path), offline.reads, offline.decides != "never")
                for offline in self.brings if not deciding or offline.decides != "never"]

    def classifier_source(self, path: Path | None = None) -> str:
        """The source the parameters from ``path`` label under (default the shipped ones)."""
        return next((offline.source(path) for offline in self.brings if offline.variant),
                    CLASSIFIER)

    def case_labeller(self, path: Path | None = None,
                      learned: Labelling | None = None) -> Labelling:
        """How this labeller labels one case outside a run (``userturn classify``, the API):
        its one deciding source, or the cascade of them."""
        steps = self.build(path, learned, deciding=True)
        return steps[0].labeller if len(steps) == 1 else Cascade(steps)


def build_rules(path: Path | None) -> Labelling:
    from userturn.labels.rules import RulesClassifier

    return RulesClassifier()


def build_classifier(path: Path | None) -> Labelling:
    from userturn.labels.classifier import LearnedClassifier

    return LearnedClassifier(path=path) if path else LearnedClassifier()


def classifier_variant(path: Path) -> str:
    from userturn.labels.classifier import source_name

    return source_name(path)


THE_RULES = OfflineSource(RULES, build_rules, "all", decides="first")
LEARNED = OfflineSource(CLASSIFIER, build_classifier, "undecided", decides="last",
                        variant=classifier_variant)
"""The learned classifier where the rules abstain: each turn it reads costs a reading in
context. ``replace(LEARNED, reads="all")`` reads every turn."""

LABELLERS: dict[str, OfflineLabeller] = {labeller.name: labeller for labeller in (
    OfflineLabeller("cascade", "rules, then the classifier", (THE_RULES, LEARNED)),
    OfflineLabeller("classifier", "", (replace(THE_RULES, decides="never"),
                                       replace(LEARNED, reads="all"))),
    OfflineLabeller("rules", "", (THE_RULES,)),
)}
DEFAULT_LABELLER = "cascade"


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
    offline = [source_family(source) for source in meta.label_sources if is_offline(source)]
    return next((labeller for labeller in LABELLERS.values()
                 if labeller.sources() == offline), LABELLERS["rules"])


def judge_sources(sources: Sequence[str]) -> list[str]:
    """The judge sources among a run's deciding ``sources`` (neither rules nor classifier)."""
    return [source for source in sources if not is_offline(source)]
