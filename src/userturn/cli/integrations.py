"""The commands of the integrations (docs/integrations.md): ``export-task`` (the user-turn pass
as an lm-evaluation-harness task), ``import`` (lm-eval's samples back into a run folder),
``corpus export`` (the shipped labelled corpus as a Hugging Face dataset) and the ``inspect``
and ``hf`` formats of ``export``. The handlers parse and print; the work is in
:mod:`userturn.integrations`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from userturn.cli.judge_check import add_check_judge
from userturn.errors import ConfigError
from userturn.labels.sources import LABELLERS

Subparsers = Any  # argparse's subparsers action (its class is private to argparse)


def add_integration_parsers(sub: Subparsers) -> None:
    task = sub.add_parser(
        "export-task", help="write the user-turn pass as an lm-evaluation-harness task folder",
        description="Write a task folder that `lm-eval run --include_path DIR --tasks TASK` "
        "runs on any of its backends: one document per planned user turn, its text the run's "
        "stored probe prompt. An experiment YAML is run first (as `userturn run` does) and "
        "its run exported.")
    task.add_argument("source", type=Path, metavar="RUN_OR_EXPERIMENT",
                      help="a run folder, or an experiment YAML file")
    task.add_argument("--harness", choices=("lm-eval",), default="lm-eval")
    task.add_argument("-o", "--out", type=Path, required=True, help="the task folder to write")
    task.add_argument("--force", action="store_true", help="replace --out if it exists")
    task.set_defaults(handler=_export_task)

    imported = sub.add_parser(
        "import", help="read lm-eval --log_samples output back into a run folder",
        description="Read the samples lm-eval wrote for a `userturn export-task` folder into a "
        "new run folder (same keys and tables as `userturn run`), labelled offline; label, "
        "judge, report and compare then work on it.")
    imported.add_argument("samples", type=Path, nargs="+", metavar="SAMPLES",
                          help="samples_*.jsonl files, or lm-eval's --output_path folder")
    imported.add_argument("--from", dest="harness", choices=("lm-eval",), required=True)
    imported.add_argument("-o", "--out", type=Path, required=True, help="the new run folder")
    imported.add_argument("--labeller", choices=list(LABELLERS),
                          help="offline labeller (default: the exported run's)")
    imported.add_argument("--allow-model-mismatch", action="store_true",
                          help="store the turns as the run's model's even where lm-eval's "
                          "--model/--model_args name another model (or none can be found)")
    imported.set_defaults(handler=_import)

    models = sub.add_parser(
        "models", help="list the embedded models, or print where a model loads from",
        description="Without --path: the embedded models (offline, no download). With --path "
        "MODEL: the folder, file or hub id another program (lm-eval's --model_args "
        "pretrained=...) loads MODEL from; an embedded model is built here on first use.")
    models.add_argument("--path", metavar="MODEL", help="a model spec, e.g. smollm2")
    models.set_defaults(handler=_models)

    corpus = sub.add_parser("corpus", help="the shipped labelled corpus of user turns")
    actions = corpus.add_subparsers(dest="corpus_action", required=True, metavar="ACTION")
    export = actions.add_parser(
        "export", help="write the corpus as a Hugging Face dataset folder with its card")
    export.add_argument("-o", "--out", type=Path, required=True, help="the folder to write")
    export.add_argument("--force", action="store_true", help="replace --out if it exists")
    export.set_defaults(handler=_corpus_export)
    add_check_judge(actions)


def export_run_as(run: Path, fmt: str, out: Path | None, force: bool, console: Console) -> int:
    """``userturn export RUN --format inspect|hf`` (``--out``, ``--force``)."""
    from userturn.store.database import RunStore

    store = RunStore.read(run)  # an export only reads: the run folder stays as it was
    try:
        # A file the user names is theirs (replaced only with --force); the default one in
        # the run folder is userturn's own and is rewritten.
        if fmt == "inspect":
            from userturn.integrations.inspect_log import export_inspect

            target = out or run / "user_turns.eval"
            count = export_inspect(store, target, force=force or out is None)
            console.print(f"wrote {count} samples to {target} (inspect view --log-dir "
                          f"{target.parent})", markup=False, highlight=False, soft_wrap=True)
        else:
            from userturn.integrations.hf import export_run

            target = out or run / "hf"
            _quiet_datasets()
            count = export_run(store, target, force=force or out is None)
            console.print(f"wrote {count} user turns to {target}/ (datasets.load_dataset"
                          f"(\"{target}\"); README.md is its card)", markup=False,
                          highlight=False, soft_wrap=True)
    finally:
        store.close()
    return 0


def _export_task(args: argparse.Namespace, console: Console) -> int:
    from userturn.integrations.lmeval import export_task, run_command
    from userturn.store.database import RunStore

    folder = args.source
    if args.source.is_file():
        from userturn.config import load_experiment
        from userturn.probe.pipeline import run_experiment

        experiment = load_experiment(args.source, {})
        console.print(f"running {args.source} into {experiment.plan.output}/ first",
                      markup=False, highlight=False)
        run_experiment(experiment).close()
        folder = experiment.plan.output
    elif not args.source.exists():
        raise ConfigError(f"{args.source}: no such run folder or experiment file")
    store = RunStore.read(folder)  # only reads, also when it then refuses
    try:
        tasks = export_task(store, args.out, force=args.force)
    finally:
        store.close()
    for task in tasks:
        console.print(f"{task.name}: {task.docs} documents ({task.model}, T={task.temperature:g})",
                      markup=False, highlight=False)
    tags = " ".join(dict.fromkeys(task.tag for task in tasks))
    where = tasks[0].location if len({t.location for t in tasks}) == 1 else None
    console.print(f"wrote {args.out}/; run: {run_command(where or 'MODEL', args.out.resolve(), tags)}"
                  "; then: userturn import --from lm-eval lmeval-out -o RUN "
                  f"({args.out}/README.md has the commands)", markup=False, highlight=False,
                  soft_wrap=True)
    return 0


def _models(args: argparse.Namespace, console: Console) -> int:
    from userturn.backends.models import EMBEDDED, model_location

    if args.path:
        print(model_location(args.path))
        return 0
    for name, text in EMBEDDED.items():
        console.print(f"{name}: {text}", markup=False, highlight=False, soft_wrap=True)
    return 0


def _import(args: argparse.Namespace, console: Console) -> int:
    from userturn.integrations.lmeval_import import import_samples

    found = import_samples(args.samples, args.out, labeller=args.labeller,
                           allow_model_mismatch=args.allow_model_mismatch)
    console.print(f"imported {found.turns} user turns from {found.files} file(s) into "
                  f"{args.out}/ (userturn report {args.out})", markup=False, highlight=False,
                  soft_wrap=True)
    return 0


def _corpus_export(args: argparse.Namespace, console: Console) -> int:
    from userturn.integrations.hf import export_corpus

    _quiet_datasets()
    counts = export_corpus(args.out, force=args.force)
    console.print(f"wrote the corpus to {args.out}/: "
                  + ", ".join(f"{split} {n}" for split, n in counts.items()),
                  markup=False, highlight=False)
    return 0


def _quiet_datasets() -> None:
    """datasets draws a progress bar per file written: the command prints one line instead."""
    try:
        import datasets
    except ImportError:
        return  # the export says what to install
    datasets.disable_progress_bars()
