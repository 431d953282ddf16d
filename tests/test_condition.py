"""The condition key: one typed value with one order, and every grouping of a run's turns by it
gives the groups the bare (model, answerer, dataset, perturbation, temperature) tuple gave."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import build_report_run

from userturn.labels.sources import CLASSIFIER, RULES
from userturn.records import Condition
from userturn.report.compute import build_report
from userturn.stats.summary import summarize
from userturn.store.turns import read_answers, read_turns

FIELDS = ("model", "answerer", "dataset", "perturbation", "temperature", "arm", "user_variant",
          "enable_thinking")


def test_conditions_sort_field_by_field_in_their_declared_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(Condition)) == FIELDS
    shuffled = [Condition("b", "self", "gsm", "none", 0.0),
                Condition("a", "self", "math", "none", 0.0),
                Condition("a", "reference", "math", "truncate", 1.0),
                Condition("a", "self", "gsm", "truncate", 0.0),
                Condition("a", "self", "gsm", "none", 1.0),
                Condition("a", "self", "gsm", "none", 0.0)]
    assert sorted(shuffled) == sorted(shuffled, key=dataclasses.astuple)
    assert sorted(shuffled)[:3] == [Condition("a", "reference", "math", "truncate", 1.0),
                                    Condition("a", "self", "gsm", "none", 0.0),
                                    Condition("a", "self", "gsm", "none", 1.0)]
    # The arm is last, and defaults to the opened arm: a run of one arm keeps its order and keys.
    assert Condition("a", "self", "gsm", "none", 0.0) == Condition("a", "self", "gsm", "none",
                                                                   0.0, "opened")
    assert sorted([Condition("a", "self", "gsm", "none", 1.0),
                   Condition("a", "self", "gsm", "none", 0.0, "continuation")])[0].temperature == 0
    # The variants are last too, with the defaults of a run without them; a variant sorts by the
    # name the tables print, after every row of its model, as when it was a model of its own.
    assert Condition("a", "self", "gsm", "none", 0.0) == Condition(
        "a", "self", "gsm", "none", 0.0, "opened", "native", "default")
    assert sorted([Condition("a", "self", "gsm", "none", 0.0, user_variant="warmup:1"),
                   Condition("a", "self", "math", "none", 0.0, enable_thinking="on"),
                   Condition("a", "self", "math", "none", 0.0)]) == [
        Condition("a", "self", "math", "none", 0.0),
        Condition("a", "self", "math", "none", 0.0, enable_thinking="on"),  # a[thinking=on]
        Condition("a", "self", "gsm", "none", 0.0, user_variant="warmup:1")]  # a[user=...]
    # A value: equal fields are the same key, and it cannot be changed under a dict.
    assert len({Condition("a", "self", "gsm", "none", 0.0), shuffled[-1]}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        shuffled[0].model = "c"  # type: ignore[misc]


def test_grouping_by_condition_matches_the_tuple_grouping(tmp_path: Path) -> None:
    store = build_report_run(tmp_path, ["fake/alpha", "fake/beta"])
    turns, answers, meta = read_turns(store), read_answers(store), store.meta()
    store.close()
    by_condition, by_tuple = defaultdict(list), defaultdict(list)
    for t in turns:
        by_condition[Condition.of(t)].append(t.key)
        by_tuple[tuple(getattr(t, name) for name in FIELDS)].append(t.key)
    assert {dataclasses.astuple(c): keys for c, keys in by_condition.items()} == by_tuple
    assert len(by_tuple) == 2 * 4 * 3  # models x (original + three perturbations) x temperatures

    # The summary has one row per condition, in the order it always had: by model, answerer
    # and dataset, each one's original context before its perturbations, then by temperature.
    rows = summarize(turns, answers, offline=[RULES, CLASSIFIER])
    old_order = sorted(by_tuple, key=lambda k: (*k[:3], k[3] != "none", *k[3:]))
    assert [tuple(getattr(r, name) for name in FIELDS) for r in rows] == old_order
    assert [r.turns for r in rows] == [len(by_tuple[k]) for k in old_order]

    # Each perturbation effect pairs a perturbed condition with its own original context: its
    # rates are those of the two tuple groups, on the items they share.
    report = build_report(turns, answers, folder=tmp_path / "run", meta=meta,
                          sources=["rules"])
    assert len(report.comparisons) == 2 * 3 * 3
    counted = {t.key: t for t in turns if t.counts_toward_rate}

    def hits(key: tuple) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = defaultdict(list)
        for k in by_tuple[key]:
            if k in counted:
                out[counted[k].item_id].append(counted[k].follow_up)
        return out

    for effect in report.comparisons:
        before = hits((effect.model, "self", effect.dataset, "none", effect.temperature,
                       "opened", "native", "default"))
        after = hits((effect.model, "self", effect.dataset, effect.perturbation,
                      effect.temperature, "opened", "native", "default"))
        shared = set(before) & set(after)
        assert effect.diff.items == len(shared)
        assert effect.diff.a.hits == sum(sum(before[i]) for i in shared)
        assert effect.diff.b.hits == sum(sum(after[i]) for i in shared)
    assert sorted(c for c, _ in report.joints) == [c for c, _ in report.joints]
    assert {c.perturbation for c, _ in report.joints} == {"none"}
