"""Each stage's own spec: the experiment composes the probe's plan, the engine and the labelling
plan under the keys users know; values are parsed once; a stored run reads back through the same
types; one labeller table says what each labeller brings."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import pytest

from userturn.config import Experiment, load_experiment
from userturn.errors import ConfigError
from userturn.labels.cascade import Cascade
from userturn.labels.classifier import LearnedClassifier
from userturn.labels.plan import JudgeSpec, LabellingPlan
from userturn.labels.rules import RulesClassifier
from userturn.labels.sources import LABELLERS, OfflineLabeller, labeller_named, run_labeller
from userturn.probe.engine import EngineSpec
from userturn.probe.perturb import Perturbation
from userturn.probe.plan import ProbePlan
from userturn.probe.user_variants import UserVariant
from userturn.settings import Composed, Part
from userturn.store.meta import RunMeta
from userturn.train.settings import Training


def test_the_experiment_is_its_three_specs_and_nothing_else():
    # Composition, visible in the type: three fields, each a stage's spec.
    assert {name: field.annotation for name, field in Experiment.model_fields.items()} == \
        {"plan": ProbePlan, "engine": EngineSpec, "labelling": LabellingPlan}
    parts = (ProbePlan, EngineSpec, LabellingPlan)
    names = [list(part.model_fields) for part in parts]
    # The settings a user writes are the specs' own, in their order, each with one owner.
    assert list(Experiment.setting_fields()) == [name for part in names for name in part]
    assert len(set(Experiment.setting_fields())) == sum(map(len, names))
    exp = Experiment(models=["tiny"], executor="ray", labeller="rules", judge_threshold=0.4)
    assert type(exp.plan) is ProbePlan and exp.plan.models == ["tiny"]
    assert type(exp.engine) is EngineSpec and exp.engine.executor == "ray"
    assert type(exp.labelling) is LabellingPlan and exp.labelling.judge_threshold == 0.4
    assert exp.plan.model_fields_set == {"models"}  # what was given, per spec
    assert exp.model_fields_set == {"plan", "engine", "labelling"}
    assert Experiment(limit=3).model_fields_set == {"plan"}
    assert list(Experiment.setting_fields())[:2] == ["models", "datasets"]  # --help: what first
    assert not hasattr(exp, "models")  # read through its spec: exp.plan.models


def test_an_experiment_of_specs_is_the_experiment_of_their_settings():
    plan = ProbePlan(models=["tiny"], limit=3)
    exp = Experiment(plan=plan, engine=EngineSpec(executor="ray"))
    assert exp == Experiment(models=["tiny"], limit=3, executor="ray")
    assert exp.plan is plan  # a spec is held, not copied or read again
    assert exp.model_dump(mode="json") == {**ProbePlan(models=["tiny"], limit=3).model_dump(
        mode="json"), **EngineSpec(executor="ray").model_dump(mode="json"),
        **LabellingPlan().model_dump(mode="json")}


def test_a_composed_experiment_is_refused_under_each_settings_own_name():
    for given, where in (({"judge_threshold": 9, "limit": 0}, "limit"),
                         ({"judge_threshold": 9}, "judge_threshold"),
                         ({"temperatures": [1, "x"]}, "temperatures.1"),
                         ({"plan": {"limit": 3}}, "plan"),  # not a key of the file
                         ({"limit": 3, "zz": 1}, "zz"),
                         ({"limit": True}, "config")):
        with pytest.raises(ConfigError, match=rf"^invalid config \({where}\): "):
            load_experiment(None, given)
    with pytest.raises(ValueError, match="limit is a setting of the plan given whole"):
        Experiment(plan=ProbePlan(), limit=3)
    # A stored experiment reads back the same, whatever part of it the run stored.
    stored = Experiment(limit=3, batch_size=2, judge="openai/a").model_dump(mode="json")
    assert Experiment.stored(stored).model_dump(mode="json") == stored
    assert Experiment.stored({"limit": 3}).lost_settings() == ["models", "datasets"]


def test_perturbations_and_variants_are_parsed_once_and_stored_as_their_specs():
    exp = load_experiment(None, {"perturbations": ["truncate:0.5", "empty"],
                                 "user_turn_variants": ["prefill:So"]})
    assert exp.plan.perturbations == [Perturbation("truncate", "0.5"), Perturbation("empty")]
    assert exp.plan is exp.plan  # held once, not rebuilt (or parsed again) per read
    assert exp.plan.user_turn_variants == [UserVariant("prefill", "So")]
    stored = exp.model_dump(mode="json")
    assert stored["perturbations"] == ["truncate:0.5", "empty"]
    assert stored["user_turn_variants"] == ["prefill:So"]
    assert ProbePlan.stored(stored) == exp.plan
    assert EngineSpec.stored(stored) == exp.engine


def test_a_stored_plan_reads_what_the_run_stored_and_says_what_it_cannot_read(tmp_path):
    plan = ProbePlan.stored({"limit": 3, "batch_size": 4, "judge": "openai/a", "gone": 1})
    assert plan.limit == 3 and plan.model_fields_set == {"limit"}
    with pytest.raises(ConfigError, match=r"stored experiment does not read: unknown "
                                          r"perturbation 'zzz'"):
        ProbePlan.stored({"perturbations": ["zzz"]})
    with pytest.raises(ConfigError, match=r"stored experiment does not read \(samples"):
        ProbePlan.stored({"samples": 0})
    # The classifier file was read when the run started, on the machine that ran it.
    missing = tmp_path / "elsewhere.json"
    assert LabellingPlan.stored({"classifier": str(missing)}).classifier == missing
    with pytest.raises(ConfigError, match="elsewhere.json"):
        load_experiment(None, {"classifier": str(missing)})
    # So was a user-turn variant's template: the stored run reads back without it.
    gone = tmp_path / "gone.jinja"
    plan = ProbePlan.stored({"user_turn_variants": [f"template:{gone}"]})
    assert [v.spec for v in plan.user_turn_variants] == [f"template:{gone}"]
    with pytest.raises(ConfigError, match="gone.jinja: file not found"):
        load_experiment(None, {"user_turn_variants": [f"template:{gone}"]})


def test_one_address_check_for_the_engine_and_one_list_rule():
    assert EngineSpec(base_url=["http://127.0.0.1:8000/v1"]).base_url == \
        "http://127.0.0.1:8000/v1"
    for bad in (["http://127.0.0.1:1/v1", "ftp://x"], "http://a:0/", []):
        with pytest.raises(ConfigError, match="base_url"):
            load_experiment(None, {"base_url": bad})


def test_the_labeller_table_names_every_labeller_and_how_it_labels_a_case():
    assert list(LABELLERS) == ["cascade", "classifier", "rules"]
    assert isinstance(LABELLERS["rules"].case_labeller(), RulesClassifier)
    assert isinstance(LABELLERS["cascade"].case_labeller(), Cascade)
    assert isinstance(LABELLERS["classifier"].case_labeller(), LearnedClassifier)
    # What each brings and which turns each source reads: the cascade's classifier only reads
    # what the rules leave undecided.
    assert [(type(step.labeller), step.reads) for step in LABELLERS["cascade"].build()] == [
        (RulesClassifier, "all"), (LearnedClassifier, "undecided")]
    assert [type(step.labeller) for step in LABELLERS["rules"].build()] == [RulesClassifier]
    # A classifier run's rules are labelled (its judge asks where they abstain), never decide.
    assert [(type(step.labeller), step.reads, step.decides)
            for step in LABELLERS["classifier"].build()] == [
        (RulesClassifier, "all", False), (LearnedClassifier, "all", True)]
    # A row whose order contradicts itself stops the import, saying which row.
    rules, learned = LABELLERS["cascade"].brings
    for bad in ((learned, rules), (replace(rules, reads="undecided"),), ()):
        with pytest.raises(ValueError, match="labeller 'odd': its first deciding source must"):
            OfflineLabeller("odd", "", bad)
    for bad in ("judge", None, 3):
        with pytest.raises(ConfigError, match=r"unknown labeller .*: the labellers are "
                                              r"cascade, classifier, rules"):
            labeller_named(bad)


@pytest.mark.parametrize(("meta", "expected"), [
    (RunMeta(labeller="classifier", label_sources=["rules"]), "classifier"),  # as recorded
    (RunMeta(label_sources=["rules", "judge:x", "classifier"]), "cascade"),
    (RunMeta(label_sources=["judge:x"]), "rules"),
])
def test_a_runs_labeller_is_the_recorded_one_else_what_its_sources_show(meta, expected):
    assert run_labeller(meta).name == expected


def test_judges_are_built_in_one_place_with_their_concurrency():
    spec = JudgeSpec(judge=["openai/a", "openai/b", "openai/a"],
                     judge_base_url="http://127.0.0.1:9/v1", judge_concurrency=3)
    judges = spec.build_judges()
    assert [judge.name for judge in judges] == ["judge:openai/a@rubric1",
                                                "judge:openai/b@rubric1"]
    assert {judge.concurrency for judge in judges} == {3}
    with pytest.raises(ConfigError, match="unknown judge 'openai/'"):
        JudgeSpec(judge="openai/").build_judges()


def test_a_composed_model_gives_each_setting_one_owner():
    class Twice(Composed):
        training: Training
        probe: Annotated[ProbePlan, Part(only=("seed", "limit"))]

    with pytest.raises(TypeError, match="Twice: seed in more than one part"):
        Twice()

    class NotASpec(Composed):
        plan: ProbePlan
        note: str = ""

    with pytest.raises(TypeError, match="NotASpec.note is not a spec"):
        NotASpec()
