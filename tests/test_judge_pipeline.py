"""The judge inside a run and on a finished run, against a real local OpenAI-compatible server."""

from __future__ import annotations

import sqlite3

from helpers import GSM_ITEMS, GSM_SAMPLES, experiment, undecided_script
from openai_fake import Drop, FakeOpenAI

from userturn import load_run
from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.probe.pipeline import run_experiment
from userturn.store.turns import read_turns


def generations(folder) -> int:
    with sqlite3.connect(folder / "userturn.db") as db:
        return db.execute("SELECT COUNT(*) FROM generations").fetchone()[0]


def test_run_with_judge_sends_only_undecided_turns(gsm_file, tmp_path):
    with FakeOpenAI() as fake:
        fake.verdict = lambda messages: {"label": "new_query", "rationale": "Ignores the answer."}
        exp = experiment(gsm_file, tmp_path, judge="openai/judge-a", judge_base_url=fake.url)
        store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)})
        assert len(fake.requests) == GSM_ITEMS * GSM_SAMPLES  # the greedy "Thanks!" turns are rules' own
    greedy, sampled = load_run(store).summary()
    assert greedy.labels == {"generic": GSM_ITEMS}
    assert sampled.labels == {"new_query": GSM_ITEMS * GSM_SAMPLES} and sampled.undecided == 0
    turn = next(t for t in read_turns(store) if t.temperature > 0)
    assert turn.label_source == "judge:openai/judge-a@rubric1"
    assert turn.rationale == "Ignores the answer."
    # The judge comes between the rules' clear cases and the classifier's labels.
    assert store.label_sources() == ["rules", "judge:openai/judge-a@rubric1", "classifier"]
    # Both labels are stored: the rules' undecided one and the judge's.
    sources: dict[str, dict[str, str | None]] = {}
    for turn in read_turns(store):
        for label in turn.labels:
            sources.setdefault(label.source, {})[turn.key] = label.label
    assert set(sources) == {"rules", "judge:openai/judge-a@rubric1", "classifier"}
    assert all(label is None for key, label in sources["rules"].items()
               if key in sources["judge:openai/judge-a@rubric1"])


def test_rejudging_a_finished_run_generates_nothing_and_is_cached(gsm_file, tmp_path, capsys):
    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    before = generations(exp.plan.output)
    with FakeOpenAI() as fake:
        fake.verdict = lambda messages: {"label": "follow_up", "rationale": "Reacts to it."}
        code = main(["judge", str(exp.plan.output), "--judge", "openai/judge-b", "--base-url", fake.url,
                     "--scope", "all"])
        assert code == 0 and len(fake.requests) == GSM_ITEMS * (1 + GSM_SAMPLES)
        again = main(["judge", str(exp.plan.output), "--judge", "openai/judge-b", "--base-url",
                      fake.url, "--scope", "all"])
        assert again == 0 and len(fake.requests) == GSM_ITEMS * (1 + GSM_SAMPLES)  # cached: no new call
    out = capsys.readouterr().out
    assert "0 user turn(s) judged" in out and "100%" in out
    assert generations(exp.plan.output) == before
    # Reports choose which labeller counts.
    assert main(["report", str(exp.plan.output), "--labels", "rules"]) == 0
    rules_view = capsys.readouterr().out
    assert "labels from: rules" in rules_view


def test_unreachable_judge_is_counted_as_label_errors_and_the_run_goes_on(gsm_file, tmp_path):
    waits: list[float] = []  # the client's backoff, recorded instead of slept through
    with FakeOpenAI() as fake:
        fake.always(Drop())
        exp = experiment(gsm_file, tmp_path, judge="openai/down", judge_base_url=fake.url)
        store = run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)},
                               judge_sleep=waits.append)
        # Every undecided turn was tried five times, with a growing wait between the tries.
        assert len(fake.requests) == GSM_ITEMS * GSM_SAMPLES * 5
    assert len(waits) == GSM_ITEMS * GSM_SAMPLES * 4 and all(0 < wait <= 8 for wait in waits)
    greedy, sampled = load_run(store).summary()
    assert greedy.labels == {"generic": GSM_ITEMS}
    # Without the judge's verdicts the rules' undecided turns keep the classifier's label...
    assert sampled.label_errors == GSM_ITEMS * GSM_SAMPLES and sampled.undecided == 0
    turns = [t for t in read_turns(store) if t.temperature > 0]
    assert {t.label_source for t in turns} == {"classifier"}
    # ...and the failures stay on record under the judge's own source.
    judged = [t for t in read_turns(store, "judge:openai/down@rubric1") if t.temperature > 0]
    assert all(t.label is None and t.label_error.startswith("request failed") for t in judged)


