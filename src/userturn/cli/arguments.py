"""The arguments of each ``userturn`` subcommand: one function per subcommand, given the handler
that runs it (``cli`` holds the handlers)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from userturn.cli.flags import (
    Flag,
    add_flags,
    count_or,
    flag_values,
    key_values,
    names,
)
from userturn.config import Experiment, load_settings
from userturn.data.files import parse_field_mappings
from userturn.errors import ConfigError
from userturn.labels.plan import JudgeSpec
from userturn.labels.sources import LABELLERS
from userturn.settings import check_folder_name

Subparsers = Any  # argparse's subparsers action (its class is private to argparse)
Handler = Callable[..., int]

EXAMPLE_QUERY = ("A baker makes 24 muffins in the morning and 18 in the afternoon. She sells 35. "
                 "How many muffins are left?")
EXAMPLE_ANSWER = ("She makes 24 + 18 = 42 muffins. After selling 35, she has 42 - 35 = 7 left.\n"
                  "#### 7")


# The run flags whose name or form is not the field's own (``--field-name``, parsed by type).
RUN_FLAGS: dict[str, Flag] = {
    "models": Flag(("--model",), repeat=True, metavar="MODEL"),
    "datasets": Flag(("--dataset",), repeat=True, metavar="DATASET"),
    "limit": Flag(parse=count_or("all"), metavar="N|all"),
    "batch_size": Flag(parse=count_or("auto"), metavar="N|auto"),
    "fields": Flag(("--field",), repeat=True, collect=parse_field_mappings,
                   metavar="FIELD=COLUMN"),
    "answerers": Flag(("--answerer",), repeat=True, metavar="ANSWERER"),
    "perturbations": Flag(("--perturbation",), repeat=True, metavar="SPEC"),
    "user_turn_variants": Flag(("--user-turn-variant",), repeat=True, metavar="SPEC"),
    "output": Flag(("--output", "-o")),
    "base_url": Flag(repeat=True, metavar="URL"),
    "backend_args": Flag(("--backend-arg",), repeat=True, collect=key_values,
                         metavar="KEY=VALUE"),
    "judge": Flag(repeat=True, metavar="JUDGE"),
    "labeller": Flag(choices=lambda: list(LABELLERS)),
}

# `userturn judge` takes the judge settings of a run under shorter names.
JUDGE_FLAGS: dict[str, Flag] = {
    "judge": Flag(repeat=True, required=True, metavar="JUDGE"),
    "judge_scope": Flag(("--scope",)),
    "judge_threshold": Flag(("--threshold",)),
    "judge_base_url": Flag(("--base-url",)),
    "judge_concurrency": Flag(("--concurrency",)),
    "judge_calibration": Flag(("--calibration",)),
}


def check_path_names(args: argparse.Namespace) -> None:
    """No path given on the command line has a part longer than a file system takes: one line
    here, in every command, before anything is read or made (not an OSError deep inside)."""
    for name, value in vars(args).items():
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, Path):
                try:
                    check_folder_name(str(path), name.replace("_", "-"))
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None


def add_run(sub: Subparsers, handler: Handler) -> None:
    run = sub.add_parser("run", help="run (or resume) an experiment and print the table",
                         description="Run the probe. Settings come from CONFIG (YAML) if given, "
                         "then from flags (each flag is the setting of the same name). "
                         "Re-running the same command resumes a killed run and makes no model "
                         "calls for a finished one.")
    run.add_argument("config", nargs="?", type=Path, help="experiment YAML file")
    add_flags(run, Experiment, RUN_FLAGS)
    run.set_defaults(handler=handler)


def experiment_from(args: argparse.Namespace) -> Experiment:
    """The experiment of ``userturn run``: CONFIG, with the flags given on top."""
    return load_settings(Experiment, args.config, flag_values(args, Experiment, RUN_FLAGS))


def add_judge(sub: Subparsers, handler: Handler) -> None:
    judge = sub.add_parser("judge", help="label a finished run's user turns with an LLM judge",
                           description="(Re)label saved user turns with a judge, without "
                           "generating anything. Several judges live side by side in one run; "
                           "the last one judged counts in reports unless --labels says otherwise.")
    judge.add_argument("run", type=Path)
    add_flags(judge, JudgeSpec, JUDGE_FLAGS)
    judge.set_defaults(handler=handler)


def judge_spec_from(args: argparse.Namespace) -> JudgeSpec:
    return load_settings(JudgeSpec, None, flag_values(args, JudgeSpec, JUDGE_FLAGS))


def add_render(sub: Subparsers, handler: Handler) -> None:
    render = sub.add_parser("render", help="show the exact probe prompt of a model",
                            description="Print the prompt that opens a user turn after "
                            "[system?, user, assistant], with special tokens visible, the stop "
                            "markers that end the user turn, the assistant header, what became "
                            "of the system message and the template hash. --template reads any "
                            "template file, without weights or a tokenizer download.")
    source = render.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="model spec, e.g. smollm2")
    source.add_argument("--template", type=Path, metavar="FILE", help="a chat template file: "
                        ".jinja, or a tokenizer_config.json")
    render.add_argument("--bos", help="with --template: the BOS token text (default: the "
                        "file's, else none)")
    render.add_argument("--eos", help="with --template: the EOS token text (default: the "
                        "file's, else none)")
    render.add_argument("--variant", default="native", metavar="SPEC", help="a user-turn "
                        "variant to show: native (default), prefill:TEXT, system:..., "
                        "template:FILE, warmup:K")
    render.add_argument("--query", default=EXAMPLE_QUERY)
    render.add_argument("--answer", default=EXAMPLE_ANSWER)
    render.add_argument("--system", default=None, help="optional system prompt")
    render.add_argument("--tokenizer", help="for openai/MODEL: local folder, embedded name or hub "
                        "id of the served model's tokenizer and chat template (default: MODEL)")
    render.set_defaults(handler=handler)


def add_datasets(sub: Subparsers, handler: Handler) -> None:
    datasets = sub.add_parser("datasets", help="list the datasets userturn can load")
    datasets.set_defaults(handler=handler)


def add_report(sub: Subparsers, handler: Handler) -> None:
    report = sub.add_parser("report", help="print the tables of a run folder")
    report.add_argument("run", type=Path)
    report.add_argument("--html", action="store_true", help="also write RUN/report.html (one "
                        "self-contained file: plots, perturbation effects, a sample browser) and "
                        "every table as CSV/Parquet in RUN/report_tables/")
    report.add_argument("--labels", type=names, help="label sources in priority order, e.g. "
                        "rules,judge:openai/gpt-5.4-mini@rubric1 (default: the run's own)")
    report.add_argument("--figures", type=Path, metavar="DIR", help="also write each plot of the "
                        "report as PDF and PNG into DIR, sized for a two-column paper (needs "
                        "matplotlib: pip install 'userturn[figures]')")
    report.set_defaults(handler=handler)


def add_annotate(sub: Subparsers, handler: Handler) -> None:
    annotate = sub.add_parser("annotate", help="label a sample of user turns by hand in the browser",
                              description="Serve a local page on 127.0.0.1: one context at a time "
                              "(query, answer, generated user turn), blind to every other label, "
                              "keys 1-7 to label, u to undo. Every label is stored at once; "
                              "closing the browser loses nothing and reopening continues.")
    annotate.add_argument("run", type=Path)
    annotate.add_argument("--annotator", help="your name; labels are stored as human:NAME "
                          "(needed except with --plan)")
    annotate.add_argument("--size", type=int, help="sample size (default 100, stratified by "
                          "the rules' label so rare labels are seen)")
    annotate.add_argument("--seed", type=int)
    annotate.add_argument("--calibration", type=int, metavar="N", help="label a calibration "
                          "sample of N turns for corrected rates: shared between conditions so "
                          "the widest interval is narrowest (each corrected condition needs "
                          "30), random within each, stratified by the run's labeller (half on "
                          "its predicted follow-ups), inclusion probabilities stored")
    annotate.add_argument("--plan", action="store_true", help="print, per condition, how many "
                          "human labels give a corrected rate of --half-width, and the total "
                          "(reads the run only: no annotator, nothing written)")
    annotate.add_argument("--half-width", type=float, default=0.05, metavar="H",
                          help="the corrected interval's half-width --plan sizes for "
                          "(default 0.05: +-5 points)")
    annotate.add_argument("--import", dest="import_file", type=Path, metavar="FILE",
                          help="store key,label rows (CSV with a header, or JSONL) as "
                          "human:NAME instead of serving the page")
    annotate.add_argument("--port", type=int, default=0, help="default: a free port")
    annotate.add_argument("--no-browser", action="store_true", help="only print the address")
    annotate.set_defaults(handler=handler)


def add_agreement(sub: Subparsers, handler: Handler) -> None:
    agreement = sub.add_parser("agreement", help="Cohen's kappa between humans, judges and rules",
                               description="Pairwise agreement between every two label sources "
                               "of a run: kappa with a 95% interval bootstrapped over items, the "
                               "confusion matrix, per-label precision and recall.")
    agreement.add_argument("run", type=Path)
    agreement.add_argument("--sources", type=names, help="compare only these label sources, "
                           "the first as reference, e.g. human:ana,rules")
    agreement.set_defaults(handler=handler)


def add_compare(sub: Subparsers, handler: Handler) -> None:
    compare = sub.add_parser("compare", help="paired differences between two runs on shared items",
                             description="B minus A on the items both runs share: follow-up rate "
                             "per dataset, perturbation and temperature (paired interval clustered by "
                             "items; exact McNemar for greedy) and task accuracy. For base vs "
                             "post-trained checkpoints, or two models.")
    compare.add_argument("run_a", type=Path)
    compare.add_argument("run_b", type=Path)
    compare.add_argument("--html", type=Path, metavar="FILE",
                         help="also write the comparison as a self-contained page with a "
                         "forest plot")
    compare.add_argument("--labels", type=names, metavar="SOURCES",
                         help="label sources in priority order, comma-separated, read the same "
                         "way in both runs (default: each run's own), e.g. rules or a judge name")
    compare.add_argument("--force", action="store_true", help="replace --html if it exists")
    compare.set_defaults(handler=handler)


def add_export(sub: Subparsers, handler: Handler) -> None:
    export = sub.add_parser("export", help="export user turns with labels to JSONL, CSV or Parquet")
    export.add_argument("run", type=Path)
    export.add_argument("--format", choices=("jsonl", "csv", "parquet", "inspect", "hf"),
                        help="default: the suffix of --out (.jsonl, .csv, .parquet, .eval), "
                        "else jsonl")
    export.add_argument("-o", "--out", type=Path,
                        help="file to write (default: RUN/user_turns.FORMAT)")
    export.add_argument("--force", action="store_true", help="replace --out if it exists")
    export.set_defaults(handler=handler)


def add_doctor(sub: Subparsers, handler: Handler) -> None:
    doctor = sub.add_parser("doctor", help="check that a run folder's store is whole",
                            description="Check the run's database: that it is a userturn store "
                            "of a known schema, SQLite's integrity check, and what is planned "
                            "vs stored per stage. Exit 0 when whole, 1 when damaged.")
    doctor.add_argument("run", type=Path)
    doctor.set_defaults(handler=handler)


EXPORT_SUFFIXES = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet", ".eval": "inspect"}


def export_format(fmt: str | None, out: Path | None) -> str:
    """The format ``export`` writes: ``--format``, else the suffix of ``--out`` (which must
    name one), else JSON Lines into the run folder. A file whose suffix names another format
    than ``--format`` is refused: a CSV that holds JSON Lines would mislead whoever opens it."""
    named = EXPORT_SUFFIXES.get(out.suffix.lower()) if out is not None else None
    if fmt is None:
        if out is None:
            return "jsonl"
        if named is None:
            raise ConfigError(f"{out}: cannot tell the format from its name: give --format "
                              "(a Hugging Face folder: --format hf), or name the file "
                              + ", ".join(f"*{suffix}" for suffix in EXPORT_SUFFIXES))
        return named
    if named is not None and named != fmt:
        raise ConfigError(f"{out} names a {named} file but --format is {fmt}: name the "
                          "file for its format, or give the format it names")
    return fmt
