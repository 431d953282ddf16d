"""The handlers of ``run``, ``judge``, ``render``, ``datasets``, ``report``, ``annotate``,
``agreement``, ``compare``, ``export`` and ``doctor``: each turns its parsed arguments into a
call of the package that does the work and prints what it returns. A handler returns the exit
code of a command that ended as it should; every other ending is the exit policy's
(:mod:`userturn.cli.main`).

Imports are inside the handlers: a refusal (a busy folder, a bad flag) must not wait for what
the work needs (scipy, torch), which a command imports only once it is its turn to run.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from rich.console import Console

from userturn.cli import arguments
from userturn.cli.console import progress_bars
from userturn.errors import ConfigError


def run(args: argparse.Namespace, console: Console) -> int:
    from userturn.store.lock import refuse_if_busy

    experiment = arguments.experiment_from(args)
    output = experiment.plan.output
    refuse_if_busy(output)  # in well under a second: before the pipeline's imports
    from userturn.probe.pipeline import run_and_read

    with progress_bars() as progress:
        store, stored = run_and_read(experiment, progress=progress)
    # Imported once the run is made: the statistics (scipy) cost a second and more, which a
    # refusal (a busy folder, a bad store) should not wait for.
    from userturn.report.terminal import print_run
    from userturn.report.view import view_of
    from userturn.store.runstate import run_state

    # The run as labelled, read once; where it stands is read now the folder's lock is let go.
    print_run(view_of(replace(stored, state=run_state(store))), console)
    console.print(f"run stored in {output}/ (userturn report {output})")
    store.close()
    store.tally.refuse_if_all_failed("generation")
    store.tally.refuse_if_all_failed("judge")
    return 0


def judge(args: argparse.Namespace, console: Console) -> int:
    from userturn.labels.stages import judge_folder
    from userturn.report.agreement import print_agreement
    from userturn.report.terminal import print_run
    from userturn.report.view import view_of
    from userturn.stats.agreement import pairwise_agreement
    from userturn.store.database import RunStore
    from userturn.store.lock import refuse_if_busy

    RunStore.check(args.run)  # before the judge: a wrong folder is the likelier mistake
    refuse_if_busy(args.run)  # and a busy one, before a judge model loads (seconds)
    spec = arguments.judge_spec_from(args)
    judges = spec.build_judges()
    with progress_bars() as progress:  # everything checked: only now the lock and the writes
        judged = judge_folder(args.run, judges, spec, progress)
    names = [judge.name for judge in judges]
    console.print(f"{', '.join(names)}: {judged.sent - judged.failed} user turn(s) judged, "
                  f"{judged.failed} failed (none generated)"
                  + ("; a failed verdict is never a label: those turns keep the next source's "
                     "label (run judge again to retry them)" if judged.failed else ""))
    view = view_of(judged.run)  # the run as the judges left it: its turns not read again
    if len(judges) > 1:
        print_agreement(pairwise_agreement(view.turns, sources=names), console)
    print_run(view, console)
    judged.tally.refuse_if_all_failed("judge")
    return 0


def render(args: argparse.Namespace, console: Console) -> int:
    from userturn.probe.preview import preview_prompt

    shown = preview_prompt(model=args.model, template_file=args.template, query=args.query,
                           answer=args.answer, system=args.system, variant=args.variant,
                           tokenizer=args.tokenizer, bos=args.bos, eos=args.eos)
    prompt, out = shown.prompt, console.file
    out.write(f"{shown.source}\ntemplate hash: {prompt.template_hash}\n")
    if shown.variant.kind != "native":
        out.write(f"user-turn variant: {shown.variant.spec}\n")
    out.write(f"system message: {prompt.system}\n")
    out.write("----- prompt (exact text; the model writes the user turn after the last line) "
              "-----\n")
    out.write(prompt.text)
    out.write("\n----- end of prompt -----\n")
    out.write(f"stop markers (end of the user turn): {list(prompt.stop)}\n")
    out.write(f"assistant header: {prompt.assistant_header!r}\n")
    return 0


def datasets(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from userturn.data import CATALOG

    table = Table(title="Datasets (--dataset SPEC)")
    for column in ("spec", "source", "size", "accuracy", "offline"):
        table.add_column(column)
    for entry in CATALOG:
        table.add_row(entry.spec, entry.source, entry.size, entry.scoring, entry.offline)
    console.print(table)
    return 0


def report(args: argparse.Namespace, console: Console) -> int:
    from userturn.report.terminal import print_run
    from userturn.report.view import read_folder

    if args.figures:
        from userturn.report.figures import check_figures_folder

        check_figures_folder(args.figures)  # a bad folder is refused before the run is read
    view = read_folder(args.run, args.labels)
    print_run(view, console)
    if not (args.html or args.figures):
        return 0
    numbers = view.report()  # computed once for the figures and the page
    if args.figures:
        from userturn.report.figures import write_figures

        written = write_figures(numbers, args.figures)
        console.print(f"wrote {len(written)} figure files to {args.figures}")
    if args.html:
        from userturn.report import write_html_report

        page = write_html_report(numbers, args.run / "report.html",
                                 tables_dir=args.run / "report_tables")
        console.print(f"wrote {page} (tables in {args.run / 'report_tables'})")
    return 0


def annotate(args: argparse.Namespace, console: Console) -> int:
    from userturn.cli.flags import check_range

    check_range("--port", args.port, low=0, high=65535, means=" (0: a free port)")
    if args.plan:
        from userturn.report.summary import print_plan

        print_plan(args.run, check_range("--half-width", args.half_width, low=0, high=0.5,
                                         low_open=True), console)
        return 0
    if args.annotator is None:
        raise ConfigError("annotate needs --annotator NAME (your name; --plan needs none)")
    if args.import_file is not None:
        from userturn.labels.stages import import_human_labels

        stored = import_human_labels(args.run, args.import_file, args.annotator)
        console.print(f"stored {stored} labels as human:{args.annotator}")
        return 0
    from userturn.labels.annotate import serve

    return serve(args.run, args.annotator, size=args.size, seed=args.seed, port=args.port,
                 open_browser=not args.no_browser, calibration=args.calibration,
                 announce=lambda line: console.print(line, highlight=False, soft_wrap=True))


def agreement(args: argparse.Namespace, console: Console) -> int:
    from userturn.report.agreement import print_against_people, print_agreement, run_agreement

    found = run_agreement(args.run, args.sources)
    print_agreement(found.pairs, console)
    print_against_people(found.pairs, found.ratings, console)
    return 0


def compare(args: argparse.Namespace, console: Console) -> int:
    from userturn.report.compare import compare_folders, print_comparison

    comparisons, accuracy = compare_folders(args.run_a, args.run_b, labels=args.labels)
    names = (str(args.run_a), str(args.run_b))
    print_comparison(comparisons, accuracy, console, names)
    if args.html:
        from userturn.report.compare import comparison_html
        from userturn.store.atomic import write_text

        write_text(args.html, comparison_html(comparisons, accuracy, names), force=args.force)
        console.print(f"wrote {args.html}")
    return 0


def export(args: argparse.Namespace, console: Console) -> int:
    fmt = arguments.export_format(args.format, args.out)
    if fmt in ("inspect", "hf"):
        from userturn.cli.integrations import export_run_as

        return export_run_as(args.run, fmt, args.out, args.force, console)
    from userturn.store.export import export_run

    out, count = export_run(args.run, fmt, args.out, force=args.force)
    console.print(f"wrote {count} user turns to {out}")
    return 0


def doctor(args: argparse.Namespace, console: Console) -> int:
    from userturn.config import Experiment
    from userturn.store.database import SCHEMA_VERSION
    from userturn.store.runstate import checkup

    # Not a store, a foreign file, a newer schema: refused in one line (exit 2). Damage, even
    # too much to open, is doctor's finding (exit 1).
    found = checkup(args.run, Experiment.stored)  # the settings a run is checked with
    for problem in found.problems:
        print(f"userturn: doctor: {args.run}: {problem}", file=sys.stderr)
    if found.state is None:
        return 1
    console.print(f"{args.run}: ok (userturn store, schema {SCHEMA_VERSION}, integrity ok); "
                  f"{found.state.counts() or 'nothing planned'}; "
                  f"{found.state.line() or 'finished'}", markup=False, highlight=False,
                  soft_wrap=True)
    return 0