def test_agreement_command_compares_rules_and_a_judge(gsm_file, tmp_path, capsys):
    with FakeOpenAI() as fake:
        fake.verdict = lambda messages: {"label": "generic", "rationale": "Only thanks."}
        exp = experiment(gsm_file, tmp_path, judge="openai/judge-c", judge_base_url=fake.url,
                         judge_scope="all")
        run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    capsys.readouterr()
    assert main(["agreement", str(exp.plan.output)]) == 0
    out = capsys.readouterr().out
    assert "judge:openai/judge-c@rubric1" in out and "rules" in out
    from userturn.stats.agreement import pairwise_agreement
    from userturn.store.database import RunStore

    (pair,) = pairwise_agreement(read_turns(RunStore.open(exp.plan.output)),
                                 sources=["rules", "judge:openai/judge-c@rubric1"])
    # The rules labelled the greedy "Thanks!" turns generic, as did the judge; the sampled turns
    # the rules left undecided are excluded.
    assert (pair.n, pair.raw, pair.excluded) == (GSM_ITEMS, 1.0, GSM_ITEMS * GSM_SAMPLES)


def test_a_local_model_writing_its_verdict_as_text_is_invalid_when_garbage_not_guessed(
        tiny_backend):
    """A local judge reads the labels' probabilities (tests/test_local_judge.py); one asked to
    write its verdict (the chat path every API judge takes) is parsed as strictly."""
    from userturn.backends import load_backend
    from userturn.labels.judge import BackendChatClient, Judge
    from userturn.records import Case

    judge = Judge(BackendChatClient(load_backend("tiny", batch_size=1)), concurrency=1)
    assert judge.name == "judge:tiny@rubric1"
    case = Case("What is 2+2?", "4", "Why 4?")
    # The rubric (about 4k tokens) does not fit the tiny model's declared 2048-token context:
    # the request fails alone, as an error label.
    (label,) = judge.classify_many([case])
    assert label.label is None and "more than the model's context of 2048" in label.error
    judge.client.backend.context_length = 8192  # its rotary positions go further
    (label,) = judge.classify_many([case])
    # The random tiny model cannot write a JSON verdict: after the re-ask it is recorded as
    # invalid, never turned into a guessed label.
    assert label.label is None and label.error.startswith("invalid")


def test_two_judges_each_stored_their_agreement_printed_and_their_majority_decides(
        gsm_file, tmp_path, capsys):
    """Judge A calls every turn a follow-up; judge B only the greedy ones: they agree on the
    greedy turns (a majority) and split on the sampled ones (no majority: undecided)."""
    import json

    from openai_fake import Answer

    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()

    def by_judge(request):
        greedy = "I am not sure" not in json.dumps(request.body.get("messages", ""))
        label = "follow_up" if request.body["model"] == "judge-a" or greedy else "generic"
        return Answer(json.dumps({"label": label, "rationale": "scripted"}))

    with FakeOpenAI(responder=by_judge) as fake:
        code = main(["judge", str(exp.plan.output), "--judge", "openai/judge-a", "--judge",
                     "openai/judge-b", "--base-url", fake.url, "--scope", "all"])
    assert code == 0
    assert {r.body["model"] for r in fake.requests} == {"judge-a", "judge-b"}
    out = capsys.readouterr().out
    assert "judge:openai/judge-a@rubric1" in out and "judge:openai/judge-b@rubric1" in out
    run = load_run(exp.plan.output)
    turns = run.turns()
    sources = {label.source for t in turns for label in t.labels}
    assert {"judge:openai/judge-a@rubric1", "judge:openai/judge-b@rubric1",
            "judges:majority"} <= sources
    greedy = [t for t in turns if t.temperature == 0]
    sampled = [t for t in turns if t.temperature > 0]
    assert {t.label for t in greedy} == {"follow_up"}
    assert {t.label_source for t in greedy} == {"judges:majority"}
    # no majority (a split, named in the error): the next source, the classifier, decides
    assert {t.label_source for t in sampled} == {"classifier"}
    assert all("no majority" in t.label_error for t in sampled)


def test_config_takes_one_judge_or_a_list():
    from userturn.config import Experiment

    assert Experiment(models=["fake/x"], judge="openai/a").labelling.judges == ["openai/a"]
    assert Experiment(models=["fake/x"], judge=["openai/a", "openai/b", "openai/a"]
                      ).labelling.judges == ["openai/a", "openai/b"]
    assert Experiment(models=["fake/x"]).labelling.judges == []
