"""Which label source decides a turn, in which order, for every labeller and judge setting; and
that every labelling stage shows a classifier the same case (``Turn.case``)."""

from __future__ import annotations

from contextlib import closing

import pytest
from helpers import experiment, load_family, run_scripted, thinking_experiment, undecided_script
from openai_fake import FakeOpenAI

from userturn.backends.fake import ScriptedBackend
from userturn.labels.sources import LABELLERS
from userturn.labels.stages import label_with
from userturn.probe.pipeline import run_experiment
from userturn.records import Case, Label, Request
from userturn.store.database import RunStore
from userturn.store.turns import read_turns
from userturn.train.heldout import HeldOutRules

A, B = "judge:openai/a@rubric1", "judge:openai/b@rubric1"


@pytest.mark.parametrize(("labeller", "judges", "scope", "expected"), [
    ("cascade", [], "undecided", ["rules", "classifier"]),
    ("rules", [], "undecided", ["rules"]),
    ("classifier", [], "undecided", ["classifier"]),
    ("cascade", [A], "undecided", ["rules", A, "classifier"]),
    ("cascade", [A], "uncertain", ["rules", A, "classifier"]),
    ("rules", [A], "undecided", ["rules", A]),
    ("classifier", [A], "undecided", [A, "classifier"]),
    ("cascade", [A, B], "undecided", ["rules", "judges:majority", "classifier"]),
    ("classifier", [A, B], "undecided", ["judges:majority", "classifier"]),
    ("rules", [A, B], "undecided", ["rules", "judges:majority"]),
    # scope all: the judges decide every turn, the offline sources only where a verdict failed
    ("cascade", [A], "all", [A, "rules", "classifier"]),
    ("classifier", [A, B], "all", ["judges:majority", "classifier"]),
    ("cascade", ["judges:majority"], "undecided", ["rules", "judges:majority", "classifier"]),
])
def test_source_order(labeller, judges, scope, expected):
    assert LABELLERS[labeller].sources(judges, scope) == expected


def judged_run(gsm_file, tmp_path, judges: list[str], labeller: str) -> RunStore:
    with FakeOpenAI() as fake:
        fake.verdict = lambda messages: {"label": "meta", "rationale": "Narrates."}
        exp = experiment(gsm_file, tmp_path, labeller=labeller, judge=judges,
                         judge_base_url=fake.url)
        return run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})


def test_a_classifier_run_with_one_judge_never_lets_the_rules_decide(gsm_file, tmp_path):
    store = judged_run(gsm_file, tmp_path, ["openai/a"], "classifier")
    assert store.label_sources() == [A, "classifier"]
    turns = read_turns(store)
    assert {t.label_source for t in turns} == {A, "classifier"}
    # The greedy "Thanks!" is the rules' clear case: the judge was not asked, the classifier
    # decides it (the rules labelled it too, but they are not this run's labeller).
    greedy = [t for t in turns if t.temperature == 0]
    assert {t.label_source for t in greedy} == {"classifier"}


def test_a_classifier_run_with_two_judges_puts_their_majority_first(gsm_file, tmp_path):
    store = judged_run(gsm_file, tmp_path, ["openai/a", "openai/b"], "classifier")
    assert store.label_sources() == ["judges:majority", "classifier"]
    turns = read_turns(store)
    assert "rules" not in {t.label_source for t in turns}
    sampled = [t for t in turns if t.temperature > 0]
    assert {(t.label, t.label_source) for t in sampled} == {("meta", "judges:majority")}


def test_relabelling_a_judged_run_keeps_the_majority_in_its_place(gsm_file, tmp_path):
    from userturn.labels.stages import label_turns

    store = judged_run(gsm_file, tmp_path, ["openai/a", "openai/b"], "cascade")
    assert store.label_sources() == ["rules", "judges:majority", "classifier"]
    label_turns(store, "classifier")
    assert store.label_sources() == ["judges:majority", "classifier"]
    assert store.meta().labeller == "classifier"


class Seen:
    """A labeller that records what it was shown."""

    name, version = "seen", "1"

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def classify(self, case: Case) -> Label:
        self.cases.append(case)
        return Label(None, source=self.name)


def thoughtful(request: Request) -> str:
    """User turns that think first (the thinking reads as narration, the visible turn asks)."""
    if request.prompt.endswith("<|im_start|>user\n"):
        return "<think>\nThe user is asking something.\n</think>\n\nWhy 6?"
    return "The answer is 5."


