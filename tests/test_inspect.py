"""Inspect: a run's log read back by Inspect's own reader and samples_df, and the
userturn.inspect scorer in a real inspect_ai.eval with Inspect's mock model."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import experiment, fake_probe_run, run_scripted, undecided_script

from userturn.backends.fake import ScriptedBackend
from userturn.cli.main import main
from userturn.errors import UserturnError
from userturn.store.database import RunStore

ROOT = Path(__file__).resolve().parents[1]

# Three threads label at once with the default classifier, in a fresh interpreter (transformers
# not yet imported, as in a new Inspect eval); then the same turns one by one.
THREADED_LABELS = """
import json, threading
from userturn.labels.classifier import LearnedClassifier
from userturn.labels.rules import RulesClassifier
from userturn.records import Case
query, answer = "Sam has 4 apples and buys 6 more. How many?", "4 + 6 = 10. #### 10"
cases = [Case(query, answer, text) for text in ("Is that right? I am not sure.",
         "Hmm, could be. I wonder about it.", "Maybe so, let me see later.")]
assert all(RulesClassifier().classify(case).label is None for case in cases)
classifier, start, found = LearnedClassifier(), threading.Barrier(3), {}
def label(i):
    start.wait()
    found[i] = classifier.classify(cases[i])
threads = [threading.Thread(target=label, args=(i,)) for i in range(3)]
[thread.start() for thread in threads]
[thread.join() for thread in threads]
print(json.dumps({"threaded": [[found[i].label, found[i].error] for i in range(3)],
                  "alone": [classifier.classify(case).label for case in cases]}))
