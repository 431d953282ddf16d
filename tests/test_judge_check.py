"""`userturn corpus check-judge`: a judge against people on the corpus's adjudicated turns, through
a real OpenAI-compatible server on 127.0.0.1 (the project's scripted one), resumable after a kill
with no verdict asked twice, its figure quoted beside every rate that rests on the judge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import one_error
from openai_fake import Answer, FakeOpenAI

from userturn.cli.main import main
from userturn.labels.judge import case_message
from userturn.labels.judge_check import (
    PEOPLE,
    VERDICTS,
    corpus_turns,
    judging_order,
    load_check,
)

LIMIT = 40
TURNS = judging_order(corpus_turns("test"))[:LIMIT]


def check(capsys: pytest.CaptureFixture[str], url: str, out: Path, *extra: str) -> str:
    assert main(["corpus", "check-judge", "--judge", "openai/j", "--base-url", url,
                 "--limit", str(LIMIT), "-o", str(out), *extra]) == 0
    return " ".join(capsys.readouterr().out.split())


def asked_cases(fake: FakeOpenAI) -> list[str]:
    return [r.body["messages"][-1]["content"] for r in fake.requests]


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("USERTURN_CACHE", str(tmp_path / "cache"))


def test_the_order_puts_people_first_and_any_prefix_is_stratified():
    ordered = judging_order(corpus_turns("test"))
    people = [t for t in ordered if t.group == PEOPLE]
    assert ordered[:len(people)] == people and len(people) == 53
    after = ordered[len(people):len(people) + 12]
    assert len({t.group for t in after}) == 3  # the generators and authored cases, interleaved
    assert judging_order(corpus_turns("test")) == ordered  # fixed: the same every time
    assert {t.split for t in ordered} == {"test"}  # nothing the labellers were fit on


def test_a_judge_that_always_says_follow_up_has_kappa_zero(tmp_path, capsys):
    with FakeOpenAI() as fake:
        fake.verdict = lambda messages: {"label": "follow_up", "rationale": "always"}
        out = check(capsys, fake.url, tmp_path / "check")
        assert len(fake.requests) == LIMIT
    assert "│ people │ 40 │ 0 │ 0.00 [0.00, 0.00] │ 0.00 [0.00, 0.00] │" in out
    result = load_check("judge:openai/j@rubric1", tmp_path / "check")
    assert result is not None and result.overall.kappa == 0.0
    assert result.overall.judge_rate == 1.0 and result.overall.recall == 1.0
    people = next(g for g in result.groups if g.group == PEOPLE)
    assert people.n == LIMIT  # the first 40 of the order are people's
    assert people.people_rate == pytest.approx(sum(t.label == "follow_up" for t in TURNS) / LIMIT)
    assert 0 < people.annotators_kappa < 1  # the annotators' own agreement: the ceiling


def test_a_judge_that_agrees_with_people_has_kappa_one_and_a_second_run_asks_nothing(
        tmp_path, capsys):
    labels = {case_message(t.case): t.label for t in TURNS}

    def adjudicated(messages):  # type: ignore[no-untyped-def]
        return {"label": labels[messages[-1]["content"]], "rationale": "as people said"}

    with FakeOpenAI() as fake:
        fake.verdict = adjudicated
        check(capsys, fake.url, tmp_path / "check")
        out = check(capsys, fake.url, tmp_path / "check")
        assert len(fake.requests) == LIMIT  # the second run read every verdict back
    assert "0 verdict(s) asked now" in out
    result = load_check("judge:openai/j@rubric1", tmp_path / "check")
    assert result is not None and result.overall.kappa == 1.0
    assert result.overall.precision == result.overall.recall == 1.0


def test_a_killed_check_resumes_without_asking_any_stored_verdict_again(tmp_path):
    out = tmp_path / "check"
    argv = [sys.executable, "-m", "userturn.cli.main", "corpus", "check-judge", "--judge",
            "openai/j", "--limit", str(LIMIT), "-o", str(out), "--concurrency", "1"]
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    with FakeOpenAI() as fake:
        fake.always(Answer(delay=0.05))
        process = subprocess.Popen([*argv, "--base-url", fake.url], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (out / VERDICTS).exists() or len((out / VERDICTS).read_text().splitlines()) < 8:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        first = asked_cases(fake)
    stored = [json.loads(line)["key"] for line in (out / VERDICTS).read_text().splitlines()]
    assert 8 <= len(stored) < LIMIT
    with FakeOpenAI() as fake:
        resumed = subprocess.run([*argv, "--base-url", fake.url], env=env, capture_output=True,
                                 text=True, timeout=120)
        again = asked_cases(fake)
    assert resumed.returncode == 0, resumed.stderr
    by_case = {case_message(t.case): t.key for t in TURNS}
    assert not {by_case[case] for case in again} & set(stored)  # no stored verdict asked twice
    assert len(stored) + len(again) == LIMIT and len(first) <= len(stored) + 1
    assert f"{len(again)} verdict(s) asked now" in " ".join(resumed.stdout.split())


def test_a_rate_that_rests_on_a_checked_judge_quotes_the_check(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", "--model", "fake/probe", "--dataset", "gsm_symbolic", "--limit", "2",
                 "--samples", "1", "-o", str(run)]) == 0
    with FakeOpenAI() as fake:
        fake.verdict = lambda messages: {"label": "follow_up", "rationale": "always"}
        assert main(["corpus", "check-judge", "--judge", "openai/j", "--base-url", fake.url,
                     "--limit", "10"]) == 0  # kept in the cache, by the judge's name
        capsys.readouterr()
        assert main(["judge", str(run), "--judge", "openai/j", "--base-url", fake.url,
                     "--scope", "all"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("judge:openai/j@rubric1 decides turns of these rates (fake/probe gsm_symbolic "
            "T=greedy: 2 of 2; fake/probe gsm_symbolic T=1: 2 of 2); it was checked against "
            "people on 10 corpus turns (people): kappa follow-up vs rest 0.00, follow-up rate "
            "100% vs people's") in out


def test_bad_requests_are_one_line(tmp_path, capsys):
    assert "--limit must be 1 or more" in one_error(
        capsys, "corpus", "check-judge", "--judge", "openai/j", "--limit", "0")
    assert "a calibration needs a judge read from label probabilities" in one_error(
        capsys, "corpus", "check-judge", "--judge", "openai/j", "--base-url",
        "http://127.0.0.1:9/v1", "--fit-calibration", str(tmp_path / "c.json"), "--limit", "1",
        "-o", str(tmp_path / "check"))


def test_a_check_whose_verdicts_are_all_stored_never_builds_the_judge(tmp_path, capsys,
                                                                       monkeypatch):
    from userturn.labels.judge_check import Verdict, append_verdict
    from userturn.labels.judges import expected_judge_name
    from userturn.labels.plan import JudgeSpec

    name = expected_judge_name("smollm2")
    assert name == "judge:smollm2@rubric1-labels"
    out = tmp_path / "check"
    out.mkdir()
    for turn in TURNS:
        append_verdict(out, Verdict(name, turn.key, "generic", None, 0.9))

    def never(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the judge's model was loaded with nothing to ask")

    monkeypatch.setattr(JudgeSpec, "build_judges", never)
    assert main(["corpus", "check-judge", "--judge", "smollm2", "--limit", str(LIMIT), "-o",
                 str(out)]) == 0
    assert "0 verdict(s) asked now" in " ".join(capsys.readouterr().out.split())
    result = load_check(name, out)
    assert result is not None and result.overall.judge_rate == 0.0


def test_a_calibrated_judge_is_checked_from_its_raw_judges_stored_scores(tmp_path, capsys,
                                                                          monkeypatch):
    from userturn.labels.judge_check import Verdict, append_verdict
    from userturn.labels.judges import expected_judge_name
    from userturn.labels.plan import JudgeSpec
    from userturn.records import LABELS

    calibration = Path(__file__).parent / "fixtures" / "judge_calibration_identity.json"
    raw, calibrated = expected_judge_name("smollm2"), expected_judge_name("smollm2", calibration)
    assert calibrated.startswith(raw + "+cal:")
    out = tmp_path / "check"
    out.mkdir()
    for turn in TURNS:  # scores that favour the adjudicated label: the identity map keeps it
        scores = [-0.1 if label == turn.label else -5.0 for label in LABELS]
        append_verdict(out, Verdict(raw, turn.key, "generic", None, 0.5, scores))
    monkeypatch.setattr(JudgeSpec, "build_judges", lambda self: pytest.fail("model loaded"))
    assert main(["corpus", "check-judge", "--judge", "smollm2", "--calibration",
                 str(calibration), "--limit", str(LIMIT), "-o", str(out)]) == 0
    capsys.readouterr()
    result = load_check(calibrated, out)
    assert result is not None and result.overall.kappa == 1.0  # the calibrated labels, not raw
