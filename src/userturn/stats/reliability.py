"""Agreement statistics beside Cohen's kappa, for judging a labeller like an instrument.

Follow-ups are rare under greedy decoding, and at low prevalence kappa is misleading: two raters
that agree on 98% of turns can have a kappa near 0, because chance agreement is already high.
So ``userturn agreement`` also gives:

- :func:`gwet_ac1`: Gwet's AC1, ``(p_o - p_e) / (1 - p_e)`` with chance agreement
  ``p_e = 1/(q-1) * sum_k pi_k (1 - pi_k)``, ``pi_k`` the mean of the two raters' shares of
  label ``k`` and ``q`` the number of labels in the scale; stable at low prevalence.
- :func:`pabak`: prevalence- and bias-adjusted kappa, ``(q p_o - 1) / (q - 1)``: kappa with
  uniform chance agreement ``1/q``.
- :func:`alpha`: Krippendorff's alpha (nominal), for any number of raters and missing labels,
  from the ``krippendorff`` package; here over the people alone and over everyone.
- :func:`per_label`: precision, recall and F1 per label, the reference rater in rows (the one
  computation of them: ``userturn agreement``, the classifier's evaluation and this module).
- :func:`constant_baseline`: what a labeller that always says the reference's most common label
  scores (its observed agreement; its kappa is 0 by construction), the floor a labeller must beat.

``q`` is the scale's size (the seven labels), so a rarely used label still counts as a possible
answer. All functions take ``(label_a, label_b)`` pairs as :mod:`.agreement` does and return NaN
on empty input.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from userturn.records import LABELS, Turn

Pair = tuple[str, str]
_NAN = float("nan")


def _observed(pairs: Sequence[Pair]) -> float:
    return sum(a == b for a, b in pairs) / len(pairs)


def gwet_ac1(pairs: Sequence[Pair], labels: Sequence[str] = LABELS) -> float:
    if not pairs or len(labels) < 2:
        return _NAN
    n = len(pairs)
    counts = Counter(a for a, _ in pairs) + Counter(b for _, b in pairs)
    shares = [counts[label] / (2 * n) for label in labels]
    chance = sum(p * (1 - p) for p in shares) / (len(labels) - 1)
    return (_observed(pairs) - chance) / (1 - chance) if chance < 1 else _NAN


def pabak(pairs: Sequence[Pair], labels: Sequence[str] = LABELS) -> float:
    if not pairs or len(labels) < 2:
        return _NAN
    q = len(labels)
    return (q * _observed(pairs) - 1) / (q - 1)


def alpha(ratings: Mapping[str, Mapping[str, str | None]],
          labels: Sequence[str] = LABELS) -> float:
    """Krippendorff's alpha (nominal) of ``rater -> {turn key -> label}``: every rater a row,
    every turn a column, a missing or None label missing. NaN with fewer than 2 raters or no
    turn rated twice (the package needs pairable values)."""
    import krippendorff  # optional: the 'stats' extra

    raters = [r for r in ratings.values() if any(v is not None for v in r.values())]
    keys = sorted({k for r in raters for k, v in r.items() if v is not None})
    index = {label: i for i, label in enumerate(labels)}
    data = [[float(index[str(r[k])]) if r.get(k) is not None else float("nan") for k in keys]
            for r in raters]
    pairable = sum(1 for j in range(len(keys))
                   if sum(1 for row in data if row[j] == row[j]) >= 2)
    if len(raters) < 2 or not pairable:
        return _NAN
    values = {v for row in data for v in row if v == v}
    if len(values) < 2:
        return _NAN  # one value everywhere: no disagreement is possible to measure
    return float(krippendorff.alpha(reliability_data=data, level_of_measurement="nominal",
                                    value_domain=list(range(len(labels)))))


def per_label(pairs: Sequence[Pair], labels: Sequence[str] = LABELS) -> dict[str, dict[str, Any]]:
    """Per label, with rater A as the reference: ``{"precision", "recall", "f1", "support"}``.

    ``support``: turns A gave the label; ``recall``: the share of those B also gave it;
    ``precision``: the share of B's uses of the label that A agrees with. A ratio with a zero
    denominator is NaN (B never used the label, or A never did), and so is F1 then; F1 is 0 when
    both are 0. Only labels used by at least one rater are listed, in the order of ``labels``."""
    support = Counter(a for a, _ in pairs)
    predicted = Counter(b for _, b in pairs)
    hits = Counter(a for a, b in pairs if a == b)
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        if not support[label] and not predicted[label]:
            continue
        precision = hits[label] / predicted[label] if predicted[label] else _NAN
        recall = hits[label] / support[label] if support[label] else _NAN
        f1 = (_NAN if precision != precision or recall != recall
              else 2 * precision * recall / (precision + recall) if precision + recall else 0.0)
        out[label] = {"precision": precision, "recall": recall, "f1": f1,
                      "support": support[label]}
    return out


def constant_baseline(pairs: Sequence[Pair]) -> tuple[str | None, float]:
    """The reference's most common label and the agreement of always answering it."""
    if not pairs:
        return None, _NAN
    label, count = Counter(a for a, _ in pairs).most_common(1)[0]
    return label, count / len(pairs)


def ratings_of(turns: Sequence[Turn]) -> dict[str, dict[str, str | None]]:
    """``source -> {turn key -> label}`` of every stored label of ``turns``."""
    out: dict[str, dict[str, str | None]] = {}
    for turn in turns:
        for label in turn.labels:
            out.setdefault(label.source, {})[turn.key] = label.label
    return out


class Paired(Protocol):
    """Two sources' agreement on the turns both labelled (an
    :class:`~userturn.stats.agreement.Agreement`, read only)."""

    @property
    def a(self) -> str: ...
    @property
    def b(self) -> str: ...
    @property
    def n(self) -> int: ...
    @property
    def kappa(self) -> float: ...
    @property
    def ac1(self) -> float: ...


@dataclass(frozen=True)
class AgainstPeople:
    """A labeller against one person: ``kappa`` and ``ac1`` on the ``n`` turns both labelled,
    beside the people's own range of kappa with each other (``human_low`` to ``human_high``,
    NaN where fewer than two people labelled the same turns). ``in_range``: the labeller's kappa
    is at least the lowest people's (None where there is no people's range)."""

    labeller: str
    human: str
    n: int
    kappa: float
    ac1: float
    human_low: float
    human_high: float
    in_range: bool | None


def against_people(results: Sequence[Paired]) -> list[AgainstPeople]:
    """Each labeller (any non-human source) against each person, beside the people's agreement
    with each other: a labeller is as good as a person when its kappa falls in their range."""
    human = [r for r in results if r.n >= 2 and r.a.startswith("human:")
             and r.b.startswith("human:")]
    spread = [r.kappa for r in human if r.kappa == r.kappa]
    rows = []
    for r in results:
        people = [s for s in (r.a, r.b) if s.startswith("human:")]
        if r.n < 2 or len(people) != 1:
            continue
        rows.append(AgainstPeople(
            labeller=r.b if people[0] == r.a else r.a, human=people[0], n=r.n, kappa=r.kappa,
            ac1=r.ac1, human_low=min(spread) if spread else _NAN,
            human_high=max(spread) if spread else _NAN,
            in_range=(min(spread) <= r.kappa) if spread else None))
    return rows