"""


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inspect")
    return fake_probe_run(folder, system_prompt="Be brief.", perturbations=["truncate"])


def test_the_log_reads_back_in_inspect_with_turns_labels_and_rates(fake_run, tmp_path, capsys):
    log_module = pytest.importorskip("inspect_ai.log")
    out = tmp_path / "run.eval"
    assert main(["export", str(fake_run.folder), "--format", "inspect", "--out", str(out)]) == 0
    assert "wrote 18 samples" in capsys.readouterr().out
    log = log_module.read_eval_log(str(out))
    turns = {t.key: t for t in fake_run.turns()}
    assert log.status == "success" and log.eval.model == "fake/probe"
    assert {s.id for s in log.samples} == set(turns)
    for sample in log.samples:
        turn = turns[sample.id]
        roles = [m.role for m in sample.messages]
        assert roles == ["system", "user", "assistant", "user"]
        assert sample.messages[-1].text == turn.user_turn  # the generated user turn is last
        assert sample.messages[1].text == turn.query and sample.messages[2].text == turn.answer
        # One score per sample, as userturn.inspect's scorer gives it; every source's label
        # in its metadata, the condition in the sample's.
        assert set(sample.scores) == {"user_turn_label"}
        score = sample.scores["user_turn_label"]
        assert score.value == turn.status and score.metadata["label"] == turn.status
        assert score.metadata["follow_up"] == (1.0 if turn.follow_up else 0.0)
        assert score.metadata["labels"] == {
            lab.source: lab.label or ("error" if lab.error else "undecided")
            for lab in turn.labels}
        assert sample.metadata["temperature"] == turn.temperature
        assert sample.metadata["perturbation"] == turn.perturbation
        assert sample.metadata["item_id"] == turn.item_id
        assert sample.metadata["condition"] == (
            f"fake_probe_mini_t{turn.temperature:g}"
            + ("" if turn.perturbation == "none" else f"_{turn.perturbation}"))
    rows = {(r.temperature, r.perturbation): r for r in fake_run.summary()}
    (result,) = log.results.scores  # the aggregates are the one score's metrics
    assert result.name == result.scorer == "user_turn_label"
    assert list(result.metrics)[:3] == ["follow_up_rate", "ci_low", "ci_high"]  # the headline
    by_condition = [m for m in result.metrics.values() if m.group == "follow_up_rate"]
    assert len(by_condition) == len(rows)
    for metric in by_condition:
        row = rows[(metric.metadata["temperature"], metric.metadata["perturbation"])]
        assert metric.value == pytest.approx(row.follow_up.value)
        assert metric.metadata["ci_low"] == pytest.approx(row.follow_up.low)
        assert metric.metadata["turns"] == row.follow_up.n
        assert {s.metadata["condition"] for s in log.samples
                if (s.metadata["temperature"], s.metadata["perturbation"])
                == (row.temperature, row.perturbation)} == {metric.name}


def test_a_source_that_abstained_is_undecided_not_invalid(gsm_file, tmp_path):
    log_module = pytest.importorskip("inspect_ai.log")
    exp = experiment(gsm_file, tmp_path, labeller="rules")
    run_scripted(exp, ScriptedBackend(undecided_script)).close()
    out = tmp_path / "run.eval"
    assert main(["export", str(exp.plan.output), "--format", "inspect", "-o", str(out)]) == 0
    scores = [s.scores["user_turn_label"] for s in log_module.read_eval_log(str(out)).samples]
    abstained = [s for s in scores if s.value == "undecided"]
    assert abstained and len(abstained) < len(scores)  # the sampled turns: rules undecided
    assert all(s.metadata["labels"]["rules"] == "undecided" for s in abstained)
    assert not any(s.metadata["labels"]["rules"] in ("invalid", "error") for s in scores)


def test_samples_df_reads_the_log(fake_run, tmp_path):
    analysis = pytest.importorskip("inspect_ai.analysis")
    out = tmp_path / "run.eval"
    assert main(["export", str(fake_run.folder), "--format", "inspect", "--out", str(out)]) == 0
    frame = analysis.samples_df(str(out))
    turns = {t.key: t for t in fake_run.turns()}
    assert sorted(frame["id"]) == sorted(turns)
    for _, row in frame.iterrows():
        turn = turns[row["id"]]
        assert row["score_user_turn_label"] == turn.status
        assert row["metadata_model"] == "fake/probe"
        assert row["metadata_condition"].startswith("fake_probe_mini_t")
    # Not a score per condition flattened into names: one score, grouped by its metadata.
    assert not [c for c in frame.columns if c.startswith("score_") and "mini" in c]


def test_evals_df_has_a_pooled_headline_one_word_columns_ids_and_tokens(fake_run, tmp_path):
    analysis = pytest.importorskip("inspect_ai.analysis")
    log_module = pytest.importorskip("inspect_ai.log")
    out = tmp_path / "run.eval"
    assert main(["export", str(fake_run.folder), "--format", "inspect", "-o", str(out)]) == 0
    frame = analysis.evals_df(str(out))
    row = frame.iloc[0]
    assert not [c for c in frame.columns if " " in c or "=" in c]
    turns = fake_run.turns()
    assert row["score_headline_score"] == "user_turn_label"
    assert row["score_headline_metric"] == "follow_up_rate"  # every condition, pooled
    assert row["score_headline_value"] == pytest.approx(
        sum(t.follow_up for t in turns) / len(turns))
    assert row["score_user_turn_label_fake_probe_mini_t0_truncate"] >= 0  # a condition's rate
    assert not [c for c in frame.columns if c.endswith("_ci_high") and "mini" in c]
    assert row["run_id"] and row["task_id"]
    again = tmp_path / "again.eval"
    assert main(["export", str(fake_run.folder), "-o", str(again)]) == 0
    assert analysis.evals_df(str(again)).iloc[0]["run_id"] == row["run_id"]  # the same run
    store = RunStore.read(fake_run.folder)
    generations = store.generations([t.key for t in turns])
    store.close()
    sent = sum(g.generation.prompt_tokens for g in generations.values())
    written = sum(g.generation.completion_tokens for g in generations.values())
    assert sent > 0 and written > 0
    log = log_module.read_eval_log(str(out))
    usage = log.stats.model_usage["fake/probe"]
    assert (usage.input_tokens, usage.output_tokens) == (sent, written)
    for sample in log.samples:
        generation = generations[sample.id].generation
        assert sample.model_usage["fake/probe"].output_tokens == generation.completion_tokens


def test_a_log_file_must_end_in_eval_or_json(fake_run, tmp_path, capsys):
    pytest.importorskip("inspect_ai")
    assert main(["export", str(fake_run.folder), "--format", "inspect", "--out",
                 str(tmp_path / "run.txt")]) == 2
    assert "an Inspect log is a .eval (or .json) file" in capsys.readouterr().err


def test_the_scorer_labels_simulated_user_turns_in_a_real_eval(tmp_path):
    pytest.importorskip("inspect_ai")
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import (
        ChatMessageAssistant,
        ChatMessageUser,
        ModelOutput,
        ModelUsage,
        get_model,
    )

    from userturn.inspect import user_turn_label
    from userturn.labels.rules import RulesClassifier
    from userturn.records import Case


    query = "Tom has 3 boxes of 12 pencils and gives away 10. How many are left?"
    answer = "3 x 12 = 36 pencils, and 36 - 10 = 26. The answer is 26."
    turns = ["Why did you subtract 10 from 36?", "", "Why did you subtract 10 from 36?",
             "What is the capital of France?"]
    expected = [RulesClassifier().classify(Case(query, answer, t)).label for t in turns]
    assert None not in expected and expected.count("follow_up") == 2  # the rules decide all
    # A usage on each output: without one the mock model counts tokens with tiktoken, which
    # downloads its encoding.
    usage = ModelUsage(input_tokens=20, output_tokens=8, total_tokens=28)
    model = get_model("mockllm/model", custom_outputs=[
        ModelOutput.from_content("mockllm/model", t).model_copy(update={"usage": usage})
        for t in turns])
    samples = [Sample(id=i, input=[ChatMessageUser(content=query),
                                   ChatMessageAssistant(content=answer)], target="")
               for i in range(len(turns))]
    task = Task(dataset=samples, solver=[simulate_user()], scorer=user_turn_label("rules"))
    # Inspect's eval starts its own event loop, which asyncio refuses inside a running one; the
    # browser tests' Playwright keeps one running on the main thread for the whole session (as a
    # notebook does), so the eval runs on a thread of its own, as a script's would.
    with ThreadPoolExecutor(max_workers=1) as pool:
        log, = pool.submit(eval, task, model=model, log_dir=str(tmp_path / "logs"),
                           display="none").result()
    assert log.status == "success", log.error
    by_id = {s.id: s for s in log.samples}
    assert [by_id[i].scores["user_turn_label"].value for i in range(len(turns))] == expected
    assert by_id[0].scores["user_turn_label"].metadata["source"] == "rules"
    metrics = log.results.scores[0].metrics
    assert metrics["follow_up_rate"].value == pytest.approx(2 / 4)


def test_the_scorer_says_why_a_sample_has_no_turn_to_label():
    pytest.importorskip("inspect_ai")
    from userturn.inspect import last_user_turn

    assert last_user_turn([("user", "q")]) == ("no assistant message before the last user "
                                               "message")
    assert last_user_turn([("assistant", "a")]) == "no user message to label"
    case = last_user_turn([("system", "s"), ("user", "q"), ("assistant", "a"), ("user", " u ")])
    assert (case.query, case.answer, case.user_turn) == ("q", "a", "u")


def test_an_unknown_labeller_is_one_line():
    pytest.importorskip("inspect_ai")
    from userturn.inspect import user_turn_label

    with pytest.raises(UserturnError, match="unknown labeller 'vibes'"):
        user_turn_label("vibes")


def test_without_inspect_ai_one_line_says_what_to_install(fake_run, tmp_path, capsys,
                                                          monkeypatch):
    # Hidden as if not installed, with every submodule an earlier test imported.
    for name in ["inspect_ai", "inspect_ai.log",
                 *[n for n in sys.modules if n.startswith("inspect_ai.")]]:
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["export", str(fake_run.folder), "--format", "inspect", "--out",
                 str(tmp_path / "run.eval")]) == 2
    assert capsys.readouterr().err.strip() == (
        "userturn: error: the Inspect log export needs inspect_ai: pip install "
        "'userturn[inspect]'")
    for name in [n for n in sys.modules if n.startswith(("userturn.inspect",
                                                         "userturn.integrations.inspect_"))]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(UserturnError, match=r"pip install 'userturn\[inspect\]'"):
        importlib.import_module("userturn.inspect")


@pytest.mark.slow
def test_the_default_classifier_labels_from_several_threads_at_once():
    """Inspect scores samples concurrently: the context scorer is loaded once and read by one
    thread at a time (threads that import transformers at once failed with an ImportError of
    AutoModelForCausalLM, and concurrent reads of one scorer gave other numbers)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", THREADED_LABELS], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert [error for _, error in found["threaded"]] == [None, None, None]
    assert [label for label, _ in found["threaded"]] == found["alone"]


