"""The store's typed seam: every row a reader gets back is a named, typed value with the fields
that were stored (no ``sqlite3.Row`` or dict leaves the store), and the run's metadata changes
only through typed fields, all of them or none."""

from __future__ import annotations

import json
import sqlite3
from typing import get_type_hints

import pytest
from pydantic import ValidationError

from userturn.errors import StoreError
from userturn.records import Answer, Generation, GenerationParams, Item, Label, Request, Score
from userturn.store.database import RunStore
from userturn.store.meta import MetaChanges, RunMeta
from userturn.store.rows import (
    ContextRow,
    GenerationRow,
    LabelRow,
    PlanRow,
    Probed,
    ScoreRow,
    StoredLabelRow,
    UserTurnRow,
)

ANSWER = GenerationRow("a1", "assistant", "fake/m", "rev", "hash",
                       Request("<user>2+2?<assistant>", GenerationParams(0.0, 1.0, 64),
                               ("<end>",), seed=0), 0,
                       Generation("It is 4.", "<think>add</think>It is 4.<end>", "stop", 7, 5,
                                  thinking="add"))
UNSCORED = GenerationRow("a2", "assistant", "fake/m", "rev", "hash",
                         Request("<user>hi<assistant>", GenerationParams(0.0, 1.0, 64)), 0,
                         Generation("", "", "error", error="timed out"))
TURN = GenerationRow("u1", "user", "fake/m", "rev", "hash",
                     Request("<user>2+2?<assistant>It is 4.<user>", GenerationParams(0.7, 0.9, 32),
                             ("<end>", "<user>"), seed=11), 2,
                     Generation("Why?", "Why?<end>", "length", 20, 3))
ITEM = Item("q1", ({"role": "user", "content": "2+2?"},), reference="4",
            metadata={"source": "test"}, data_answer="4", next_user_turn="thanks")


def raw_meta(store: RunStore) -> dict[str, str]:
    with sqlite3.connect(store.path) as db:
        return dict(db.execute("SELECT key, value FROM meta"))


@pytest.fixture
def store(tmp_path):
    store = RunStore.create(tmp_path / "run")
    yield store
    store.close()


def _stored_run(store: RunStore) -> None:
    """One item, two answers (one scored, one failed), one user turn after the first."""
    store.put_items("gsm", [ITEM])
    store.put_generations([ANSWER, UNSCORED, TURN])
    store.put_scores([ScoreRow("a1", "gsm", Score(True, "4", "4", {"loose": 1.0}))])
    store.put_contexts([ContextRow("c1", "truncate", "It is")])
    store.replace_plan([PlanRow("a1", "assistant", "fake/m", "gsm", "q1", "", 0.0, 0, None,
                                "self", "none"),
                        PlanRow("a2", "assistant", "fake/m", "gsm", "q2", "", 0.0, 0, None,
                                "self", "none")], role="assistant", probed=Probed("fake/m"),
                       dataset="gsm")
    store.replace_plan([PlanRow("u1", "user", "fake/m", "gsm", "q1", "c1", 0.7, 2, "a1", "self",
                                "truncate")], role="user", probed=Probed("fake/m"),
                       dataset="gsm")


def test_a_generation_comes_back_as_the_row_that_was_stored(store):
    store.put_generations([ANSWER, TURN, UNSCORED])
    rows = store.generations(["u1", "a1", "a2", "never-made"])
    assert rows == {"u1": TURN, "a1": ANSWER, "a2": UNSCORED}  # every field, stop as a tuple
    assert rows["u1"].request.stop == ("<end>", "<user>") and rows["a2"].generation.error


