"""Errors are data with a state: a failed verdict or generation is asked again by the next
command (only successes are cached), and a command whose every request failed exits non-zero
with one line naming the first error."""

from __future__ import annotations

from helpers import GSM_ITEMS, GSM_SAMPLES, experiment, undecided_script
from openai_fake import Answer, Fail, FakeOpenAI

from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.probe.pipeline import run_experiment
from userturn.store.database import RunStore
from userturn.store.turns import read_turns

JUDGED = GSM_ITEMS * (1 + GSM_SAMPLES)


def test_failed_verdicts_are_retried_and_an_all_failed_judge_exits_1(gsm_file, tmp_path,
                                                                      capsys):
    exp = experiment(gsm_file, tmp_path)
    run_experiment(exp, backends={exp.plan.models[0]: ScriptedBackend(undecided_script)}).close()
    judge = ["judge", str(exp.plan.output), "--judge", "openai/j", "--scope", "all"]
    with FakeOpenAI() as down:
        down.always(Fail(401, body='{"error": {"message": "invalid key"}}'))
        code = main([*judge, "--base-url", down.url])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1] == (f"userturn: error: {JUDGED} of {JUDGED} judge request(s) failed; the "
                       'first: request failed: HTTP 401: {"error": {"message": "invalid key"}} '
                       "(attempt 1/5)")
    with FakeOpenAI() as up:
        assert main([*judge, "--base-url", up.url]) == 0
        assert len(up.requests) == JUDGED  # every failed verdict is asked again
        assert main([*judge, "--base-url", up.url]) == 0
        assert len(up.requests) == JUDGED  # and the successes are cached
    out = capsys.readouterr().out
    assert f"{JUDGED} user turn(s) judged, 0 failed" in out
    store = RunStore.open(exp.plan.output)
    labels = [t.label for t in read_turns(store, ["judge:openai/j@rubric1"])]
    assert labels == ["generic"] * JUDGED


def test_failed_generations_are_retried_and_an_all_failed_run_exits_1(gsm_file, tmp_path):
    exp = experiment(gsm_file, tmp_path)
    broken = ScriptedBackend(undecided_script, fail=lambda request: True)
    run_experiment(exp, backends={exp.plan.models[0]: broken}).close()
    working = ScriptedBackend(undecided_script)
    store = run_experiment(exp, backends={exp.plan.models[0]: working})
    assert working.calls == GSM_ITEMS * (2 + GSM_SAMPLES)  # nothing failed was kept as done
    assert all(t.error is None for t in read_turns(store))
    assert not store.tally.all_failed("generation")


def test_a_run_whose_every_generation_failed_exits_1_with_the_first_error(tmp_path, capsys):
    with FakeOpenAI() as fake:
        # The start-up probe (one token) works; every generation of the run fails.
        fake.responder = lambda r: (Answer() if r.body["max_tokens"] == 1 else
                                    Fail(400, body='{"error": "model is overloaded"}'))
        code = main(["run", "--model", "openai/served", "--tokenizer", "tiny", "--base-url",
                     fake.url, "--limit", "2", "-o", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("userturn: error: 2 of 2 generation request(s) failed; the first: "
                              'HTTP 400: {"error": "model is overloaded"}')