def test_the_scorer_labels_a_simulated_user_of_ours_in_a_real_concurrent_eval(tmp_path, capsys):
    """userturn/tiny writes the user turns (no download), four samples at once; every sample is
    labelled, as `userturn classify` labels the same turns."""
    pytest.importorskip("inspect_ai")
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser

    from userturn.inspect import user_turn_label


    pairs = [("What is 2 + 2?", "2 + 2 = 4."), ("Name a prime number.", "7 is prime."),
             ("How many days are in a week?", "Seven."), ("Spell cat.", "C-A-T.")]
    samples = [Sample(id=i, input=[ChatMessageUser(content=q), ChatMessageAssistant(content=a)])
               for i, (q, a) in enumerate(pairs)]
    task = Task(dataset=samples, solver=[simulate_user()],
                scorer=user_turn_label(classifier="form"))
    with ThreadPoolExecutor(max_workers=1) as pool:  # see the test above: a loop of its own
        log, = pool.submit(eval, task, model="userturn/tiny", max_samples=4,
                           log_dir=str(tmp_path / "logs"), display="none").result()
    assert log.status == "success", log.error
    assert log.eval.model == "userturn/tiny"
    by_id = {s.id: s for s in log.samples}
    turns = [by_id[i].messages[-1].text for i in range(len(pairs))]
    assert all(by_id[i].messages[-1].role == "user" for i in range(len(pairs)))
    scored = [by_id[i].scores["user_turn_label"] for i in range(len(pairs))]
    rows = tmp_path / "turns.jsonl"
    rows.write_text("".join(json.dumps({"query": q, "answer": a, "user_turn": t}) + "\n"
                            for (q, a), t in zip(pairs, turns)), encoding="utf-8")
    assert main(["classify", str(rows), "--classifier", "form", "-o",
                 str(tmp_path / "labelled.jsonl")]) == 0
    expected = [json.loads(line)["label"] for line in
                (tmp_path / "labelled.jsonl").read_text(encoding="utf-8").splitlines()]
    assert None not in expected  # the cascade labels every turn
    assert [score.value for score in scored] == expected
    # a label is never averaged into a number (Inspect's mean reducer made each one 0.0, with a
    # warning per sample): the metric reads the scores as they are
    assert [s.value for r in (log.reductions or []) for s in r.samples
            if not isinstance(s.value, str)] == []


def simulate_user():
    """An Inspect solver: the model writes the next user turn, appended as a user message."""
    from inspect_ai.model import ChatMessageUser, get_model
    from inspect_ai.solver import solver

    @solver
    def simulate_user():
        async def solve(state, generate):
            output = await get_model().generate(state.messages)
            state.messages.append(ChatMessageUser(content=output.completion))
            return state
        return solve
    return simulate_user()
