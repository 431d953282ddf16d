"""The executor seam without Ray: work units keep an item on one lane, the local path never
imports Ray, ``executor: ray`` without Ray is one clear error, and several OpenAI-compatible
servers of one model share the requests within a bound per server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from openai_fake import Answer, FakeOpenAI

from userturn.backends.openai import OpenAICompletionsBackend
from userturn.config import load_experiment
from userturn.probe.executor import cut_units
from userturn.records import GenerationParams, Request

RUN = ["run", "--model", "fake/probe", "--dataset", "gsm_symbolic", "--limit", "2",
       "--temperatures", "0", "--max-tokens", "8", "--user-max-tokens", "8"]


def test_units_keep_each_item_on_one_lane_in_every_stage():
    """A replica finds an item's answer in its prefix cache only if the item's user turns come
    to it too: the lane depends on the item alone, however the stage cuts its units."""
    params = GenerationParams()
    answers = [(f"a{i}", Request(f"q{i}" * i, params), f"d|{i}") for i in range(40)]
    turns = [(f"u{i}.{s}", Request(f"q{i}a{s}", params), f"d|{i}") for i in range(40)
             for s in range(5)]
    lanes = {}
    for work, size in ((answers, 7), (turns, 16)):
        units = cut_units("m", work, size, lanes=3)
        assert all(len(u.keys) <= size for u in units)
        assert sorted(k for u in units for k in u.keys) == sorted(w[0] for w in work)
        item = {key: entry[2] for entry in work for key in [entry[0]]}
        for unit in units:
            for key in unit.keys:
                assert lanes.setdefault(item[key], unit.lane) == unit.lane
    assert set(lanes.values()) == {0, 1, 2}


def test_the_local_executor_never_imports_ray(tmp_path):
    code = ("import sys; from userturn.cli.main import main; code = main(sys.argv[1:]); "
            "assert 'ray' not in sys.modules, 'ray was imported'; sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, *RUN, "--output", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_executor_ray_without_ray_is_one_clear_error(tmp_path):
    code = ("import sys; sys.modules['ray'] = None; from userturn.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, *RUN, "--executor", "ray",
                           "--output", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "userturn: error: executor ray needs Ray: pip install 'userturn[ray]'"]
    assert not (tmp_path / "r").exists()


def test_base_url_flags_and_settings(tmp_path):
    exp = load_experiment(None, {"base_url": ["http://a/v1", "http://b/v1"],
                                 "endpoint_concurrency": 3, "executor": "ray", "replicas": 2,
                                 "gpus_per_replica": 4})
    assert exp.engine.base_url == ["http://a/v1", "http://b/v1"]
    assert exp.engine.endpoint_concurrency == 3
    assert load_experiment(None, {"base_url": ["http://a/v1"]}).engine.base_url == "http://a/v1"
    config = tmp_path / "bad.yaml"
    config.write_text("executor: slurm\n")
    try:
        load_experiment(config, {})
    except Exception as exc:
        assert "executor" in str(exc)
    else:
        raise AssertionError("executor: slurm was accepted")


def test_several_servers_share_the_requests_within_their_bound():
    slow = lambda request: Answer(delay=0.05)  # noqa: E731
    with FakeOpenAI(responder=slow) as one, FakeOpenAI(responder=slow) as two:
        pool = OpenAICompletionsBackend("tiny-served", base_url=[one.url, two.url],
                                        tokenizer="tiny", concurrency=2, timeout=5.0)
        requests = [Request(f"prompt {i}", GenerationParams(1.0, 1.0, 8), ("<|im_end|>",), i)
                    for i in range(24)]
        pooled = pool.complete(requests)
        assert len(one.completions) > 1 and len(two.completions) > 1
        assert one.max_in_flight <= 2 and two.max_in_flight <= 2
        assert len(one.completions) + len(two.completions) == 24 + 2  # and one probe each
        alone = OpenAICompletionsBackend("tiny-served", base_url=one.url, tokenizer="tiny",
                                         timeout=5.0)
        assert pooled == alone.complete(requests)  # the same model: the same completions
        first = one.url
    # Keyed by model and tokenizer, not by address: servers can come and go between runs.
    assert pool.revision.startswith("openai:pool:tiny-served")
    assert alone.revision.startswith(f"openai:{first}:tiny-served")
    assert pool.chunk_size == 2 * alone.chunk_size


def test_the_documented_70b_experiment_file_is_valid():
    exp = load_experiment(Path(__file__).parent.parent / "examples" / "ray_70b_tp4.yaml", {})
    assert (exp.engine.executor, exp.engine.replicas, exp.engine.gpus_per_replica) == ("ray", 2, 4)
    assert exp.engine.backend_args["tensor_parallel_size"] == 4
