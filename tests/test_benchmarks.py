"""Every script in benchmarks/ runs: each is run on the tiny model with the smallest arguments and
must finish and print its figure line. A signature change inside userturn then fails here, not in
the README's performance command.

A script runs in this process (imported by path, its ``main(argv)`` called), so torch is imported
once per test session rather than once per script; only the scripts that start a Ray cluster or
take a GPU run as their own process, as `make bench` starts them. GPU scripts are marked ``gpu``
and skip without CUDA; scripts that need an optional package (ray, lm-eval) skip when it is
absent."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


@dataclass(frozen=True)
class Smoke:
    """How to smoke-run one script: its arguments, the line its figure is printed on, and what it
    needs beyond the default install."""

    args: tuple[str, ...]
    figure: str  # a regular expression one line of stdout must match
    needs: tuple[str, ...] = ()  # importable modules; absent: skip
    gpu: bool = False
    # A Ray cluster or a CUDA context would outlive the script inside this process.
    own_process: bool = False
    # Tens of seconds even at smoke size (child processes, a training loop): run in
    # `make test-slow` (CI runs it too), so `make test` stays under five minutes.
    slow: bool = False


TINY = ("--model", "tiny", "--items", "2", "--max-tokens", "4", "--repeats", "1")
NUMBER = r"-?\d+(\.\d+)?"

SMOKES = {
    "overhead.py": Smoke(TINY, rf"^greedy +userturn +{NUMBER}s +bare generate +{NUMBER}s +"
                               rf"ratio {NUMBER} \(median ratio {NUMBER}\)$"),
    "arms_cost.py": Smoke(("--model", "tiny", "--items", "2", "--samples", "1",
                           "--user-max-tokens", "4", "--continuation-max-tokens", "6"),
                          rf"^continuation / opened time: {NUMBER}$"),
    "rows_busy.py": Smoke(("--model", "tiny", "--items", "2", "--samples", "1", "--max-tokens",
                           "4", "--repeats", "1"), rf"^useful throughput ratio: {NUMBER}$"),
    "backends.py": Smoke(("--backend", "transformers", *TINY, "--greedy-only"),
                         rf"^greedy +userturn +{NUMBER} tok/s +bare +{NUMBER} tok/s +ratio "
                         rf"{NUMBER} \(median\) .* wall-time ratio {NUMBER} +\[\d+ vs \d+ tokens\]$"),
    "lmeval_compare.py": Smoke(TINY, rf"ratio userturn/lm-eval {NUMBER} +identical answers \d+/2$",
                               needs=("lm_eval",)),
    "labelling_cost.py": Smoke(("--model", "tiny", "--items", "1", "--samples", "1",
                                "--max-tokens", "4"),
                               rf"^labelling / generation time: {NUMBER}$"),
    "labelling_speed.py": Smoke(("--model", "tiny", "--turns", "3", "--batch-size", "2",
                                 "--repeats", "1"),
                                rf"^one at a time +{NUMBER} turns/s +batched +{NUMBER} turns/s +"
                                rf"speed-up {NUMBER}x +largest feature difference "
                                rf"\d\.\de[+-]\d+$"),
    # Runs on any machine: without CUDA its CUDA parts print SKIP and the rest runs on the CPU.
    "gpu_check.py": Smoke(("--model", "tiny", "--items", "2", "--max-tokens", "4", "--batches",
                           "2", "--turns", "2", "--train-size", "tiny", "--train-steps", "2",
                           "--repeats", "1"), r"^gpu check done in \d+ s$"),
    "coverage.py": Smoke(("--runs", "20", "--resamples", "20"),
                         rf"^clustered Wilson: coverage min {NUMBER}, mean {NUMBER}, max "
                         rf"{NUMBER} over \d+ designs, 20 runs each$"),
    # The test split: the shipped labellers (the dev split fits every family, minutes on a CPU).
    "classifier_compare.py": Smoke(("--split", "test", "--limit", "60"),
                                   rf"^  cascade +\[{NUMBER}, {NUMBER}\] +\[{NUMBER}, {NUMBER}\]"),
    # The docs' table: every family, the context readers from the shipped corpus readings.
    "leave_one_model_out.py": Smoke(("--context", "--limit", "150", "--bootstrap", "5"),
                                    rf"^\| smollm2 \| cascade \(\+context\+hidden\) \| \d+ \| {NUMBER} "
                                    rf"\[{NUMBER}, {NUMBER}\]"),
    # A few turns through the frozen model, one epoch of the adapters per fold.
    "finetuned_lomo.py": Smoke(("--limit", "40", "--epochs", "1", "--bootstrap", "5"),
                               rf"^\| smollm2 \| cascade \(LoRA top layers\) \| \d+ \| {NUMBER} "
                               rf"\[{NUMBER}, {NUMBER}\]", slow=True),
    # The rubric does not fit the tiny model's context: every verdict is an error label, counted.
    "judge_quality.py": Smoke(("--judge", "tiny", "--limit", "3", "--bootstrap", "5"),
                              r"^\| all \| 3 \| 3 \| - \|"),
    # Six of people's corpus turns as the held-out set, a judge that is always right.
    "unseen_people.py": Smoke(("--bootstrap", "5"),
                              rf"^\| cascade \| 6 \| {NUMBER} \[{NUMBER}, {NUMBER}\]"),
    "offline_error_card.py": Smoke((str(ROOT / "corpus" / "lomo_round10.txt"),),
                                   r'^ "source": "benchmarks/leave_one_model_out.py --context'),
    "busy_refusal.py": Smoke(("--repeats", "1"),
                             rf"^busy folder refused in {NUMBER}s \(median of 1, slowest "
                             rf"{NUMBER}s; target < 1s\)$"),
    "calibration_demo.py": Smoke(("--size", "3"), rf"^gsm +none +T=0 +{NUMBER}% +\(\d+ of 4\)$"),
    # The corpus's committed Qwen runs, a few draws per condition.
    "sample_plan.py": Smoke(("--draws", "10"),
                            rf"^planned conditions: \d+, mean half-width within the promise in "
                            rf"\d+; .* coverage min {NUMBER}, mean {NUMBER}, max {NUMBER}; widest "
                            rf"\+- planned allocation {NUMBER} vs equal split {NUMBER} points$"),
    "soak.py": Smoke(("--kills", "1", "--items", "2", "--samples", "1", "--max-delay", "1"),
                     r'^  "ok": true$', slow=True),
    "ray_scaling.py": Smoke(("--limit", "2", "--samples", "1", "--max-tokens", "4",
                             "--unit-size", "2"),
                            rf"^ratio 2 actors / 1 actor: {NUMBER}$", needs=("ray",),
                            own_process=True),
    "gpu_smoke.py": Smoke(("--max-tokens", "4"), r"^PASS transformers cuda greedy == cpu greedy",
                          needs=("torch",), gpu=True, own_process=True),
    "gpu_train.py": Smoke(("--size", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len",
                           "64", "--new-tokens", "4"), r'^\{"size": "tiny", "params": \d+',
                          needs=("torch", "peft"), gpu=True, own_process=True),
    "gpu_ray_vllm.py": Smoke(("--limit", "2", "--samples", "1", "--max-tokens", "4"),
                             r"^PASS both runs stored every planned generation$",
                             needs=("ray", "vllm"), gpu=True, own_process=True),
}


def test_every_benchmark_script_has_a_smoke_run():
    """A new script in benchmarks/ must get its smoke arguments here."""
    assert sorted(p.name for p in BENCHMARKS.glob("*.py")) == sorted(SMOKES)


def test_benchmarks_import_no_private_userturn_name():
    private = re.compile(r"^\s*from userturn[\w.]* import .*\b_\w+|userturn[\w.]*\._\w+", re.M)
    offenders = {p.name: private.findall(p.read_text()) for p in BENCHMARKS.glob("*.py")}
    assert {name: found for name, found in offenders.items() if found} == {}


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _params() -> list:
    return [pytest.param(name, marks=[*([pytest.mark.gpu] if smoke.gpu else []),
                                      *([pytest.mark.slow] if smoke.slow else [])],
                         id=name.removesuffix(".py")) for name, smoke in sorted(SMOKES.items())]


def run_script(name: str, args: tuple[str, ...], cwd: Path) -> str:
    """The script as its own process: the working tree's userturn, whatever is installed, offline
    as `make bench` on a clean clone. Its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    result = subprocess.run([sys.executable, str(BENCHMARKS / name), *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def import_script(name: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The script imported by path (``sys.path`` and ``sys.modules`` restored after the test)."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # a script may add its own folder
    spec = importlib.util.spec_from_file_location(f"benchmark_{name.removesuffix('.py')}",
                                                  BENCHMARKS / name)
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    # Registered as Python registers an imported module: dataclasses (and pickling) look the
    # script's module up by name while it is being executed.
    monkeypatch.setitem(sys.modules, spec.name, script)
    spec.loader.exec_module(script)
    return script


def run_in_process(name: str, args: tuple[str, ...], cwd: Path,
                   monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """The script imported by path and its ``main(argv)`` called here. Its stdout."""
    monkeypatch.chdir(cwd)
    script = import_script(name, monkeypatch)
    # A script may pin torch's threads for its own timing; the rest of the session keeps its own.
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None
    try:
        code = script.main(list(args))
    finally:
        torch = sys.modules.get("torch")
        if torch and threads is not None:
            torch.set_num_threads(threads)
    assert code in (None, 0), f"{name} exited with {code}"
    return capsys.readouterr().out


@pytest.mark.parametrize("name", _params())
def test_benchmark_runs_and_prints_its_figure(name, tmp_path, monkeypatch, capsys):
    smoke = SMOKES[name]
    for module in smoke.needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{name} needs {module}, not installed here")
    if smoke.gpu and not _cuda():
        pytest.skip(f"{name} needs a CUDA GPU")
    args = smoke.args
    if name == "calibration_demo.py":
        args = ("--run", str(corpus_run(tmp_path / "corpus-run")), *args)
    if name == "finetuned_lomo.py":
        args = (*args, "--states", str(tmp_path / "states.pt"))
    if name == "soak.py":
        args = (*args, "--workdir", str(tmp_path / "soak"))
    if name == "judge_quality.py":
        args = (*args, "--verdicts", str(tmp_path / "verdicts.jsonl"))
    if name == "leave_one_model_out.py":
        args = (*args, "--judge-verdicts", str(perfect_verdicts(tmp_path / "perfect.jsonl")))
    if name == "unseen_people.py":
        args = (*args, *people_set(tmp_path))
    if smoke.own_process:
        stdout = run_script(name, args, tmp_path)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        stdout = run_in_process(name, args, tmp_path, monkeypatch, capsys)
    assert any(re.search(smoke.figure, line) for line in stdout.splitlines()), stdout[-3000:]
    if name == "leave_one_model_out.py":
        check_judge_curve(stdout)
    if name == "unseen_people.py":
        check_unseen_people(stdout)


def corpus_run(folder: Path) -> Path:
    """A finished run of four GSM-style items whose every answer and user turn is a turn of the
    shipped corpus (what calibration_demo.py reads its truth from), made by a scripted backend."""
    from userturn.backends.fake import USER_HEADER, ScriptedBackend
    from userturn.config import Experiment
    from userturn.labels.corpus import corpus_examples
    from userturn.probe.pipeline import run_experiment

    chosen, queries, answers = [], set(), set()
    for ex in corpus_examples():
        case = ex.case
        plain = all(t == t.strip() and "<|" not in t and "<think" not in t and "\n\n\n" not in t
                    for t in (case.query, case.answer, case.user_turn))
        if (plain and ex.source == "generated" and case.user_turn and "####" not in case.query
                and case.query not in queries and case.answer not in answers):
            chosen.append(case)
            queries.add(case.query)
            answers.add(case.answer)
        if len(chosen) == 4:
            break

    def script(request) -> str:  # type: ignore[no-untyped-def]
        if request.prompt.endswith(USER_HEADER):
            return next(c.user_turn for c in chosen if c.answer in request.prompt)
        return next(c.answer for c in chosen if c.query in request.prompt)

    data = folder.parent / "gsm.jsonl"
    data.write_text("".join(json.dumps({"question": c.query, "answer": "#### 1"}) + "\n"
                            for c in chosen), encoding="utf-8")
    exp = Experiment(models=["fake/corpus"], datasets=[str(data)], temperatures=[0.0],
                     max_tokens=4096, user_max_tokens=4096, output=folder)
    backend = ScriptedBackend(script, spec="fake/corpus")
    run_experiment(exp, backends={"fake/corpus": backend}).close()
    return folder


def perfect_verdicts(path: Path) -> Path:
    """A judge that gives every corpus turn its adjudicated label, as judge_quality.py stores it."""
    import gzip
    import json

    from userturn.labels.context import turn_key
    from userturn.labels.corpus import CORPUS_FILE

    with gzip.open(CORPUS_FILE, "rt", encoding="utf-8") as rows, path.open("w") as out:
        for row in map(json.loads, rows):
            out.write(json.dumps({"judge": "judge:perfect", "key": turn_key(
                row["query"], row["answer"], row["user_turn"]), "label": row["label"]}) + "\n")
    return path


def people_set(folder: Path) -> tuple[str, ...]:
    """Six of people's corpus turns, materialized as corpus/sharegpt.py writes its set, with a
    judge that scores every turn's adjudicated label highest and an identity calibration: the
    arguments of benchmarks/unseen_people.py."""
    import gzip

    from userturn.labels.context import turn_key
    from userturn.labels.corpus import CORPUS_FILE
    from userturn.records import LABELS

    with gzip.open(CORPUS_FILE, "rt", encoding="utf-8") as handle:
        people = [row for row in map(json.loads, handle) if row["source"]["kind"] == "human"]
    chosen = [next(r for r in people if r["label"] == label) for label in
              ("follow_up", "new_query", "generic")] + [r for r in people
                                                        if r["label"] == "follow_up"][1:4]
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "people.jsonl.gz", "wt", encoding="utf-8") as out:
        out.writelines(json.dumps({**row, "group": row["id"]}) + "\n" for row in chosen)
    with (folder / "verdicts.jsonl").open("w") as out:
        for row in chosen:
            scores = [0.0 if label == row["label"] else -5.0 for label in LABELS]
            out.write(json.dumps({"judge": "judge:right@rubric1-labels", "key": turn_key(
                row["query"], row["answer"], row["user_turn"]), "label": row["label"],
                "logprobs": scores}) + "\n")
    identity = [[1.0 if i == j else 0.0 for j in range(len(LABELS))] for i in range(len(LABELS))]
    (folder / "identity.json").write_text(json.dumps({
        "judge": "judge:right@rubric1-labels", "revision": "r", "rubric": "1-labels",
        "labels": list(LABELS), "weights": identity, "bias": [0.0] * len(LABELS)}))
    return ("--set", str(folder / "people.jsonl.gz"), "--judge-verdicts",
            str(folder / "verdicts.jsonl"), "--calibration", str(folder / "identity.json"))


def check_unseen_people(out: str) -> None:
    """A judge that is always right agrees fully, raw and through an identity calibration; asked
    below a higher threshold it is asked more often, and the cascade never agrees less for it."""
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out.splitlines()
            if line.startswith("| ")}
    for name in ("judge (raw)", "judge (calibrated, identity.json)"):
        assert rows[name][1] == "6" and rows[name][2].startswith("1.000"), out
    alone = float(rows["cascade, same turns"][2].split()[0])
    mixed = [(int(re.search(r"judge on (\d+)%", name).group(1)), float(row[2].split()[0]))
             for name, row in rows.items() if name.startswith("cascade + judge (raw) below")]
    assert len(mixed) == 5 and [s for s, _ in mixed] == sorted(s for s, _ in mixed), out
    assert all(kappa >= alone - 1e-9 for _, kappa in mixed), out


def check_judge_curve(out: str) -> None:
    """The coverage curve with a judge that is always right: threshold 0 is the cascade alone,
    1.01 the judge alone (kappa 1); in between the judge's share grows with the threshold."""
    rows = [line.split(" | ") for line in out.splitlines()
            if re.match(r"^\| smollm2 \| \d\.\d\d \|", line)]
    assert [row[1] for row in rows] == ["0.00", "0.50", "0.60", "0.70", "0.80", "0.90", "1.00",
                                        "1.01"]
    shares = [int(row[6].rstrip("%")) for row in rows]
    assert shares[0] == 0 and shares[-1] == 100 and shares == sorted(shares)
    assert rows[-1][7].startswith("1.000") and rows[-1][8].startswith("1.000")
    assert not rows[0][7].startswith("1.000")  # the cascade alone is not perfect


def test_judge_quality_calibrates_a_leaning_judge_on_sources_it_was_not_fit_to(
        tmp_path, monkeypatch, capsys):
    """A judge that always leans to ``meta`` (it scores the right label second): raw, it agrees
    with nobody; calibrated on the other sources' train split, it finds the right labels of a
    source it never saw, people included, and the fitted file is one a judge loads."""
    import gzip

    from userturn.labels.context import turn_key
    from userturn.labels.corpus import CORPUS_FILE
    from userturn.labels.local_judge import JudgeCalibration
    from userturn.records import LABELS

    verdicts = tmp_path / "leaning.jsonl"
    with gzip.open(CORPUS_FILE, "rt", encoding="utf-8") as rows, verdicts.open("w") as out:
        for row in map(json.loads, rows):
            scores = [-1.0 if label == "meta" else -1.5 if label == row["label"] else -6.0
                      for label in LABELS]
            out.write(json.dumps({"judge": "judge:tiny@rubric1-labels", "key": turn_key(
                row["query"], row["answer"], row["user_turn"]), "group": "?", "label": "meta",
                "probability": 0.5, "error": None, "seconds": 0.1, "logprobs": scores}) + "\n")
    fitted = tmp_path / "cal.json"
    out = run_in_process("judge_quality.py", ("--table", str(verdicts), "--calibrate",
                                               "--bootstrap", "5", "--fit-calibration",
                                               str(fitted)), tmp_path, monkeypatch, capsys)
    raw, calibrated = out.split("calibrated (")
    assert re.search(r"^\| human \| 251 \| 0 \| 0\.000 ", raw, re.M), raw
    human = re.search(r"^\| human \| 251 \| 0 \| (\d\.\d+) ", calibrated, re.M)
    assert human and float(human.group(1)) > 0.9, calibrated
    calibration = JudgeCalibration.load(fitted)
    assert calibration.judge == "judge:tiny@rubric1-labels"
    assert (calibration.revision, calibration.rubric) == ("tiny-v1", "1-labels")  # the model's
    assert "train-split turns of authored, qwen2.5-coder-1.5b, smollm2" in calibration.fit_on


def test_judge_quality_few_shot_study_shows_train_cases_and_judges_only_what_was_asked(
        tmp_path, monkeypatch, capsys):
    """``--few-shot N`` adds N worked cases from the generators' train split (every label before
    any twice, never people's, never a judged turn) under a judge name of its own, asks for the
    label alone, and ``--split``/``--groups`` judge only the turns named."""
    from userturn.labels.judges import judge_from_spec
    from userturn.records import LABELS, Case

    verdicts = tmp_path / "fewshot.jsonl"
    out = run_in_process("judge_quality.py", (
        "--judge", "tiny", "--few-shot", "7", "--split", "dev", "--groups", "smollm2",
        "--limit", "3", "--bootstrap", "5", "--verdicts", str(verdicts)), tmp_path, monkeypatch,
        capsys)
    assert "+fewshot7: 0 turns judged before, 3 to judge" in out
    script = import_script("judge_quality.py", monkeypatch)
    asked = {script.key_of(t) for t in script.read_corpus()
             if t.example.split == "dev" and t.generator == "smollm2"}
    rows = [json.loads(line) for line in verdicts.read_text().splitlines()]
    assert len(rows) == 3 and all(row["judge"].endswith("+fewshot7") for row in rows)
    assert {row["key"] for row in rows} <= asked
    shots = script.few_shot_cases(script.read_corpus(), 9)
    assert [t.example.label for t in shots[:7]] == list(LABELS)
    assert all(t.example.split == "train" and t.generator != "human" for t in shots)
    judge = script.few_shot_judge(judge_from_spec("tiny"), shots)
    prompt = judge.prompt(Case("What is 2 + 2?", "4.", "Why 4?", "Why 4?"))
    assert all(t.example.case.user_turn in prompt for t in shots)
    assert prompt.endswith("Label:") and "JSON verdict only" not in prompt
    assert judge.name.endswith("+fewshot9")


def test_the_error_card_script_adds_the_unseen_people_row(tmp_path, monkeypatch, capsys) -> None:
    """``offline_error_card.py --unseen`` keeps the cascade's kappas and its rate's gap from
    unseen_people.py's table; output without that row is one clear error."""
    unseen = tmp_path / "unseen.txt"
    unseen.write_text("| rules | 238 | 0.071 [0.04, 0.11] | 0.080 [0.01, 0.15] | 0.77 / 0.15 | "
                      "10.9% vs 56.7% |\n| cascade | 238 | 0.260 [0.17, 0.34] | 0.314 [0.20, "
                      "0.42] | 0.75 / 0.58 | 43.7% vs 56.7% |\n")
    lomo = str(ROOT / "corpus" / "lomo_round10.txt")
    card = json.loads(run_in_process("offline_error_card.py", (lomo, "--unseen", str(unseen)),
                                     tmp_path, monkeypatch, capsys))
    assert card["labellers"]["context"]["people (ShareGPT)"] == {
        "turns": 238, "kappa": 0.26, "kappa_follow_up": 0.314, "gaps": [-13.0]}
    assert "people (ShareGPT)" not in card["labellers"]["form"]
    unseen.write_text("| rules | 238 | 0.071 [0.04, 0.11] | 0.080 [0.01, 0.15] | x | y |\n")
    with pytest.raises(SystemExit, match="unseen_people.py"):
        run_in_process("offline_error_card.py", (lomo, "--unseen", str(unseen)), tmp_path,
                       monkeypatch, capsys)
