"""The ``userturn`` command line."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .errors import ConfigError, UserturnError
from .models import EMBEDDED

EXAMPLE_QUERY = ("A baker makes 24 muffins in the morning and 18 in the afternoon. She sells 35. "
                 "How many muffins are left?")
EXAMPLE_ANSWER = ("She makes 24 + 18 = 42 muffins. After selling 35, she has 42 - 35 = 7 left.\n"
                  "#### 7")


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

    run = sub.add_parser("run", help="run (or resume) an experiment and print the table",
                         description="Run the probe. Settings come from CONFIG (YAML) if given, "
                         "then from flags. Re-running the same command resumes a killed run and "
                         "makes no model calls for a finished one.")
    run.add_argument("config", nargs="?", type=Path, help="experiment YAML file")
    run.add_argument("--model", dest="models", action="append",
                     help="model spec (repeatable); default: smollm2")
    run.add_argument("--dataset", dest="datasets", action="append",
                     help="gsm_symbolic (offline), gsm8k (hub), or a .jsonl/.json/.parquet file")
    run.add_argument("--field", dest="fields", action="append", metavar="FIELD=COLUMN",
                     help="your file's column for query, answer, id or system (repeatable)")
    run.add_argument("--skip-invalid", dest="skip_invalid", action="store_true", default=None,
                     help="record and count malformed rows instead of stopping at the first")
    run.add_argument("--context-turns", dest="context_turns", type=int,
                     help="conversation datasets: probe after the first k user turns")
    run.add_argument("--limit", type=int, help="items per dataset (default 20)")
    run.add_argument("--temperatures", type=_floats, help="comma list, 0 = greedy (default 0,1.0)")
    run.add_argument("--samples", type=int, help="user turns per item at each T > 0 (default 4)")
    run.add_argument("--top-p", dest="top_p", type=float)
    run.add_argument("--max-tokens", dest="max_tokens", type=int, help="assistant turn budget")
    run.add_argument("--user-max-tokens", dest="user_max_tokens", type=int,
                     help="user turn budget")
    run.add_argument("--seed", type=int, help="run seed (default 0)")
    run.add_argument("--batch-size", dest="batch_size", type=int)
    run.add_argument("--system-prompt", dest="system_prompt")
    run.add_argument("--answerer", dest="answerers", action="append",
                     help="self (default), reference, or a model spec (repeatable)")
    run.add_argument("--perturbation", dest="perturbations", action="append",
                     help="truncate[:F], append_question[:generic|specific], wrong_answer, swap, "
                     "empty, refusal (repeatable)")
    run.add_argument("--output", "-o", type=Path, help="run folder (default runs/demo)")
    run.add_argument("--base-url", dest="base_url", help="for openai/MODEL: an OpenAI-compatible "
                     "server with /v1/completions (vLLM, SGLang, llama.cpp, transformers serve)")
    run.add_argument("--tokenizer", help="for openai/MODEL: local folder, embedded name or hub id "
                     "of the tokenizer and chat template (default: MODEL)")
    run.add_argument("--prompt-as", dest="prompt_as", choices=("tokens", "text"),
                     help="for openai/MODEL: send prompts as token ids (default) or text")
    run.add_argument("--thinking", choices=("drop", "keep"),
                     help="the answer's thinking in the user-turn prompt: drop it as the "
                     "template does (default) or keep it before the answer")
    run.add_argument("--enable-thinking", dest="enable_thinking", type=_on_off,
                     help="Qwen3-style templates: on, off or on,off (each a model of its own, "
                     "MODEL[thinking=on]); default: the template's own")
    run.add_argument("--judge", help="LLM judge for what the rules leave undecided, e.g. "
                     "openai/gpt-5.4-mini (key from OPENAI_API_KEY)")
    run.add_argument("--judge-scope", dest="judge_scope", choices=("undecided", "all"))
    run.add_argument("--judge-base-url", dest="judge_base_url",
                     help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    run.set_defaults(handler=_run)

    judge = sub.add_parser("judge", help="label a finished run's user turns with an LLM judge",
                           description="(Re)label saved user turns with a judge, without "
                           "generating anything. Several judges live side by side in one run; "
                           "the last one judged counts in reports unless --labels says otherwise.")
    judge.add_argument("run", type=Path)
    judge.add_argument("--judge", required=True, help="e.g. openai/gpt-5.4-mini")
    judge.add_argument("--scope", choices=("undecided", "all"), default="undecided",
                       help="judge only what the rules leave undecided (default), or all turns")
    judge.add_argument("--base-url", help="an OpenAI-compatible server (default: OPENAI_BASE_URL "
                       "or the OpenAI API)")
    judge.add_argument("--concurrency", type=int, default=8)
    judge.set_defaults(handler=_judge)

    render = sub.add_parser("render", help="show the exact probe prompt of a model",
                            description="Print the prompt that opens a user turn after "
                            "[system?, user, assistant], with special tokens visible, the stop "
                            "markers that end the user turn, and the template hash.")
    render.add_argument("--model", required=True, help="model spec, e.g. smollm2")
    render.add_argument("--query", default=EXAMPLE_QUERY)
    render.add_argument("--answer", default=EXAMPLE_ANSWER)
    render.add_argument("--system", default=None, help="optional system prompt")
    render.add_argument("--tokenizer", help="for openai/MODEL: local folder, embedded name or hub "
                        "id of the served model's tokenizer and chat template (default: MODEL)")
    render.set_defaults(handler=_render)

    datasets = sub.add_parser("datasets", help="list the datasets userturn can load")
    datasets.set_defaults(handler=_datasets)

    report = sub.add_parser("report", help="print the tables of a run folder")
    report.add_argument("run", type=Path)
    report.add_argument("--html", action="store_true", help="also write RUN/report.html (one "
                        "self-contained file: plots, perturbation effects, a sample browser) and "
                        "every table as CSV/Parquet in RUN/report_tables/")
    report.add_argument("--labels", type=_names, help="label sources in priority order, e.g. "
                        "rules,judge:openai/gpt-5.4-mini@rubric1 (default: the run's own)")
    report.set_defaults(handler=_report)

    annotate = sub.add_parser("annotate", help="label a sample of user turns by hand in the browser",
                              description="Serve a local page on 127.0.0.1: one context at a time "
                              "(query, answer, generated user turn), blind to every other label, "
                              "keys 1-7 to label, u to undo. Every label is stored at once; "
                              "closing the browser loses nothing and reopening continues.")
    annotate.add_argument("run", type=Path)
    annotate.add_argument("--annotator", required=True, help="your name; labels are stored as "
                          "human:NAME")
    annotate.add_argument("--size", type=int, help="sample size (default 100, stratified by "
                          "the rules' label so rare labels are seen)")
    annotate.add_argument("--seed", type=int)
    annotate.add_argument("--port", type=int, default=0, help="default: a free port")
    annotate.add_argument("--no-browser", action="store_true", help="only print the address")
    annotate.set_defaults(handler=_annotate)

    agreement = sub.add_parser("agreement", help="Cohen's kappa between humans, judges and rules",
                               description="Pairwise agreement between every two label sources "
                               "of a run: kappa with a 95% interval bootstrapped over items, the "
                               "confusion matrix, per-label precision and recall.")
    agreement.add_argument("run", type=Path)
    agreement.add_argument("--sources", type=_names, help="compare only these label sources, "
                           "the first as reference, e.g. human:ana,rules")
    agreement.set_defaults(handler=_agreement)

    compare = sub.add_parser("compare", help="paired differences between two runs on shared items",
                             description="B minus A on the items both runs share: follow-up rate "
                             "per dataset, perturbation and temperature (paired bootstrap over "
                             "items; exact McNemar for greedy) and task accuracy. For base vs "
                             "post-trained checkpoints, or two models.")
    compare.add_argument("run_a", type=Path)
    compare.add_argument("run_b", type=Path)
    compare.add_argument("--html", type=Path, metavar="FILE",
                         help="also write the comparison as a self-contained page with a "
                         "forest plot")
    compare.add_argument("--labels", type=_names, metavar="SOURCES",
                         help="label sources in priority order, comma-separated, read the same "
                         "way in both runs (default: each run's own), e.g. rules or a judge name")
    compare.add_argument("--force", action="store_true", help="replace --html if it exists")
    compare.set_defaults(handler=_compare)

    export = sub.add_parser("export", help="export user turns with labels to JSONL, CSV or Parquet")
    export.add_argument("run", type=Path)
    export.add_argument("--format", choices=("jsonl", "csv", "parquet"), default="jsonl")
    export.add_argument("--out", type=Path, help="file to write (default: RUN/user_turns.FORMAT)")
    export.add_argument("--force", action="store_true", help="replace --out if it exists")
    export.set_defaults(handler=_export)

    doctor = sub.add_parser("doctor", help="check that a run folder's store is whole",
                            description="Check the run's database: that it is a userturn store "
                            "of a known schema, SQLite's integrity check, and what is planned "
                            "vs stored per stage. Exit 0 when whole, 1 when damaged.")
    doctor.add_argument("run", type=Path)
    doctor.set_defaults(handler=_doctor)

    from .train.cli import add_train_parser

    add_train_parser(sub, _train)
    return parser


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _on_off(text: str) -> list[bool]:
    values = {"on": True, "off": False, "true": True, "false": False}
    try:
        return [values[part.strip().lower()] for part in text.split(",") if part.strip()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected on, off or on,off, got {text!r}") from None


def _floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    # Everything the command prints (tables, warnings, error lines, a traceback) passes the
    # credentials scrubber: a key a server echoed back never reaches a terminal or a CI log.
    from .credentials import ScrubbedStream

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ScrubbedStream(out), ScrubbedStream(err)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def _main(argv: Sequence[str] | None) -> int:
    import warnings

    args = _parser().parse_args(argv)
    # In a terminal rich uses its width; piped to a file or CI log, it would wrap the tables at
    # 80 columns, so give it room.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    formatwarning, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    try:
        return args.handler(args, console)
    except UserturnError as exc:
        # One plain line (no wrapping), so it reads well and greps well.
        print(f"userturn: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("userturn: interrupted; everything finished so far is stored: run the same "
              "command again to resume", file=sys.stderr)
        return 130
    except Exception:  # a bug: the traceback, through the scrubbing stderr (never raised past it)
        import traceback

        traceback.print_exc()
        return 1
    finally:
        warnings.formatwarning = formatwarning


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # type: ignore[no-untyped-def]
    return f"userturn: warning: {' '.join(str(message).split())}\n"


def _run(args: argparse.Namespace, console: Console) -> int:
    from .config import load_experiment
    from .pipeline import run_experiment

    keys = ("models", "datasets", "limit", "temperatures", "samples", "top_p", "max_tokens",
            "user_max_tokens", "seed", "batch_size", "system_prompt", "output", "judge",
            "judge_scope", "judge_base_url", "answerers", "perturbations", "skip_invalid",
            "context_turns", "base_url", "tokenizer", "prompt_as", "thinking", "enable_thinking")
    overrides = {k: getattr(args, k) for k in keys}
    if args.fields:
        from .data.files import parse_field_mappings

        overrides["fields"] = parse_field_mappings(args.fields)
    experiment = load_experiment(args.config, overrides)
    with _progress_bars() as progress:
        store = run_experiment(experiment, progress=progress)
    _print_tables(store, console)
    console.print(f"run stored in {experiment.output}/ (userturn report {experiment.output})")
    store.close()
    _fail_if_all_failed(store, "generation")
    _fail_if_all_failed(store, "judge")
    return 0


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
    from .backends import load_template
    from .render import render_user_turn

    template = load_template(args.model, args.tokenizer)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = [*system, {"role": "user", "content": args.query},
                {"role": "assistant", "content": args.answer}]
    prompt = render_user_turn(template, messages)
    out = console.file
    out.write(f"model: {args.model}\ntemplate hash: {prompt.template_hash}\n")
    if prompt.system_merged:
        out.write("note: the template has no system role; the system text was merged into the "
                  "first user message\n")
    out.write("----- prompt (exact text; the model writes the user turn after the last line) "
              "-----\n")
    out.write(prompt.text)
    out.write("\n----- end of prompt -----\n")
    out.write(f"stop markers (end of the user turn): {list(prompt.stop)}\n")
    return 0


def _report(args: argparse.Namespace, console: Console) -> int:
    from .store import RunStore

    store = RunStore.open(args.run)
    _check_sources(store, args.labels)
    _print_tables(store, console, args.labels)
    if args.html:
        from .report import write_html_report

        page = write_html_report(store, args.run / "report.html", labels=args.labels,
                                 tables_dir=args.run / "report_tables")
        console.print(f"wrote {page} (tables in {args.run / 'report_tables'})")
    store.close()
    return 0


def _judge(args: argparse.Namespace, console: Console) -> int:
    from .judge import judge_from_spec
    from .pipeline import judge_turns
    from .store import RunStore

    from .lock import RunLock

    store = RunStore.open(args.run)  # before the judge: a wrong folder is the likelier mistake
    judge = judge_from_spec(args.judge, base_url=args.base_url)
    judge.concurrency = args.concurrency
    with RunLock(args.run, "judge"), _progress_bars() as progress:
        sent = judge_turns(store, judge, args.scope, progress)
    failed = store.tally.failed.get("judge", 0)
    console.print(f"{judge.name}: {sent - failed} user turn(s) judged, {failed} failed "
                  "(none generated)" + ("; run judge again to retry the failed ones"
                                        if failed else ""))
    _print_tables(store, console)
    store.close()
    _fail_if_all_failed(store, "judge")
    return 0


def _fail_if_all_failed(store, kind: str) -> None:  # type: ignore[no-untyped-def]
    """A command whose every request failed did nothing: say so, exit non-zero."""
    from .errors import RequestsFailed

    if store.tally.all_failed(kind):
        raise RequestsFailed(store.tally.summary(kind))


def _annotate(args: argparse.Namespace, console: Console) -> int:
    from .annotate import serve

    return serve(args.run, args.annotator, size=args.size, seed=args.seed, port=args.port,
                 open_browser=not args.no_browser)


def _agreement(args: argparse.Namespace, console: Console) -> int:
    from .agreement import pairwise_agreement, print_agreement
    from .store import RunStore

    store = RunStore.open(args.run)
    print_agreement(pairwise_agreement(store, sources=args.sources), console)
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
    from .compare import compare_runs, print_comparison
    from .store import RunStore

    a, b = RunStore.open(args.run_a), RunStore.open(args.run_b)
    _check_sources(a, args.labels)
    _check_sources(b, args.labels)
    comparisons, accuracy = compare_runs(a, b, labels=args.labels)
    names = (str(args.run_a), str(args.run_b))
    print_comparison(comparisons, accuracy, console, names)
    if args.html:
        from .compare import comparison_html

        from .atomic import write_text

        write_text(args.html, comparison_html(comparisons, accuracy, names), force=args.force)
        console.print(f"wrote {args.html}")
    a.close()
    b.close()
    return 0


def _check_sources(store, labels: Sequence[str] | None) -> None:  # type: ignore[no-untyped-def]
    """--labels names sources the run holds: a typo would show every turn undecided."""
    if not labels:
        return
    stored = [r[0] for r in store.db.execute("SELECT DISTINCT source FROM labels ORDER BY 1")]
    unknown = [name for name in labels if name not in stored]
    if unknown:
        raise ConfigError(f"--labels: no labels from {', '.join(unknown)} in {store.folder}; "
                          f"it holds: {', '.join(stored) or 'none'}")


def _print_tables(store, console: Console, labels: Sequence[str] | None = None) -> None:
    from .summary import assistant_errors, print_instruction_accuracy, print_summary, summarize

    from .runstate import run_state

    sources = labels or store.label_sources()
    print_summary(summarize(store, sources), console, assistant_failures=assistant_errors(store))
    print_instruction_accuracy(store, console)
    console.print(f"[dim]labels from: {' , then '.join(sources)}[/dim]")
    state = run_state(store)
    for line in (state.skipped_line(), state.line()):
        if line:
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _export(args: argparse.Namespace, console: Console) -> int:
    from .export import export_user_turns
    from .store import RunStore

    store = RunStore.open(args.run)
    out = args.out or args.run / f"user_turns.{args.format}"
    # A file the user names is theirs: replaced only with --force. The default file in the run
    # folder is userturn's own and is rewritten.
    count = export_user_turns(store, out, args.format, force=args.force or args.out is None)
    store.close()
    console.print(f"wrote {count} user turns to {out}")
    return 0


def _doctor(args: argparse.Namespace, console: Console) -> int:
    from .runstate import doctor, run_state
    from .store import SCHEMA_VERSION, RunStore

    store = RunStore.open(args.run)  # not a store, empty, foreign, newer schema: one line, exit 2
    problems = doctor(store)
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
