"""Rows refilled as turns finish (issue #44), on the tiny real model: the refill engine gives the
turns the static batches gave (greedy, and seeded samples whatever the batch and the order),
keeps every row in flight busy, and a run written by the static batches resumes and regenerates
identically under it (``fixtures/runs/static-batches``, made with the static engine)."""

from __future__ import annotations

import functools
import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from userturn import load_run
from userturn.backends.batching import choose_width
from userturn.backends.hf import TransformersBackend
from userturn.backends.models import resolve_model
from userturn.chat.render import render_user_turn
from userturn.cli.main import main
from userturn.records import GenerationParams, Request

GOLDEN = Path(__file__).parent / "fixtures" / "runs" / "static-batches"
# The command that wrote it (MADE.txt), less --output.
GOLDEN_RUN = ["run", "--model", "tiny", "--limit", "3", "--samples", "4", "--temperatures", "0",
              "1", "--user-max-tokens", "24", "--max-tokens", "16", "--labeller", "rules"]
ANSWERS = ("36", "He has 36.", "The total is 36 pencils, since 3 boxes of 12 make 36.",
           "Let me think. Three boxes hold twelve pencils each, so 3 x 12 = 36 pencils in all, "
           "and none are missing.")
DRAWS = (GenerationParams(0.0, 1.0, 0), GenerationParams(1.0, 1.0, 0),
         GenerationParams(0.7, 0.9, 0))


@pytest.fixture(scope="module")
def static() -> TransformersBackend:
    return TransformersBackend(resolve_model("tiny"), batch_size=4, batching="static")


def varied(backend: TransformersBackend) -> list[Request]:
    """Prompts of four lengths x budgets 1, 6, 20 x greedy and two sampled draws, with the user
    turn's own stop markers; and strings the model writes as markers."""
    out = []
    for n, answer in enumerate(ANSWERS):
        prompt = render_user_turn(backend.template, [
            {"role": "user", "content": "Tom has 3 boxes of 12 pencils. How many pencils?"},
            {"role": "assistant", "content": answer}])
        for budget in (1, 6, 20):
            for draw in DRAWS:
                params = GenerationParams(draw.temperature, draw.top_p, budget)
                out.append(Request(prompt.text, params, prompt.stop,
                                   0 if params.greedy else 7 * n + budget))
        out.append(Request(prompt.text, GenerationParams(0.0, 1.0, 20), ("ppl",), 0))
        out.append(Request(prompt.text, GenerationParams(1.0, 1.0, 20), ("an",), n))
    return out


def test_refilled_turns_are_the_static_batches_turns_at_any_width_in_any_order(static):
    batch = varied(static)
    expected = static.complete(batch)
    reasons = {(g.finish_reason, g.completion_tokens) for g in expected}
    assert {"stop", "length"} <= {reason for reason, _ in reasons} and len(reasons) > 5
    shuffled = list(range(len(batch)))
    random.Random(0).shuffle(shuffled)
    for width in (2, 5, 16):
        refill = TransformersBackend(resolve_model("tiny"), batch_size=width)
        assert refill.complete(batch) == expected, width
    got = refill.complete([batch[i] for i in shuffled])
    assert got == [expected[i] for i in shuffled]


def test_sampled_turns_depend_on_seed_and_step_only(static):
    """A sampled request alone, among others, or after them gives the same turn; its seed
    changes it."""
    hot = [r for r in varied(static) if not r.params.greedy and r.params.max_tokens > 1]
    refill = TransformersBackend(resolve_model("tiny"), batch_size=3)
    together = refill.complete(hot)
    assert [refill.complete([r])[0] for r in hot[:3]] == together[:3]
    assert refill.complete(hot[::-1]) == together[::-1]
    reseeded = [Request(r.prompt, r.params, r.stop, r.seed + 1) for r in hot]
    assert [g.text for g in refill.complete(reseeded)] != [g.text for g in together]


def test_every_row_in_flight_generates_and_slots_refill_as_turns_end(static):
    """Every decode step feeds only rows still writing their turn (a row leaves at its last
    token), and the steps are fewer than the static batches' (which wait for their longest)."""
    batch = varied(static)
    refill = TransformersBackend(resolve_model("tiny"), batch_size=4)
    refill.complete(batch[:1])  # its first call checks the model's cache with one token
    steps = count_decode_rows(refill)
    got = refill.complete(batch)
    # Each row's first token comes from its prefill; every other token from one decode row.
    assert sum(steps) == sum(g.completion_tokens for g in got) - len(got)
    assert max(steps) == 4
    static_steps = count_decode_rows(static)
    assert static.complete(batch) == got
    assert len(steps) < len(static_steps)


def count_decode_rows(backend: TransformersBackend) -> list[int]:
    """The rows of every one-token step the model runs from now on."""
    forward = backend.model.forward
    steps: list[int] = []

    @functools.wraps(forward)
    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs["input_ids"].shape[1] == 1 and kwargs["input_ids"].shape[0] > 0:
            steps.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    backend.model.forward = counted
    return steps


def stored_generations(folder: Path) -> dict[str, tuple]:
    """key -> everything a generation stored, read from the database (the witness)."""
    with sqlite3.connect(folder / "userturn.db") as db:
        rows = db.execute("SELECT key, role, prompt, stop, temperature, top_p, max_tokens, seed, "
                          "text, raw_text, finish_reason, prompt_tokens, completion_tokens, "
                          "error, created FROM generations").fetchall()
    return {row[0]: row[1:] for row in rows}


def test_a_static_batch_run_resumes_under_refill_with_no_generation(tmp_path):
    folder = tmp_path / "static-batches"
    shutil.copytree(GOLDEN, folder)
    before = stored_generations(folder)
    turns = [(t.key, t.user_turn, t.label) for t in load_run(folder).turns()]
    assert main([*GOLDEN_RUN, "--output", str(folder)]) == 0
    assert stored_generations(folder) == before  # nothing generated again, nothing rewritten
    assert [(t.key, t.user_turn, t.label) for t in load_run(folder).turns()] == turns


def test_the_refill_engine_regenerates_a_static_batch_run(tmp_path):
    """Its stored requests through the refill engine give its stored turns; a fresh run of its
    command stores them under the same keys."""
    golden = stored_generations(GOLDEN)
    keys = list(golden)
    requests = [Request(golden[k][1], GenerationParams(*golden[k][3:6]),
                        tuple(json.loads(golden[k][2])), golden[k][6]) for k in keys]
    refill = TransformersBackend(resolve_model("tiny"), batch_size=5)
    got = refill.complete(requests)
    stored = [golden[k][7:12] for k in keys]
    assert [(g.text, g.raw_text, g.finish_reason, g.prompt_tokens, g.completion_tokens)
            for g in got] == stored
    fresh = tmp_path / "fresh"
    assert main([*GOLDEN_RUN, "--output", str(fresh)]) == 0
    again = stored_generations(fresh)
    assert {k: v[:-1] for k, v in again.items()} == {k: v[:-1] for k, v in golden.items()}


def test_choose_width_takes_the_narrowest_near_the_best_rate():
    assert choose_width({4: 40.0, 8: 58.0, 16: 62.0, 32: 63.0}) == 8
    assert choose_width({4: 40.0, 8: 50.0, 16: 62.0, 32: 63.0}) == 16
    assert choose_width({4: 70.0, 8: 60.0}) == 4
