"""Reading a user turn in its context (labels/context.py): the numbers the classifier learns from.

The cache-sharing arithmetic is checked against plain full-sequence scoring on the tiny model;
what the ratios mean is checked on the real embedded SmolLM2 (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from userturn.labels.context import CONTEXT_FEATURES, ContextScorer, turn_key
from userturn.labels.readings import (
    ContextReading,
    corpus_readings,
    load_readings,
    read_cases,
    reading_row,
    shipped_and_cached,
)
from userturn.records import Case

# The shipped default labeller and its reader are what these tests are about (tests/conftest.py).
pytestmark = pytest.mark.context_reader

CASE = Case("What is 12 times 7? Explain briefly.",
            "12 times 7 is 84, because 12 x 7 = 70 + 14 = 84. Anything else?",
            "Why did you split it into 70 and 14?",
            "Why did you split it into 70 and 14?")


@pytest.fixture(scope="module")
def tiny_scorer() -> ContextScorer:
    return ContextScorer("tiny")


def _plain_mean_logp(scorer: ContextScorer, prefix: list[int], turn: list[int]) -> float:
    """Log p of ``turn`` after ``prefix`` from one forward pass over the whole sequence."""
    ids = torch.tensor([prefix + turn])
    with torch.inference_mode():
        logits = scorer.model(ids).logits[0]
    logp = torch.log_softmax(logits[len(prefix) - 1:-1], dim=-1)
    return float(logp.gather(1, torch.tensor(turn)[:, None]).mean())


def test_shared_beginnings_give_the_numbers_of_whole_sequences(tiny_scorer):
    s, p = tiny_scorer, tiny_scorer.pieces
    reading = s.read(CASE)
    turn = s._ids(CASE.user_turn) + s._ids(p["after_turn"].split("\n")[0])
    query, answer = s._ids(CASE.query), s._ids(CASE.answer)
    asked = s._ids(p["before_query"]) + query
    answered = asked + s._ids(p["query_to_answer"]) + answer
    expected = {
        "lp_after_answer": _plain_mean_logp(s, answered + s._ids(p["answer_to_turn"]), turn),
        "lp_after_query": _plain_mean_logp(s, asked + s._ids(p["query_to_turn"]), turn),
        "lp_alone": _plain_mean_logp(s, s._ids(p["before_turn_alone"]), turn),
        "lp_as_assistant": _plain_mean_logp(s, answered + s._ids("\n\n"), turn),
    }
    got = dict(zip(CONTEXT_FEATURES, reading.features))
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-4), name
    assert got["answer_gain"] == pytest.approx(got["lp_after_answer"] - got["lp_after_query"],
                                               abs=1e-5)
    assert reading.embedding.shape == (s.model.config.hidden_size,)
    assert np.isfinite(reading.embedding).all()


def test_a_long_context_is_clipped_to_the_answer_tail(tiny_scorer):
    """The user reads the end of the answer last: a long answer keeps its tail, and reading a
    turn costs the same however long the conversation was."""
    long = Case("q " * 2000, "filler " * 3000 + "The answer is 84.", "Why 84?", "Why 84?")
    short = Case("q " * 2000, "filler " * 500 + "The answer is 84.", "Why 84?", "Why 84?")
    assert np.allclose(tiny_scorer.read(long).features, tiny_scorer.read(short).features,
                       atol=1e-4)


def test_a_batch_is_read_in_five_passes_with_the_numbers_of_each_turn_alone():
    """Turns after several answers are read in one batch (padded queries, answers and turns of
    unequal length): each reading is the one the turn gets read alone, and a batch costs five
    forward passes however many turns and answers it holds."""
    turns = ["Why 84?", "Can you show the step where you multiplied by seven again, please?",
             "Thanks!", "Why 84?"]
    cases = [Case(CASE.query, CASE.answer, t, t) for t in turns]
    cases.append(Case("Another question?", "Another answer.", "Why?", "Why?"))
    cases.append(Case("A much longer question about how twelve sevens come to eighty-four?",
                      "Short.", "Thanks!", "Thanks!"))
    alone = [ContextScorer("tiny").read(case) for case in cases]
    together = ContextScorer("tiny")
    forwards: list[int] = []
    forward = together.decoder.forward
    together.decoder.forward = lambda *a, **k: forwards.append(1) or forward(*a, **k)
    batched = together.read_many(cases)
    for one, many in zip(alone, batched):
        assert np.allclose(one.features, many.features, atol=1e-4)
        assert np.allclose(one.embedding, many.embedding, atol=1e-4)
    # The queries, the answers, the turns after their query, after their answer (as the user's
    # and as the assistant's, together) and alone; the repeated turn is read once.
    assert len(forwards) == 5
    assert together.read_many(cases[:1])[0] is batched[0]  # read once per process
    # A smaller batch size: more batches, the same numbers.
    small = ContextScorer("tiny", batch_size=2)
    for one, many in zip(batched, small.read_many(cases)):
        assert np.allclose(one.features, many.features, atol=1e-4)


def test_readings_are_cached_as_they_come_and_a_torn_line_is_read_again(tmp_path, monkeypatch):
    import userturn.labels.readings as readings_module

    scored: list[str] = []
    real = readings_module.ContextScorer

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, model: str = "tiny") -> None:
            super().__init__("tiny")

        def read_many(self, cases):  # type: ignore[no-untyped-def]
            scored.extend(case.user_turn for case in cases)
            return super().read_many(cases)

    monkeypatch.setattr(readings_module, "ContextScorer", Counting)
    cases = [Case(CASE.query, CASE.answer, turn, turn) for turn in ("One?", "Two?", "Three?")]
    cache = tmp_path / "readings.jsonl"
    first = read_cases(cases, cache)
    assert scored == ["One?", "Two?", "Three?"]
    assert len(cache.read_text().splitlines()) == 3
    # A kill mid-write leaves a torn last line: that turn alone is read again.
    lines = cache.read_text().splitlines()
    cache.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    again = read_cases(cases, cache)
    assert scored == ["One?", "Two?", "Three?", "Three?"]
    for a, b in zip(first, again):
        assert np.allclose(a.features, b.features, atol=1e-4)
    readings, scorers = load_readings([cache])
    assert set(readings) == {turn_key(c.query, c.answer, c.user_turn) for c in cases}
    assert scorers == {json.loads(lines[0])["scorer"]}


def test_a_cache_extends_and_overrides_the_shipped_corpus_readings(tmp_path):
    shipped, scorer = corpus_readings()
    old_key = sorted(shipped)[0]
    width = len(shipped[old_key].features)
    mine = ContextReading(np.full(width, 7.0, dtype=np.float32), np.zeros(4, dtype=np.float32))
    cache = tmp_path / "readings.jsonl"
    cache.write_text(json.dumps(reading_row(old_key, scorer, mine)) + "\n"
                     + json.dumps(reading_row("t-new-turn", "another scorer", mine)) + "\n")
    readings, scorers = shipped_and_cached([cache])
    assert set(readings) == set(shipped) | {"t-new-turn"}
    assert np.allclose(readings[old_key].features, 7.0)  # the cache wins over the shipped file
    assert scorers == {scorer, "another scorer"}  # so a caller can refuse mixed scorers


@pytest.mark.slow
def test_smollm2_finds_the_answer_in_a_grounded_turn():
    """What the classifier relies on: a turn about the answer is likelier after it than after
    the query alone; an unrelated request is not; the assistant's own voice reads as the
    assistant's."""
    scorer = ContextScorer()
    query = "Which city should I visit in Portugal for three days?"
    answer = ("Go to Porto. Walk along the Ribeira district, cross the Dom Luis I bridge, and "
              "visit the Livraria Lello bookshop. Taste port wine in the cellars of Vila Nova "
              "de Gaia across the river.")

    def features(turn: str) -> dict[str, float]:
        reading = scorer.read(Case(query, answer, turn, turn))
        return dict(zip(CONTEXT_FEATURES, map(float, reading.features)))

    grounded = features("Is the Livraria Lello bookshop worth the queue?")
    unrelated = features("Write a Python function that reverses a linked list.")
    drift = features("Additionally, you can visit the Serralves museum and its gardens.")
    assert grounded["answer_gain"] > unrelated["answer_gain"] + 0.2
    assert grounded["answer_gain"] > 0.3
    assert drift["assistant_gain"] > grounded["assistant_gain"]
