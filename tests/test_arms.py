"""The continuation arm beside the opened one, as a run makes, stores, labels and reports it.

A scripted ChatML model continues the closed conversation three ways, by item: it writes a user
turn (a grounded follow-up, or a generic thanks), it goes on as the assistant, or it ends. The
tests check what a researcher comparing the arms relies on: each continuation is stored raw and
read with the template's markers, only the user turns written are labelled, the unforced rate is
over every continuation, the arms pair item by item, the opened arm's keys are those of a run
without arms, a finished run re-run calls no model, and an engine that cannot continue is refused
before anything is written.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

import pytest
from helpers import GSM_ITEMS, GSM_SAMPLES, experiment, grounded_script, is_user_turn, run_cli

from userturn import load_run
from userturn.backends.fake import ScriptedBackend
from userturn.errors import ConfigError
from userturn.probe.pipeline import run_experiment
from userturn.records import Request
from userturn.stats.arms import arm_rows
from userturn.store.database import RunStore

CLOSED = "<|im_end|>\n"  # a ChatML conversation closed after the assistant's turn ends so
# The first three questions of gsm_file: the continuation opens a user turn; the fourth goes on
# as the assistant; the fifth and sixth end (end of sequence).
FOLLOW_UP = "Why did you multiply the boxes by the apples?"


def continuing_script(request: Request) -> str:
    if is_user_turn(request) or not request.prompt.endswith(CLOSED):
        return grounded_script(request)
    if any(q in request.prompt for q in ("3 boxes", "45 apples")):
        return f"<|im_start|>user\n{FOLLOW_UP}<|im_end|>\n<|im_start|>assistant\nBecause"
    if "20 pages" in request.prompt:
        return "<|im_start|>user\nThanks!<|im_end|>"
    if "60 km" in request.prompt:
        return "<|im_start|>assistant\nLet me also add that<|im_end|>"
    return "<|im_end|>"


class ScoringScript(ScriptedBackend):
    """The scripted model (next-role scores: user 0.6, assistant 0.3, end 0.05)."""


class NoPromptScores:
    """A completions engine that cannot score a prompt's next tokens."""

    def __init__(self, script) -> None:  # type: ignore[no-untyped-def]
        self.inner = ScriptedBackend(script)
        self.spec, self.revision = self.inner.spec, self.inner.revision
        self.template, self.chunk_size = self.inner.template, self.inner.chunk_size

    def complete(self, requests: Sequence[Request]):  # type: ignore[no-untyped-def]
        return self.inner.complete(requests)


def both_arms(gsm_file: Path, tmp_path: Path, **changes) -> tuple[RunStore, ScoringScript]:
    backend = ScoringScript(continuing_script)
    exp = experiment(gsm_file, tmp_path, arms=["opened", "continuation"], **changes)
    return run_experiment(exp, backends={exp.models[0]: backend}), backend


def test_continuations_are_stored_raw_and_read_with_the_templates_markers(gsm_file, tmp_path):
    store, backend = both_arms(gsm_file, tmp_path)
    turns = load_run(store.folder).turns()
    per_item = 1 + GSM_SAMPLES
    assert len(turns) == 2 * GSM_ITEMS * per_item
    continuations = [t for t in turns if t.arm == "continuation"]
    assert len(continuations) == GSM_ITEMS * per_item
    roles = sorted({(t.item_id, t.next_role) for t in continuations})
    assert [role for _, role in roles].count("user") == 3
    assert {role for _, role in roles} == {"user", "assistant", "none"}
    written = [t for t in continuations if t.next_role == "user"]
    assert {t.user_turn for t in written} == {FOLLOW_UP, "Thanks!"}
    # The raw text is what the model wrote, the role boundary where the user's words start.
    one = next(t for t in written if t.user_turn == FOLLOW_UP)
    assert one.raw_user_turn.startswith("<|im_start|>user\n")
    assert one.raw_user_turn[one.boundary:].startswith(FOLLOW_UP)
    assert one.role_probabilities == pytest.approx(
        {"user": 0.6, "assistant": 0.3, "end": 0.05, "other": 0.05})
    # Each prompt is scored once, whatever its samples.
    assert backend.scored == GSM_ITEMS
    # A continuation that opened no user turn has nothing to label: no label, its own status.
    other = [t for t in continuations if t.next_role != "user"]
    assert other and all(t.label is None and t.status == "no user turn" for t in other)
    assert all(t.label is not None for t in written)


def test_the_unforced_rate_is_over_every_continuation_and_pairs_with_the_opened_arm(
        gsm_file, tmp_path):
    store, _ = both_arms(gsm_file, tmp_path, temperatures=[0.0])
    turns = load_run(store.folder).turns()
    (row,) = arm_rows(turns)
    assert row.condition.arm == "continuation" and row.continuations == GSM_ITEMS
    assert (row.opens_user.hits, row.opens_user.n) == (3, GSM_ITEMS)
    follow_ups = sum(t.follow_up for t in turns if t.arm == "continuation")
    assert (row.unforced.hits, row.unforced.n) == (follow_ups, GSM_ITEMS)
    assert row.written is not None and (row.written.hits, row.written.n) == (follow_ups, 3)
    opened = [t for t in turns if t.arm == "opened"]
    assert row.opened is not None and row.opened.n == len(opened)
    assert row.difference is not None and row.difference.items == GSM_ITEMS
    assert row.difference.delta == pytest.approx(row.unforced.value - row.opened.value)
    assert row.next_role == pytest.approx({"user": 0.6, "assistant": 0.3, "end": 0.05,
                                           "other": 0.05})
    assert row.roles == {"user": 3, "assistant": 1, "none": 2}


