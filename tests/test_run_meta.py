"""Run metadata is one typed value, written and read only through the store, and tolerant of
what older (or newer) runs wrote."""

from __future__ import annotations

import json
import sqlite3

import pytest
from pydantic import ValidationError

from userturn.labels.sources import run_labeller
from userturn.store.database import RunStore
from userturn.store.meta import AnnotationSample


def raw_meta(store: RunStore) -> dict[str, object]:
    with sqlite3.connect(store.path) as db:
        return {key: json.loads(value) for key, value in db.execute("SELECT key, value FROM meta")}


def test_fields_round_trip_and_keys_it_does_not_know_are_kept(tmp_path):
    store = RunStore.create(tmp_path / "run")
    store.update_meta(config={"models": ["tiny"]}, started=10.0, finished=None,
                      models={"tiny": {"revision": "r1", "template_hash": "h", "extra": 1}})
    with sqlite3.connect(store.path) as db:  # a key some other userturn version wrote
        db.execute("INSERT INTO meta VALUES ('future_key', ?)", (json.dumps({"a": 1}),))
    meta = store.meta()
    assert meta.config == {"models": ["tiny"]} and meta.started == 10.0
    assert not meta.finished_now and meta.models["tiny"].revision == "r1"
    assert meta.model_extra == {"future_key": {"a": 1}}
    assert meta.label_sources == ["rules"]  # a run labelled before sources were recorded
    store.update_meta(finished=11.0)
    assert store.meta().finished_now
    stored = raw_meta(store)
    assert stored["future_key"] == {"a": 1}
    assert stored["models"] == {"tiny": {"revision": "r1", "template_hash": "h", "extra": 1}}


def test_a_wrong_value_is_refused_before_it_is_stored(tmp_path):
    store = RunStore.create(tmp_path / "run")
    with pytest.raises(ValidationError):
        store.update_meta(skipped={"data": "many"})
    with pytest.raises(ValidationError):
        store.update_meta(labeller=3)  # a name the table lacks is refused where it is recorded
    assert "skipped" not in raw_meta(store) and "labeller" not in raw_meta(store)


def test_annotation_samples_are_stored_one_key_each_as_before(tmp_path):
    store = RunStore.create(tmp_path / "run")
    store.put_annotation_sample("ann", AnnotationSample(keys=["k1"], size=1, seed=0,
                                                        strata_source="rules"))
    store.put_annotation_sample("cal", AnnotationSample(keys=["k2"], size=1, seed=3,
                                                        inclusion={"k2": 0.5}))
    stored = raw_meta(store)
    assert stored["annotation_sample:ann"] == {"keys": ["k1"], "size": 1, "seed": 0,
                                               "strata_source": "rules"}
    assert stored["annotation_sample:cal"] == {"keys": ["k2"], "size": 1, "seed": 3,
                                               "inclusion": {"k2": 0.5}}
    samples = store.meta().annotation_samples
    assert not samples["ann"].calibration and samples["cal"].calibration


@pytest.mark.parametrize(("sources", "labeller"), [
    (["rules", "classifier"], "cascade"), (["classifier"], "classifier"), (["rules"], "rules"),
    (["judge:openai/a@rubric1", "classifier"], "classifier"),
])
def test_a_run_that_did_not_record_its_labeller_is_read_from_its_sources(
        tmp_path, sources, labeller):
    store = RunStore.create(tmp_path / "run")
    store.update_meta(label_sources=sources)
    assert run_labeller(store.meta()).name == labeller