def test_labellers_see_the_visible_turn_with_the_thinking_apart(gsm_file, tmp_path):
    """The post-training evaluation labels through the same stage as the run, so its held-out
    rules see what every classifier sees: the visible turn, its thinking apart."""
    template = load_family("qwen3")
    template = template.__class__(template.source, "fake/qwen3", None, "<|im_end|>")
    backend = ScriptedBackend(thoughtful, spec="fake/qwen3", template=template)
    store = run_experiment(thinking_experiment(gsm_file, tmp_path / "run", user_max_tokens=64),
                           backends={"fake/qwen3": backend})
    seen = Seen()
    header = "<|im_start|>assistant"
    added = label_with(store, [seen, HeldOutRules()], {"fake/qwen3": header})
    turns = read_turns(store, "heldout-rules")
    assert added == 2 * len(turns) == 2 * 3
    assert {(c.user_turn, c.raw_user_turn, c.assistant_header) for c in seen.cases} == {
        ("Why 6?", "Why 6?", header)}
    assert {c.thinking for c in seen.cases} == {"The user is asking something."}
    assert all({"seen", "heldout-rules"} <= {lab.source for lab in t.labels} for t in turns)
    assert label_with(store, [seen, HeldOutRules()], {"fake/qwen3": header}) == 0  # cached


class Hedges:
    """A labeller kind the package does not have: a turn that says the user is unsure is a
    follow-up; it leaves every other turn undecided."""

    name, version = "hedges", "1"

    def classify(self, case: Case) -> Label:
        if "not sure" in case.user_turn:
            return Label("follow_up", self.name, "says it is unsure")
        return Label(None, self.name, "no hedge")


def test_a_new_kind_of_labeller_is_one_row_of_the_table(gsm_file, tmp_path, monkeypatch, capsys):
    """The row brings the new source first and the rules on what it leaves undecided: a run
    (`labeller: hedges`) and `userturn label --labeller hedges` run it through the cascade and
    record its sources; the report, `userturn classify` and the API take it; no other file."""
    from dataclasses import replace

    import userturn
    from userturn.cli.main import main
    from userturn.labels.sources import THE_RULES, OfflineLabeller, OfflineSource

    row = OfflineLabeller("hedges", "hedges, then the rules", (
        OfflineSource("hedges", lambda path: Hedges(), "all", decides="first"),
        replace(THE_RULES, reads="undecided")))
    monkeypatch.setitem(LABELLERS, "hedges", row)
    store = run_scripted(experiment(gsm_file, tmp_path, labeller="hedges"),
                         ScriptedBackend(undecided_script))
    assert (store.meta().labeller, store.label_sources()) == ("hedges", ["hedges", "rules"])
    turns = read_turns(store)
    store.close()
    hedged = [t for t in turns if "not sure" in t.user_turn]
    assert hedged and len(hedged) < len(turns)
    for turn in turns:  # the hedge decides where it finds one, the rules elsewhere, alone
        assert (turn.label, turn.label_source) == (
            ("follow_up", "hedges") if turn in hedged else ("generic", "rules"))
        assert {lab.source for lab in turn.labels} == ({"hedges"} if turn in hedged else
                                                       {"hedges", "rules"})

    capsys.readouterr()
    with pytest.warns(UserWarning, match="it is now labelled by rules"):
        assert main(["label", str(store.folder), "--labeller", "rules"]) == 0
    assert f"{len(hedged)} label(s) added (rules)" in capsys.readouterr().out
    with pytest.warns(UserWarning, match="it is now labelled by hedges, then rules"):
        assert main(["label", str(store.folder), "--labeller", "hedges"]) == 0
    assert "0 label(s) added (hedges); nothing generated" in capsys.readouterr().out
    with closing(RunStore.read(store.folder)) as again:
        assert [(t.label, t.label_source) for t in read_turns(again)] == [
            (t.label, t.label_source) for t in turns]

    # A judge is asked what the sources that decide first leave undecided: here, nothing.
    with closing(judged_run(gsm_file, tmp_path / "judged", ["openai/a"], "hedges")) as judged:
        assert not any(lab.source == A for t in read_turns(judged) for lab in t.labels)

    # One case at a time, the same cascade: the hedge, else the rules.
    labels = userturn.classify([Case("q", "a", "I am not sure."), Case("q", "a", "Thanks!")],
                               labeller="hedges")
    assert [(lab.label, lab.source) for lab in labels] == [("follow_up", "hedges"),
                                                          ("generic", "rules")]
    with pytest.raises(SystemExit) as refused:  # argparse's refusal names the new row too
        main(["classify", str(tmp_path / "none.jsonl"), "--labeller", "nope"])
    assert refused.value.code == 2 and "hedges" in capsys.readouterr().err