def test_the_opened_arms_keys_are_those_of_a_run_without_arms(gsm_file, tmp_path):
    alone = run_experiment(experiment(gsm_file, tmp_path / "a"),
                           backends={"fake/scripted": ScoringScript(continuing_script)})
    both, _ = both_arms(gsm_file, tmp_path / "b")
    keys = {r.key for r in alone.plan_rows("user")}
    opened = {r.key for r in both.plan_rows("user") if r.arm == "opened"}
    continued = {r.key for r in both.plan_rows("user") if r.arm == "continuation"}
    assert keys == opened and not keys & continued and len(continued) == len(keys)


def test_a_finished_run_re_run_calls_no_model_and_scores_nothing_again(gsm_file, tmp_path):
    store, _ = both_arms(gsm_file, tmp_path)
    before = load_run(store.folder).turns()
    store.close()
    again, backend = both_arms(gsm_file, tmp_path)
    assert backend.calls == 0 and backend.scored == 0
    assert load_run(again.folder).turns() == before


def test_an_engine_that_cannot_continue_is_refused_before_anything_is_written(gsm_file,
                                                                                tmp_path):
    exp = experiment(gsm_file, tmp_path, arms=["opened", "continuation"])
    backend = NoPromptScores(continuing_script)
    with pytest.raises(ConfigError, match=r"fake/scripted: the continuation arm needs a "
                       r"completions engine .* --arms opened$"):
        run_experiment(exp, backends={exp.models[0]: backend})
    assert backend.inner.calls == 0 and not (tmp_path / "run" / "userturn.db").exists()


def test_the_cli_runs_both_arms_and_reports_them_side_by_side(gsm_file, tmp_path, capsys):
    out = tmp_path / "cli"
    code, stdout, _ = run_cli(capsys, "run", "--model", "fake/scripted", "--dataset",
                              str(gsm_file), "--limit", "3", "--arms", "opened,continuation",
                              "--output", str(out))
    assert code == 0, stdout
    assert "Who speaks next" in stdout and "arm" in stdout
    code, _, _ = run_cli(capsys, "report", str(out), "--html")
    assert code == 0
    with open(out / "report_tables" / "summary.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["arm"] for row in rows} == {"opened", "continuation"}


def test_arms_takes_the_arm_names_only(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "--arms", "opened,forced", "--output",
                           str(tmp_path / "x"))
    assert code == 2 and "arms" in err and "continuation" in err
    assert not (tmp_path / "x").exists()


def test_the_page_sets_the_arms_side_by_side_and_marks_the_role_boundary(gsm_file, tmp_path,
                                                                        capsys, browser):
    from playwright.sync_api import expect

    store, _ = both_arms(gsm_file, tmp_path, temperatures=[0.0])
    store.close()
    code, _, _ = run_cli(capsys, "report", str(tmp_path / "run"), "--html")
    assert code == 0
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(10_000)
    page.goto((tmp_path / "run" / "report.html").resolve().as_uri())
    section = page.locator("section#arms")
    expect(section.locator("h2")).to_have_text("Who speaks next")
    # One row per condition of the arm: the rates forced and unforced side by side.
    cells = section.locator("tbody tr").first.locator("td")
    expect(cells.nth(4)).to_contain_text("50%")  # 3 of 6 continuations open a user turn
    assert section.locator("svg").count() == 1  # the next-role bars
    expect(section.locator("svg")).to_contain_text("user header")
    # The sample browser: the arm is a filter; a continuation's raw text marks where its turn
    # starts, and one that opened no user turn says what it opened.
    page.select_option("#f-arm", "continuation")
    expect(page.locator("#match-count")).to_have_text(str(GSM_ITEMS))
    expect(page.locator("#cards")).to_contain_text("(the continuation opened an assistant turn)")
    card = page.locator("#cards > details", has_text=FOLLOW_UP).first
    card.locator("summary").click()
    card.locator("button.show").click()
    expect(card.locator("mark.boundary")).to_have_text("▏user: ")
    expect(card.locator("pre.raw .before-turn")).to_have_text("<|im_start|>user\n")
    assert not errors, errors


def test_compare_pairs_each_arm_with_the_same_arm(gsm_file, tmp_path, capsys):
    from userturn.report.view import read_run
    from userturn.stats.comparison import compare_turns

    a, _ = both_arms(gsm_file, tmp_path / "a", temperatures=[0.0])
    b = run_experiment(experiment(gsm_file, tmp_path / "b", arms=["opened", "continuation"],
                                  temperatures=[0.0]),
                       backends={"fake/scripted": ScoringScript(grounded_script)})
    runs = [read_run(store) for store in (a, b)]
    comparisons, _ = compare_turns(runs[0].turns, runs[0].answers, runs[1].turns,
                                   runs[1].answers)
    assert sorted(c.arm for c in comparisons) == ["continuation", "opened"]
    by_arm = {c.arm: c for c in comparisons}
    # The opened arm's turns are the same script on both sides; the continuations are not.
    assert by_arm["opened"].follow_up.delta == 0
    assert by_arm["continuation"].follow_up.items == GSM_ITEMS
    code, out, _ = run_cli(capsys, "compare", str(a.folder), str(b.folder))
    assert code == 0 and "arm" in out and "continuation" in out
