"""executor: ray on a local Ray cluster (num_cpus=2, one per module): the same stores as the local
executor, and the failures a cluster has (a dead actor, a hung unit, a unit that always fails)
end with nothing lost and nothing duplicated. Skipped without ray (pip install 'userturn[ray]')."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from userturn.backends import BackendSpec
from userturn.config import Experiment
from userturn.probe.pipeline import run_experiment

ray = pytest.importorskip("ray", reason="pip install 'userturn[ray]'")
pytestmark = pytest.mark.ray
TESTS = Path(__file__).parent


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local cluster for the module (starting one takes 5-20 s on 2 cores); the fault
    backends (tests/ray_faults.py) must be importable in its workers."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_AUTH_MODE")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), saved["PYTHONPATH"]) if p)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def stored(folder: Path) -> dict[str, list[tuple]]:
    """Everything a run stores but the times it stored it and its config."""
    with sqlite3.connect(folder / "userturn.db") as db:
        columns = [r[1] for r in db.execute("PRAGMA table_info(generations)") if r[1] != "created"]
        return {
            "generations": db.execute(f"SELECT {', '.join(columns)} FROM generations "
                                      "ORDER BY key").fetchall(),
            "plan": db.execute("SELECT * FROM plan ORDER BY key").fetchall(),
            "labels": db.execute("SELECT key, source, version, label FROM labels "
                                 "ORDER BY key, source").fetchall(),
            "scores": db.execute("SELECT * FROM scores ORDER BY key").fetchall()}


def ray_run(exp: Experiment, specs: list[BackendSpec], **settings) -> dict:
    from userturn.probe.ray_executor import RayExecutor

    with RayExecutor(specs, **settings) as executor:
        run_experiment(exp, backends=executor.backends, executor=executor).close()
        return {"restarts": executor.restarts}


def experiment(tmp_path: Path, gsm_file: Path, name: str, model: str = "tiny") -> Experiment:
    return Experiment(models=[model], datasets=[f"gsm8k:{gsm_file}"], limit=6,
                      temperatures=[0.0, 1.0], samples=3, max_tokens=12, user_max_tokens=12,
                      batch_size=2, seed=3, output=tmp_path / name)


def test_local_and_ray_runs_store_the_same_generations(tmp_path, gsm_file):
    """Two transformers actors on the tiny model, units of 5 in two lanes: greedy answers and
    user turns, and seeded samples, exactly as in process."""
    local = experiment(tmp_path, gsm_file, "local")
    run_experiment(local).close()
    remote = experiment(tmp_path, gsm_file, "ray")
    ray_run(remote, [BackendSpec("tiny", batch_size=2)], replicas=2, unit_size=5)
    a, b = stored(local.plan.output), stored(remote.plan.output)
    assert len(a["generations"]) == 6 * (1 + 1 + 3)
    assert any(row[7] == 1.0 for row in a["generations"])  # sampled turns are compared too
    assert a == b


def test_the_continuation_arm_on_ray_stores_what_it_stores_in_process(tmp_path, gsm_file):
    """Both arms on two tiny-model actors: the continuations, their readings and their next-role
    probabilities (scored by a replica) are those of the run in process."""
    local = experiment(tmp_path, gsm_file, "arms-local").model_copy(
        update={"arms": ["opened", "continuation"], "limit": 3})
    run_experiment(local).close()
    remote = experiment(tmp_path, gsm_file, "arms-ray").model_copy(
        update={"arms": ["opened", "continuation"], "limit": 3})
    ray_run(remote, [BackendSpec("tiny", batch_size=2)], replicas=2, unit_size=5)
    a, b = stored(local.plan.output), stored(remote.plan.output)
    assert a == b
    with sqlite3.connect(local.plan.output / "userturn.db") as db:
        readings = db.execute("SELECT * FROM continuations ORDER BY key").fetchall()
    with sqlite3.connect(remote.plan.output / "userturn.db") as db:
        assert db.execute("SELECT * FROM continuations ORDER BY key").fetchall() == readings
    assert len(readings) == 3 * (1 + 3) and all(row[4] is not None for row in readings)


def fault_run(tmp_path, gsm_file, factory, **settings):
    marker = tmp_path / "fault.log"
    exp = experiment(tmp_path, gsm_file, factory, model="fake/probe")
    spec = BackendSpec("fake/probe", batch_size=2, factory=f"ray_faults:{factory}",
                       backend_args={"marker": str(marker), "poison": "Mia reads"})
    counts = ray_run(exp, [spec], replicas=1, unit_size=4, **settings)
    clean = experiment(tmp_path, gsm_file, f"clean-{factory}", model="fake/probe")
    run_experiment(clean).close()
    return stored(exp.plan.output), stored(clean.plan.output), counts, marker


def test_an_actor_killed_mid_unit_is_restarted_and_its_unit_retried(tmp_path, gsm_file):
    got, clean, counts, marker = fault_run(tmp_path, gsm_file, "dying", max_restarts=2)
    assert marker.read_text().startswith("die")  # the fault did happen
    assert counts["restarts"] == 1
    assert got == clean  # nothing lost, nothing duplicated, no error left
    assert len({row[0] for row in got["generations"]}) == len(got["plan"])


def test_a_hung_unit_is_timed_out_and_requeued(tmp_path, gsm_file):
    got, clean, counts, marker = fault_run(tmp_path, gsm_file, "hanging", unit_timeout=4.0)
    assert marker.read_text().startswith("hang")
    assert counts["restarts"] == 1
    assert got == clean


def test_a_unit_that_always_fails_is_stored_as_errors_and_the_run_goes_on(tmp_path, gsm_file):
    got, clean, counts, marker = fault_run(tmp_path, gsm_file, "poisoned", unit_retries=1,
                                           max_restarts=4)
    assert marker.read_text().count("died") == 2  # the first try and one retry, then no more
    errors = [row for row in got["generations"] if row[-2] is not None]
    assert errors and all("gave up on the unit after 2 failed attempts" in row[-2]
                          for row in errors)
    failed = {row[0] for row in errors}
    # Only the poisoned unit's answers failed (their items get no user turns); everything else
    # is as in a clean run.
    reference = {row[0]: row for row in clean["generations"]}
    assert all(row == reference[row[0]] for row in got["generations"] if row[0] not in failed)
    assert 0 < len(failed) <= 4 and len(got["generations"]) > len(failed)


def test_a_model_no_replica_can_build_is_one_clear_error():
    from userturn.errors import ModelError
    from userturn.probe.ray_executor import RayExecutor

    with pytest.raises(ModelError, match="a replica of no-such-model could not build its "
                       "backend: .*unknown model 'no-such-model'"):
        RayExecutor([BackendSpec("no-such-model")], replicas=1)
