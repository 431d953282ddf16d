"""The ``userturn`` command line."""

from __future__ import annotations

import argparse
import errno
import signal
import sqlite3
import sys
import threading
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from rich.console import Console

from userturn.backends.models import EMBEDDED
from userturn.cli import arguments
from userturn.cli.console import plain_console, progress_bars
from userturn.cli.signals import (
    INTERRUPTED,
    TERMINATED,
    finish_in_flight,
    stop_on_sigterm,
)
from userturn.errors import ConfigError, Terminated, UserturnError

if TYPE_CHECKING:
    from userturn.store.database import RunStore

def _parser() -> argparse.ArgumentParser:
    models = "; ".join(f"{name}: {text}" for name, text in EMBEDDED.items())
    parser = argparse.ArgumentParser(
        prog="userturn",
        description="The user-turn generation probe: after [user query, assistant answer], open a "
                    "USER turn in the model's own chat template, let the model write it, and "
                    "measure how often it is a genuine follow-up.",
        epilog=f"Embedded offline models: {models}. Any local model folder or hub id works too.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    arguments.add_run(sub, _run)
    arguments.add_judge(sub, _judge)
    arguments.add_render(sub, _render)
    arguments.add_datasets(sub, _datasets)
    arguments.add_report(sub, _report)
    arguments.add_annotate(sub, _annotate)
    arguments.add_agreement(sub, _agreement)
    arguments.add_compare(sub, _compare)
    arguments.add_export(sub, _export)
    arguments.add_doctor(sub, _doctor)
    from userturn.cli.train import add_train_parser

    add_train_parser(sub, _train)
    from userturn.cli.labels import add_classifier_parsers

    add_classifier_parsers(sub, _classifier)
    from userturn.cli.integrations import add_integration_parsers

    add_integration_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Everything the command prints (tables, warnings, error lines, a traceback) passes the
    # credentials scrubber: a key a server echoed back never reaches a terminal or a CI log.
    from userturn.credentials import ScrubbedStream

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ScrubbedStream(out), ScrubbedStream(err)
    before = set(threading.enumerate())
    try:
        code = _main(argv)
        if code in (INTERRUPTED, TERMINATED):
            finish_in_flight(before, code)
        return code
    finally:
        sys.stdout, sys.stderr = out, err


def _main(argv: Sequence[str] | None) -> int:
    import warnings

    args = _parser().parse_args(argv)
    console = plain_console()
    formatwarning, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    on_sigterm = stop_on_sigterm()
    try:
        arguments.check_path_names(args)
        return args.handler(args, console)
    except UserturnError as exc:
        # One plain line (no wrapping), so it reads well and greps well.
        print(f"userturn: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    except sqlite3.DatabaseError as exc:  # damage found past the checks at open: one line too
        print(f"userturn: error: a run's database is damaged ({exc}); `userturn doctor RUN` "
              "says what is wrong (copy out what reads, then run again into a new folder)",
              file=sys.stderr)
        return 2
    except Terminated:
        print("userturn: terminated (SIGTERM); everything received so far is stored: run the "
              "same command again to resume", file=sys.stderr)
        return TERMINATED
    except KeyboardInterrupt:
        print("userturn: interrupted; everything finished so far is stored: run the same "
              "command again to resume", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:  # a bug: the traceback, through the scrubbing stderr
        if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:  # a name, not a bug
            print(f"userturn: error: {exc.filename}: a name in this path is longer than the "
                  "file system takes (255 bytes); choose a shorter one", file=sys.stderr)
            return 2
        import traceback

        traceback.print_exc()
        return 1
    finally:
        warnings.formatwarning = formatwarning
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # type: ignore[no-untyped-def]
    return f"userturn: warning: {' '.join(str(message).split())}\n"


def _run(args: argparse.Namespace, console: Console) -> int:
    from userturn.store.lock import refuse_if_busy

    experiment = arguments.experiment_from(args)
    refuse_if_busy(experiment.output)  # in well under a second: before the pipeline's imports
    from userturn.probe.pipeline import run_experiment

    with progress_bars() as progress:
        store = run_experiment(experiment, progress=progress)
    # Imported once the run is made: the statistics (scipy) cost a second and more, which a
    # refusal (a busy folder, a bad store) should not wait for.
    from userturn.report.terminal import print_run
    from userturn.report.view import read_run

    print_run(read_run(store), console)
    console.print(f"run stored in {experiment.output}/ (userturn report {experiment.output})")
    store.close()
    _fail_if_all_failed(store, "generation")
    _fail_if_all_failed(store, "judge")
    return 0


def _classifier(args: argparse.Namespace, console: Console) -> int:
    return args.action(args, console)


def _train(args: argparse.Namespace, console: Console) -> int:
    from userturn.cli.train import train_command

    with progress_bars() as progress:
        return train_command(args, console, progress)


def _render(args: argparse.Namespace, console: Console) -> int:
    from userturn.errors import ConfigError
    from userturn.probe.user_variants import parse_user_variant, variant_prompt

    if args.model is None:
        from userturn.chat.template_file import load_template_file

        if args.tokenizer is not None:
            raise ConfigError("--tokenizer is for --model openai/MODEL, not --template")
        template = load_template_file(args.template, bos=args.bos, eos=args.eos)
        name = f"template file {args.template}"
    else:
        from userturn.backends import load_template

        if args.bos is not None or args.eos is not None:
            raise ConfigError("--bos and --eos are for --template: a model brings its own")
        template = load_template(args.model, args.tokenizer)
        name = f"model: {args.model}"
    variant = parse_user_variant(args.variant)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = [*system, {"role": "user", "content": args.query},
                {"role": "assistant", "content": args.answer}]
    prompt = variant_prompt(template, variant, messages)
    out = console.file
    out.write(f"{name}\ntemplate hash: {prompt.template_hash}\n")
    if variant.kind != "native":
        out.write(f"user-turn variant: {variant.spec}\n")
    out.write(f"system message: {prompt.system}\n")
    out.write("----- prompt (exact text; the model writes the user turn after the last line) "
              "-----\n")
    out.write(prompt.text)
    out.write("\n----- end of prompt -----\n")
    out.write(f"stop markers (end of the user turn): {list(prompt.stop)}\n")
    out.write(f"assistant header: {prompt.assistant_header!r}\n")
    return 0


def _report(args: argparse.Namespace, console: Console) -> int:
    from userturn.report.terminal import print_run
    from userturn.report.view import read_run
    from userturn.store.database import RunStore

    if args.figures:
        from userturn.report.figures import check_figures_folder

        check_figures_folder(args.figures)
    store = RunStore.read(args.run)
    _check_sources(store, args.labels)
    view = read_run(store, args.labels)
    print_run(view, console)
    if args.html or args.figures:
        report = view.report()
        if args.figures:
            from userturn.report.figures import write_figures

            written = write_figures(report, args.figures)
            console.print(f"wrote {len(written)} figure files to {args.figures}")
        if args.html:
            from userturn.report import write_html_report

            page = write_html_report(report, args.run / "report.html",
                                     tables_dir=args.run / "report_tables")
            console.print(f"wrote {page} (tables in {args.run / 'report_tables'})")
    store.close()
    return 0


def _judge(args: argparse.Namespace, console: Console) -> int:
    from userturn.labels.stages import judge_with_all
    from userturn.report.agreement import print_agreement
    from userturn.report.terminal import print_run
    from userturn.report.view import read_run
    from userturn.stats.agreement import pairwise_agreement
    from userturn.store.database import RunStore
    from userturn.store.lock import refuse_if_busy
    from userturn.store.turns import read_turns

    RunStore.check(args.run)  # before the judge: a wrong folder is the likelier mistake
    refuse_if_busy(args.run)  # and a busy one, before a judge model loads (seconds)
    spec = arguments.judge_spec_from(args)
    judges = spec.build_judges()
    # Everything checked: only now the lock and the first write.
    with RunStore.writing(args.run, "judge") as store:
        with progress_bars() as progress:
            sent = judge_with_all(store, judges, spec.judge_scope, progress,
                                  threshold=spec.judge_threshold)
        names = ", ".join(judge.name for judge in judges)
        failed = store.tally.failed.get("judge", 0)
        console.print(f"{names}: {sent - failed} user turn(s) judged, {failed} failed "
                      "(none generated)" + ("; a failed verdict is never a label: those turns "
                                            "keep the next source's label (run judge again to "
                                            "retry them)" if failed else ""))
        if len(judges) > 1:
            print_agreement(pairwise_agreement(read_turns(store),
                                               sources=[judge.name for judge in judges]),
                            console)
        print_run(read_run(store), console)
    _fail_if_all_failed(store, "judge")
    return 0


def _fail_if_all_failed(store, kind: str) -> None:  # type: ignore[no-untyped-def]
    """A command whose every request failed did nothing: say so, exit non-zero."""
    from userturn.errors import RequestsFailed

    if store.tally.all_failed(kind):
        raise RequestsFailed(store.tally.summary(kind))


def _annotate(args: argparse.Namespace, console: Console) -> int:
    from userturn.cli.flags import check_range
    from userturn.labels.annotate import serve

    check_range("--port", args.port, low=0, high=65535, means=" (0: a free port)")
    if args.plan:
        from userturn.report.summary import print_plan

        print_plan(args.run, check_range("--half-width", args.half_width, low=0, high=0.5,
                                         low_open=True), console)
        return 0
    if args.annotator is None:
        raise ConfigError("annotate needs --annotator NAME (your name; --plan needs none)")
    if args.import_file is not None:
        from userturn.labels.annotate import NAME_PATTERN, AnnotationError
        from userturn.labels.calibration import imported_labels
        from userturn.store.database import RunStore

        if not NAME_PATTERN.fullmatch(args.annotator):
            raise AnnotationError(f"annotator name {args.annotator!r}: use letters, digits, _ . -")
        with closing(RunStore.read(args.run)) as reader:  # every row checked, nothing written
            labels = imported_labels(reader, args.import_file, args.annotator)
        with RunStore.writing(args.run, "annotate") as store:
            store.put_labels(labels)
        stored = len(labels)
        console.print(f"stored {stored} labels as human:{args.annotator}")
        return 0
    return serve(args.run, args.annotator, size=args.size, seed=args.seed, port=args.port,
                 open_browser=not args.no_browser, calibration=args.calibration,
                 announce=lambda line: console.print(line, highlight=False, soft_wrap=True))


def _agreement(args: argparse.Namespace, console: Console) -> int:
    from userturn.report.agreement import print_against_people, print_agreement
    from userturn.stats.agreement import pairwise_agreement
    from userturn.stats.reliability import ratings_of
    from userturn.store.database import RunStore
    from userturn.store.turns import read_turns

    store = RunStore.read(args.run)
    _check_sources(store, args.sources, "--sources")
    turns = read_turns(store)
    results = pairwise_agreement(turns, sources=args.sources)
    print_agreement(results, console)
    ratings = ratings_of(turns)
    if args.sources:
        ratings = {s: r for s, r in ratings.items() if s in args.sources}
    print_against_people(results, ratings, console)
    store.close()
    return 0


def _datasets(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from userturn.data import CATALOG

    table = Table(title="Datasets (--dataset SPEC)")
    for column in ("spec", "source", "size", "accuracy", "offline"):
        table.add_column(column)
    for entry in CATALOG:
        table.add_row(entry.spec, entry.source, entry.size, entry.scoring, entry.offline)
    console.print(table)
    return 0


def _compare(args: argparse.Namespace, console: Console) -> int:
    from userturn.report.compare import compare_runs, print_comparison
    from userturn.store.database import RunStore

    if _same_folder(args.run_a, args.run_b):
        # Every difference would be zero by construction: a mistyped second run, not a result.
        raise ConfigError(f"compare: {args.run_a} and {args.run_b} are the same run; give two "
                          "different run folders")
    a, b = RunStore.read(args.run_a), RunStore.read(args.run_b)
    _check_sources(a, args.labels)
    _check_sources(b, args.labels)
    comparisons, accuracy = compare_runs(a, b, labels=args.labels)
    names = (str(args.run_a), str(args.run_b))
    print_comparison(comparisons, accuracy, console, names)
    if args.html:
        from userturn.report.compare import comparison_html
        from userturn.store.atomic import write_text

        write_text(args.html, comparison_html(comparisons, accuracy, names), force=args.force)
        console.print(f"wrote {args.html}")
    a.close()
    b.close()
    return 0


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:  # one does not exist: RunStore.open says so
        return False


def _check_sources(store: RunStore, labels: Sequence[str] | None,
                   flag: str = "--labels") -> None:
    """--labels (--sources) names sources the run holds: a typo would show every turn
    undecided (or nothing to compare)."""
    if labels is None:
        return
    stored = store.stored_label_sources()
    if not labels:  # `--labels ''` or `,,,`: not "the run's own sources", which is no flag
        raise ConfigError(f"{flag} names no label source; give one or more of: "
                          f"{', '.join(stored) or 'none'} (or leave {flag} out)")
    unknown = [name for name in labels if name not in stored]
    if unknown:
        raise ConfigError(f"{flag}: no labels from {', '.join(unknown)} in {store.folder}; "
                          f"it holds: {', '.join(stored) or 'none'}")


# The format a file's suffix names; a folder (the hf format) has none.
def _export(args: argparse.Namespace, console: Console) -> int:
    args.format = arguments.export_format(args.format, args.out)
    if args.format in ("inspect", "hf"):
        from userturn.cli.integrations import export_run_as

        return export_run_as(args, console)
    from userturn.store.database import RunStore
    from userturn.store.export import export_user_turns
    from userturn.store.turns import read_turns

    store = RunStore.read(args.run)
    out = args.out or args.run / f"user_turns.{args.format}"
    # A file the user names is theirs: replaced only with --force. The default file in the run
    # folder is userturn's own and is rewritten.
    count = export_user_turns(read_turns(store), out, args.format,
                              force=args.force or args.out is None)
    store.close()
    console.print(f"wrote {count} user turns to {out}")
    return 0


def _doctor(args: argparse.Namespace, console: Console) -> int:
    from userturn.config import Experiment
    from userturn.errors import DamagedStore
    from userturn.store.database import SCHEMA_VERSION, RunStore
    from userturn.store.runstate import doctor, run_state

    try:
        store = RunStore.read(args.run)  # not a store, foreign, newer schema: one line, exit 2
    except DamagedStore as exc:  # too damaged to open: that is doctor's finding (exit 1)
        print(f"userturn: doctor: {args.run}: integrity: the database is damaged "
              f"({exc.detail}); copy out what reads, then run again into a new folder",
              file=sys.stderr)
        return 1
    problems = doctor(store, Experiment.stored)  # the settings a run is checked with
    if problems:
        for problem in problems:
            print(f"userturn: doctor: {args.run}: {problem}", file=sys.stderr)
        store.close()
        return 1
    state = run_state(store)
    status = state.line() or "finished"
    console.print(f"{args.run}: ok (userturn store, schema {SCHEMA_VERSION}, integrity ok); "
                  f"{state.counts() or 'nothing planned'}; {status}", markup=False,
                  highlight=False, soft_wrap=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
