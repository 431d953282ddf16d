"""Generate the model-written user turns of the labelled corpus (docs/corpus.md).

The probe runs of the embedded SmolLM2-135M-Instruct over six offline datasets:
  runs/corpus/plain      gsm_symbolic, MATH-style, IFBench: greedy and T = 0.7, 1.0, 1.3
  runs/corpus/chats      MT-Bench (24 questions): greedy and T = 1.0, with the real second turns
                         as the human baseline
  runs/corpus/perturbed  gsm_symbolic and MATH-style (8 items each; 30 from the second round)
                         at T = 1.0: truncated answer, an appended question, a wrong final number
  runs/corpus/llamacpp   the same model quantized (Q4_1 GGUF) through llama.cpp, on the tasks and
                         MT-Bench: greedy and T = 1.0, 1.3 (second round; needs llama-cpp-python)
  runs/corpus/conversations  the GGUF model writing the user turn after the first exchange of
                         FastChat's sample conversations (their own assistant reply; round 4)
  runs/corpus/qwen-*     a second, fluent generator (round 5): Qwen2.5-Coder-1.5B-Instruct, the
                         official Q4_K_M GGUF assembled and verified by corpus/qwen_gguf.py,
                         through llama.cpp: tasks and MT-Bench at greedy and T = 0.7, 1.0, 1.3,
                         the perturbations at T = 1.0, and FastChat's conversations. It writes a
                         few tokens a second here, so ``--runs qwen`` goes in rounds of growing
                         limits (``--qwen-limits 6 12 24``): every condition has turns early, and a
                         kill loses at most the request in flight. ``--qwen-runs`` picks some of
                         its four runs, in order (the conditions short of labelled turns first).
The perturbed run starts from a copy of the plain run's store, so the answers (and the
unperturbed turns it shares) are not generated twice. Resumable: re-run the same command after a kill.

    .venv/bin/python corpus/generate.py [--limit 30] [--samples 3] [--perturbed-limit 30]
        [--runs chats perturbed plain]

``--samples`` adds user turns per answer at every T > 0 (the answers are greedy and shared, so a
new sample costs only its user turn): the corpus's second round used ``--samples 3 --perturbed-limit 30``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from userturn.config import Experiment
from userturn.data.conversations import mtbench_question_file
from userturn.probe.pipeline import run_experiment

HERE = Path(__file__).resolve().parent
RUNS = ("plain", "chats", "perturbed", "llamacpp", "conversations", "qwen")
QWEN_RUNS = ("qwen-tasks", "qwen-chats", "qwen-perturbed", "qwen-conversations")
MATH_TASKS = ("simple_equations", "fraction_simplification", "prime_factorization", "gcd", "lcm",
              "simple_geometry", "complex_arithmetic", "basic_arithmetic", "decimal_arithmetic",
              "polynomial_equations")


def math_style_file(path: Path, per_task: int = 6, seed: int = 500) -> Path:
    """MATH-500-style short problems with exact answers, from reasoning-gym's generators (the
    MATH-500 set itself needs the hub)."""
    import reasoning_gym

    rows = []
    for task in MATH_TASKS:
        data = reasoning_gym.create_dataset(task, size=per_task, seed=seed)
        for index in range(per_task):
            entry = data[index]
            rows.append({"id": f"mathstyle-{task}-{index}", "problem": entry["question"],
                         "answer": str(entry["answer"]), "subject": task})
    # Interleave the tasks so that any prefix (--limit) mixes them.
    rows.sort(key=lambda row: (int(row["id"].rsplit("-", 1)[1]), row["id"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def conversations_file() -> Path:
    """FastChat's sample conversations (Apache-2.0), shipped beside MT-Bench's questions."""
    root = mtbench_question_file().parents[4]
    return root / "data" / "dummy_conversation.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=30, help="items per dataset")
    parser.add_argument("--output", type=Path, default=Path("runs/corpus"))
    parser.add_argument("--perturbed-limit", type=int, default=8,
                        help="items per dataset of the perturbed run")
    parser.add_argument("--samples", type=int, default=1, help="user turns per answer at T > 0")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS),
                        help="which runs, in this order")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama.cpp threads of the qwen runs (default: every core)")
    parser.add_argument("--qwen-limits", type=int, nargs="+", default=[6, 12, 24],
                        help="items per dataset of each successive round of the qwen runs")
    parser.add_argument("--qwen-runs", nargs="+", choices=QWEN_RUNS, default=list(QWEN_RUNS),
                        help="which of the qwen runs, in this order (for example the conditions "
                             "that have the fewest labelled turns first)")
    args = parser.parse_args()
    math_file = math_style_file(args.output / "math_style.jsonl")
    tasks = ["gsm_symbolic", f"math500:{math_file}", "ifbench"]
    chats = ["mtbench"]  # FastChat's sample conversations join as human turns (collect.py)
    common = dict(models=["smollm2"], samples=args.samples, max_tokens=256, user_max_tokens=96,
                  seed=7, batch_size=16)
    # Tasks at four temperatures; MT-Bench (long answers) greedy and at T = 1.0 only, and the
    # perturbations at T = 1.0 on the plain run's answers (a perturbation edits an answer, so it
    # costs no new one): two busy CPU cores generate about five user turns a minute.
    experiments = {
        "plain": Experiment(**common, datasets=tasks, limit=args.limit,
                            temperatures=[0.0, 0.7, 1.0, 1.3], output=args.output / "plain"),
        "chats": Experiment(**common, datasets=chats, limit=24, temperatures=[0.0, 1.0],
                            output=args.output / "chats"),
        "perturbed": Experiment(**common, datasets=tasks[:2], limit=args.perturbed_limit,
                                temperatures=[1.0],
                                perturbations=["truncate:0.5", "append_question:specific",
                                               "wrong_answer"],
                                output=args.output / "perturbed"),
        # The same model quantized (Q4_1 GGUF) through llama.cpp: other answers, other turns.
        "llamacpp": Experiment(**{**common, "models": ["llamacpp/smollm2"], "batch_size": 8},
                               datasets=[*tasks, *chats], limit=args.limit,
                               temperatures=[0.0, 1.0, 1.3], output=args.output / "llamacpp"),
        # Real multi-turn conversations (FastChat's sample conversations, Apache-2.0): the user
        # turn after the conversation's own first assistant reply (answerers: data), GGUF model.
        "conversations": Experiment(
            **{**common, "models": ["llamacpp/smollm2"], "batch_size": 8},
            datasets=[f"conversations:{conversations_file()}"], answerers=["data"],
            context_turns=1, limit=args.limit, temperatures=[0.0, 1.0],
            output=args.output / "conversations"),
    }
    for name in args.runs:
        if name == "qwen":
            for limit in args.qwen_limits:
                runs = {run.output.name: run for run in
                        qwen_experiments(args.output, tasks, common, limit, args.threads)}
                for run in (runs[which] for which in args.qwen_runs):
                    restore(run.output)  # a committed snapshot, on a fresh machine
                    db = run.output / "userturn.db"
                    tasks_db = args.output / "qwen-tasks" / "userturn.db"
                    if run.perturbations and not db.exists() and tasks_db.exists():
                        db.parent.mkdir(parents=True, exist_ok=True)  # share the greedy answers
                        snapshot(tasks_db, db)
                    run_experiment(run, progress=_progress)
            continue
        if name == "perturbed":
            perturbed_db = args.output / "perturbed" / "userturn.db"
            if not perturbed_db.exists():  # the answers are shared: start from the plain store
                perturbed_db.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(args.output / "plain" / "userturn.db", perturbed_db)
        run_experiment(experiments[name], progress=_progress)


from collect import restore  # noqa: E402  (corpus/ scripts import each other by file)


def snapshot(source: Path, target: Path) -> None:
    """A consistent copy of a run store, WAL included (a plain file copy can miss the WAL)."""
    import sqlite3

    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def qwen_experiments(output: Path, tasks: list[str], common: dict, limit: int,
                     threads: int | None = None) -> list[Experiment]:
    """One round of the second generator's runs, ``limit`` items per dataset (a later round with
    a larger limit resumes each folder: the items already done cost nothing)."""
    from qwen_gguf import DEFAULT_OUT, SIZE

    if Path.cwd().resolve() != HERE.parent:
        raise SystemExit("run the qwen runs from the repository root (their model spec is relative)")
    if not DEFAULT_OUT.exists() or DEFAULT_OUT.stat().st_size != SIZE:
        raise SystemExit(f"{DEFAULT_OUT} is missing: run python corpus/qwen_gguf.py first")
    # The spec is relative to the repository root (run from there): the same on every machine,
    # so a restored snapshot's cache keys still match and nothing is generated twice.
    qwen = {**common, "models": [f"llamacpp/{DEFAULT_OUT.relative_to(HERE.parent)}"], "batch_size": 4,
            "backend_args": {"n_threads": threads} if threads else {}}
    return [
        Experiment(**qwen, datasets=tasks, limit=limit, temperatures=[0.0, 0.7, 1.0, 1.3],
                   output=output / "qwen-tasks"),
        Experiment(**qwen, datasets=["mtbench"], limit=limit, temperatures=[0.0, 1.0, 1.3],
                   output=output / "qwen-chats"),
        Experiment(**qwen, datasets=tasks[:2], limit=max(2, limit // 2), temperatures=[1.0],
                   perturbations=["truncate:0.5", "append_question:specific", "wrong_answer"],
                   output=output / "qwen-perturbed"),
        Experiment(**qwen, datasets=[f"conversations:{conversations_file()}"],
                   answerers=["data"], context_turns=1, limit=limit, temperatures=[0.0, 1.0],
                   output=output / "qwen-conversations"),
    ]


def _progress(description: str, total: int):
    state = {"done": 0}
    print(f"{description}: {total}", flush=True)

    def advance(n: int) -> None:
        state["done"] += n
        if state["done"] % 40 < n or state["done"] == total:
            print(f"  {description}: {state['done']}/{total}", flush=True)
    return advance


if __name__ == "__main__":
    main()
