"""The pipeline with a scripted backend: caching, resumption after failures, seeds, accuracy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from userturn import load_run
from userturn.backends.fake import ScriptedBackend
from userturn.config import Experiment
from userturn.probe.pipeline import run_experiment
from userturn.records import Request
from userturn.store.database import RunStore
from userturn.store.export import export_user_turns
from userturn.store.turns import read_turns

ITEMS = 6
SAMPLES = 3


def is_user_turn(request: Request) -> bool:
    return request.prompt.endswith("<|im_start|>user\n")


def script(request: Request) -> str:
    """Correct answers for the first three questions; a grounded follow-up at T > 0 only."""
    if not is_user_turn(request):
        correct = any(q in request.prompt for q in ("3 boxes", "45 apples", "20 pages"))
        return "Let me compute. #### 26" if "3 boxes" in request.prompt else (
            "The answer is 135." if "45 apples" in request.prompt else (
                "So 20 * 6 = 120. #### 120" if correct else "#### 1"))
    if request.params.temperature > 0:
        numbers = re.findall(r"\d+", request.prompt.rsplit("assistant", 1)[1])
        number = numbers[-1] if numbers else "that"
        return f"Why did you get {number}? I think it should be 27."
    return "Thank you!"


def experiment(gsm_file: Path, tmp_path: Path, **changes) -> Experiment:
    settings = dict(models=["fake/scripted"], datasets=[str(gsm_file)], limit=ITEMS,
                    temperatures=[0.0, 1.0], samples=SAMPLES, output=tmp_path / "run")
    return Experiment(**{**settings, **changes})


def run(exp: Experiment, backend: ScriptedBackend) -> RunStore:
    return run_experiment(exp, backends={exp.models[0]: backend})


def test_finished_run_rerun_makes_zero_model_calls(gsm_file, tmp_path):
    exp = experiment(gsm_file, tmp_path)
    first = ScriptedBackend(script)
    before = load_run(run(exp, first)).summary()
    assert first.calls == ITEMS * (1 + 1 + SAMPLES)
    again = ScriptedBackend(script)
    after = load_run(run(exp, again)).summary()
    assert again.calls == 0
    assert repr(before) == repr(after)  # repr: an empty rate's interval is NaN


def test_every_sample_has_its_own_seed_and_key(gsm_file, tmp_path):
    backend = ScriptedBackend(script)
    store = run(experiment(gsm_file, tmp_path), backend)
    sampled = [r for r in backend.requests if is_user_turn(r) and r.params.temperature > 0]
    greedy = [r for r in backend.requests if is_user_turn(r) and r.params.temperature == 0]
    assert len(sampled) == ITEMS * SAMPLES and len({r.seed for r in sampled}) == len(sampled)
    assert {r.seed for r in greedy} == {0}
    keys = [t.key for t in read_turns(store)]
    assert len(keys) == len(set(keys)) == ITEMS * (1 + SAMPLES)


def test_new_run_seed_resamples_but_reuses_greedy_turns(gsm_file, tmp_path):
    run(experiment(gsm_file, tmp_path), ScriptedBackend(script))
    reseeded = ScriptedBackend(script)
    run(experiment(gsm_file, tmp_path, seed=7), reseeded)
    # Only the sampled user turns depend on the run seed; greedy ones are served from the store.
    assert reseeded.calls == ITEMS * SAMPLES
    assert all(r.params.temperature > 0 for r in reseeded.requests)


def test_failed_requests_are_stored_counted_and_retried(gsm_file, tmp_path):
    exp = experiment(gsm_file, tmp_path)
    flaky = ScriptedBackend(script, fail=lambda r: is_user_turn(r) and r.seed % 3 == 0)
    rows = load_run(run(exp, flaky)).summary()
    failed = sum(row.errors for row in rows)
    greedy = next(row for row in rows if row.temperature == 0)
    assert greedy.errors == ITEMS  # greedy seeds are 0: every one failed
    assert failed >= ITEMS
    healed = ScriptedBackend(script)
    rows = load_run(run(exp, healed)).summary()
    assert healed.calls == failed  # only the failures are asked again
    assert sum(row.errors for row in rows) == 0


def test_table_reports_rates_labels_and_accuracy(gsm_file, tmp_path):
    rows = load_run(run(experiment(gsm_file, tmp_path), ScriptedBackend(script))).summary()
    greedy, sampled = rows
    assert (greedy.temperature, sampled.temperature) == (0.0, 1.0)
    assert greedy.labels == {"generic": ITEMS} and greedy.follow_up.value == 0
    assert sampled.turns == ITEMS * SAMPLES and sampled.items == ITEMS
    assert greedy.accuracy.hits == 3 and greedy.accuracy.n == ITEMS
    assert greedy.accuracy.low <= 0.5 <= greedy.accuracy.high


def test_stored_generation_keeps_prompt_template_hash_and_raw_text(gsm_file, tmp_path):
    backend = ScriptedBackend(script)
    store = run(experiment(gsm_file, tmp_path), backend)
    row = store.db.execute("SELECT * FROM generations WHERE role = 'user' LIMIT 1").fetchone()
    assert row["prompt"].endswith("<|im_end|>\n<|im_start|>user\n")
    assert "<|im_start|>assistant\n" in row["prompt"]
    assert row["template_hash"] == backend.template.hash
    assert json.loads(row["stop"])[0] == "<|im_end|>"
    assert row["raw_text"].endswith("<|im_end|>")
    meta = store.meta()
    assert meta.config["samples"] == SAMPLES and "userturn" in meta.versions


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_export_has_one_row_per_user_turn(gsm_file, tmp_path, fmt):
    store = run(experiment(gsm_file, tmp_path), ScriptedBackend(script))
    out = tmp_path / f"turns.{fmt}"
    assert export_user_turns(read_turns(store), out, fmt) == ITEMS * (1 + SAMPLES)
    if fmt == "jsonl":
        records = [json.loads(line) for line in out.read_text().splitlines()]
    elif fmt == "csv":
        import csv

        records = list(csv.DictReader(out.open()))
    else:
        import pyarrow.parquet as pq

        records = pq.read_table(out).to_pylist()
    assert len(records) == ITEMS * (1 + SAMPLES)
    first = records[0]
    assert first["query"].startswith("Tom has 3 boxes") and first["user_turn"]
    assert first["label"] in ("generic", "follow_up") and first["prompt"]
    assert not (tmp_path / f"turns.{fmt}.partial").exists()


def test_engine_arguments_from_the_config_reach_the_backend(tmp_path: Path, gsm_file: Path,
                                                            monkeypatch) -> None:
    """backend_args (e.g. vLLM's tensor_parallel_size) go from the experiment to load_backend."""
    import userturn.backends as backends

    seen: dict = {}

    def fake_load(spec, **kwargs):
        seen[spec] = kwargs["backend_args"]
        return ScriptedBackend(lambda r: "Why 26?<|im_end|>", spec=spec)

    monkeypatch.setattr(backends, "load_backend", fake_load)
    exp = Experiment(models=["vllm/some-model"], datasets=[f"gsm8k:{gsm_file}"], limit=1,
                     temperatures=[0.0], backend_args={"tensor_parallel_size": 2},
                     output=tmp_path / "run")
    run_experiment(exp).close()
    assert seen == {"vllm/some-model": {"tensor_parallel_size": 2}}