def test_user_turns_and_answers_come_back_typed_with_their_scores_and_contexts(store):
    _stored_run(store)
    [turn] = store.user_turn_rows()
    assert turn == UserTurnRow(
        model="fake/m", dataset="gsm", item_id="q1", context="c1", temperature=0.7,
        sample_index=2, answerer="self", perturbation="truncate", key="u1", text="Why?",
        raw_text="Why?<end>", thinking=None, finish_reason="length", error=None,
        prompt="<user>2+2?<assistant>It is 4.<user>", answer="It is",  # the context's answer
        correct=True)
    assert store.answer_rows() == [
        Answer("fake/m", "gsm", "q1", "a1", "It is 4.", "add", None, "stop", True, "4", "4",
                  "gsm", {"loose": 1.0}),
        Answer("fake/m", "gsm", "q2", "a2", "", None, "timed out", "error", None, None, None,
                  None, {})]  # not scored: the score fields None, not 0 or ""


def test_an_items_fields_come_back_and_an_older_runs_item_reads_as_before(store):
    store.put_items("gsm", [ITEM])
    assert store.items("gsm") == {"q1": ITEM} and store.items("other") == {}
    with sqlite3.connect(store.path) as db:  # an item stored before items had the field
        db.execute("INSERT INTO items VALUES ('gsm', 'q0', ?)", (json.dumps(
            {"id": "q0", "messages": [{"role": "user", "content": "hi"}], "reference": None,
             "metadata": {"next_user_turn": "and then?"}}),))
    old = store.items("gsm")["q0"]
    assert old.next_user_turn == "and then?" and old.messages == ({"role": "user",
                                                                   "content": "hi"},)


def test_labels_come_back_by_source_and_one_sources_newest_first(store):
    store.put_labels([LabelRow("u1", "r1", Label("generic", "judge:x", rationale="plain")),
                      LabelRow("u2", "r1", Label(None, "judge:x", error="no verdict")),
                      LabelRow("u1", "v0", Label("follow_up", "classifier", probability=0.8))])
    store.put_labels([LabelRow("u3", "r1", Label("meta", "judge:x"))])
    assert store.label_rows()[0] == StoredLabelRow("u1", "classifier", "v0", "follow_up", "",
                                                   None, 0.8)
    assert [(r.key, r.label, r.error) for r in store.keys_labelled_by("judge:x")] == [
        ("u3", "meta", None), ("u2", None, "no verdict"), ("u1", "generic", None)]
    assert store.stored_label_sources() == ["classifier", "judge:x"]


def test_an_unknown_meta_field_is_refused_by_name_and_nothing_is_stored(store):
    store.update_meta(finished=5.0)
    before = raw_meta(store)
    with pytest.raises(TypeError, match="'finishd' is not a field of the run's metadata"):
        store.update_meta(started=1.0, finishd=6.0)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):  # a wrong type among right ones: none is stored
        store.update_meta(started=1.0, skipped={"gsm": "many"})  # type: ignore[dict-item]
    assert raw_meta(store) == before and store.meta().started is None


def test_a_meta_change_that_cannot_be_written_leaves_meta_as_it_was(tmp_path):
    folder = tmp_path / "run"
    RunStore.create(folder).close()
    reader = RunStore.read(folder)
    try:
        with pytest.raises(StoreError, match="opened to read only"):
            reader.update_meta(finished=1.0)
    finally:
        reader.close()
    assert RunStore.read(folder).meta().finished is None


def test_meta_changes_are_typed_as_the_fields_they_change():
    changes, fields = get_type_hints(MetaChanges), get_type_hints(RunMeta)
    assert "schema_version" not in changes  # the store's own
    assert {name: fields[name] for name in changes} == changes


def test_a_whole_meta_is_stored_with_its_extra_keys_and_without_its_defaults(store):
    meta = RunMeta.model_validate({"config": {"models": ["fake/m"]}, "started": 3.0,
                                   "imported_from": {"harness": "lm-eval"}})
    stored = store.put_meta(meta)
    assert stored.started == 3.0 and stored.model_extra == {"imported_from": {"harness":
                                                                              "lm-eval"}}
    assert stored.schema_version is not None  # the store's own, not overwritten by a default
    assert "label_sources" not in raw_meta(store)
