"""The ``userturn`` command line."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from . import arguments
from .errors import UserturnError
from .models import EMBEDDED

if TYPE_CHECKING:
    from .store import RunStore
    from .turns import Answer, Turn

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
    from .train.cli import add_train_parser

    add_train_parser(sub, _train)
    from .labels.commands import add_classifier_parsers

    add_classifier_parsers(sub, _classifier)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # In a terminal rich uses its width; piped to a file or CI log, it would wrap the tables at
    # 80 columns, so give it room.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    try:
        return args.handler(args, console)
    except UserturnError as exc:
        # One plain line (no wrapping), so it reads well and greps well.
        print(f"userturn: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("userturn: interrupted; everything finished so far is stored: run the same "
              "command again to resume", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, console: Console) -> int:
    from .config import load_experiment
    from .pipeline import run_experiment

    keys = ("models", "datasets", "limit", "temperatures", "samples", "top_p", "max_tokens",
            "user_max_tokens", "seed", "batch_size", "system_prompt", "output", "judge",
            "judge_scope", "judge_base_url", "answerers", "perturbations", "skip_invalid",
            "context_turns", "base_url", "tokenizer", "prompt_as", "thinking", "enable_thinking",
            "labeller", "classifier", "judge_threshold",
            "endpoint_concurrency", "executor", "ray_address", "replicas", "gpus_per_replica",
            "user_turn_variants")
    overrides = {k: getattr(args, k) for k in keys}
    if args.fields:
        from .data.files import parse_field_mappings

        overrides["fields"] = parse_field_mappings(args.fields)
    experiment = load_experiment(args.config, overrides)
    with _progress_bars() as progress:
        store = run_experiment(experiment, progress=progress)
    print_tables(store, console)
    console.print(f"run stored in {experiment.output}/ (userturn report {experiment.output})")
    store.close()
    return 0


def _classifier(args: argparse.Namespace, console: Console) -> int:
    return args.action(args, console)


def _train(args: argparse.Namespace, console: Console) -> int:
    from .train.cli import train_command

    with _progress_bars() as progress:
        return train_command(args, console, progress)


@contextmanager
def _progress_bars() -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True)) as bars:
        def start(description: str, total: int) -> Callable[[int], None]:
            task = bars.add_task(description, total=total)
            return lambda n: bars.advance(task, n)

        yield start


def _render(args: argparse.Namespace, console: Console) -> int:
    from .errors import ConfigError
    from .user_variants import UserVariantBackend, parse_user_variant

    if args.model is None:
        from .template_file import load_template_file

        if args.tokenizer is not None:
            raise ConfigError("--tokenizer is for --model openai/MODEL, not --template")
        template = load_template_file(args.template, bos=args.bos, eos=args.eos)
        name = f"template file {args.template}"
    else:
        from .backends import load_template

        if args.bos is not None or args.eos is not None:
            raise ConfigError("--bos and --eos are for --template: a model brings its own")
        template = load_template(args.model, args.tokenizer)
        name = f"model: {args.model}"
    variant = parse_user_variant(args.variant)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = [*system, {"role": "user", "content": args.query},
                {"role": "assistant", "content": args.answer}]
    prober = _TemplateOnly(template)
    prompt = UserVariantBackend(prober, variant).user_prompt(messages)
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


class _TemplateOnly:
    """A prober with a template and nothing to generate with: what `render` needs."""

    def __init__(self, template) -> None:
        self.template, self.spec, self.revision, self.chunk_size = template, template.model, "", 1


def _report(args: argparse.Namespace, console: Console) -> int:
    from .labels.calibration import inclusion_probabilities
    from .store import RunStore

    store = RunStore.open(args.run)
    turns, answers, sources = print_tables(store, console, args.labels)
    if args.html or args.figures:
        from .report import build_report

        report = build_report(turns, answers, folder=store.folder, meta=store.meta(),
                              sources=sources, inclusion=inclusion_probabilities(store, turns))
        if args.figures:
            from .report.figures import write_figures

            written = write_figures(report, args.figures)
            console.print(f"wrote {len(written)} figure files to {args.figures}")
        if args.html:
            from .report import write_html_report

            page = write_html_report(report, args.run / "report.html",
                                     tables_dir=args.run / "report_tables")
            console.print(f"wrote {page} (tables in {args.run / 'report_tables'})")
    store.close()
    return 0


def _judge(args: argparse.Namespace, console: Console) -> int:
    from .labels.agreement import pairwise_agreement, print_agreement
    from .labels.judge import judge_from_spec
    from .pipeline import judge_with_all
    from .store import RunStore
    from .turns import read_turns

    store = RunStore.open(args.run)  # before the judge: a wrong folder is the likelier mistake
    judges = [judge_from_spec(spec, base_url=args.base_url)
              for spec in dict.fromkeys(args.judges)]
    for judge in judges:
        judge.concurrency = args.concurrency
    with _progress_bars() as progress:
        sent = judge_with_all(store, judges, args.scope, progress, threshold=args.threshold)
    names = ", ".join(judge.name for judge in judges)
    console.print(f"{names}: {sent} user turn(s) judged (none generated)")
    if len(judges) > 1:
        print_agreement(pairwise_agreement(read_turns(store),
                                           sources=[judge.name for judge in judges]), console)
    print_tables(store, console)
    store.close()
    return 0


def _annotate(args: argparse.Namespace, console: Console) -> int:
    from .labels.annotate import serve

    if args.import_file is not None:
        from .labels.annotate import NAME_PATTERN, AnnotationError
        from .labels.calibration import import_labels
        from .store import RunStore

        if not NAME_PATTERN.fullmatch(args.annotator):
            raise AnnotationError(f"annotator name {args.annotator!r}: use letters, digits, _ . -")
        stored = import_labels(RunStore.open(args.run), args.import_file, args.annotator)
        console.print(f"stored {stored} labels as human:{args.annotator}")
        return 0
    return serve(args.run, args.annotator, size=args.size, seed=args.seed, port=args.port,
                 open_browser=not args.no_browser, calibration=args.calibration)


def _agreement(args: argparse.Namespace, console: Console) -> int:
    from .labels.agreement import pairwise_agreement, print_agreement
    from .store import RunStore
    from .turns import read_turns

    from .labels.reliability import print_against_people, ratings_of

    store = RunStore.open(args.run)
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

    from .data import CATALOG

    table = Table(title="Datasets (--dataset SPEC)")
    for column in ("spec", "source", "size", "accuracy", "offline"):
        table.add_column(column)
    for entry in CATALOG:
        table.add_row(entry.spec, entry.source, entry.size, entry.scoring, entry.offline)
    console.print(table)
    return 0


def _compare(args: argparse.Namespace, console: Console) -> int:
    from .report.compare import compare_runs, print_comparison
    from .store import RunStore

    a, b = RunStore.open(args.run_a), RunStore.open(args.run_b)
    comparisons, accuracy = compare_runs(a, b, labels=args.labels)
    names = (str(args.run_a), str(args.run_b))
    print_comparison(comparisons, accuracy, console, names)
    if args.html:
        from .report.compare import comparison_html

        args.html.write_text(comparison_html(comparisons, accuracy, names), encoding="utf-8")
        console.print(f"wrote {args.html}")
    a.close()
    b.close()
    return 0


def print_tables(store: RunStore, console: Console, labels: Sequence[str] | None = None
                  ) -> tuple[list[Turn], list[Answer], list[str]]:
    """Print the run's tables; returns what they were read from (each run is read once)."""
    from .report.summary import assistant_errors, print_instruction_accuracy, print_summary
    from .labels.calibration import inclusion_probabilities
    from .report.summary import summarize
    from .turns import label_sources, read_answers, read_turns
    from .user_variants import print_variant_comparisons, variant_comparisons

    sources = label_sources(store, labels or None)
    turns, answers = read_turns(store, sources), read_answers(store)
    print_summary(summarize(turns, answers, inclusion_probabilities(store, turns)), console,
                  assistant_failures=assistant_errors(answers))
    print_variant_comparisons(variant_comparisons(turns), console)
    print_instruction_accuracy(answers, console)
    by: dict[str, int] = {}
    for turn in turns:
        if turn.error is None:
            by[turn.label_source or "nobody (undecided)"] = \
                by.get(turn.label_source or "nobody (undecided)", 0) + 1
    counts = ", ".join(f"{source} {n}" for source, n in by.items())
    console.print(f"[dim]labels from: {' , then '.join(sources)} (user turns labelled by "
                  f"{counts or 'nobody yet'})[/dim]")
    return turns, answers, sources


def _export(args: argparse.Namespace, console: Console) -> int:
    from .export import export_user_turns
    from .store import RunStore
    from .turns import read_turns

    store = RunStore.open(args.run)
    out = args.out or args.run / f"user_turns.{args.format}"
    count = export_user_turns(read_turns(store), out, args.format)
    store.close()
    console.print(f"wrote {count} user turns to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
