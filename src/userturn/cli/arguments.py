"""The arguments of each ``userturn`` subcommand: one function per subcommand, given the handler
that runs it (``cli`` holds the handlers)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

Subparsers = Any  # argparse's subparsers action (its class is private to argparse)
Handler = Callable[..., int]

EXAMPLE_QUERY = ("A baker makes 24 muffins in the morning and 18 in the afternoon. She sells 35. "
                 "How many muffins are left?")
EXAMPLE_ANSWER = ("She makes 24 + 18 = 42 muffins. After selling 35, she has 42 - 35 = 7 left.\n"
                  "#### 7")


def add_run(sub: Subparsers, handler: Handler) -> None:
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
    run.add_argument("--temperatures", type=floats, help="comma list, 0 = greedy (default 0,1.0)")
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
    run.add_argument("--user-turn-variant", dest="user_turn_variants", action="append",
                     metavar="SPEC", help="native, prefill:TEXT, system:none|default|TEXT, "
                     "template:FILE or warmup:K (repeatable; each paired with native)")
    run.add_argument("--output", "-o", type=Path, help="run folder (default runs/demo)")
    run.add_argument("--base-url", dest="base_url", action="append",
                     help="for openai/MODEL: an OpenAI-compatible server with /v1/completions "
                     "(vLLM, SGLang, llama.cpp, transformers serve); repeat it for several "
                     "servers of the same model")
    run.add_argument("--endpoint-concurrency", dest="endpoint_concurrency", type=int,
                     help="for openai/MODEL: requests in flight at most per server (default 8)")
    run.add_argument("--executor", choices=("local", "ray"), help="where generations run: in "
                     "this process (default) or on Ray actors (pip install 'userturn[ray]')")
    run.add_argument("--ray-address", dest="ray_address", help="executor ray: the cluster, "
                     "auto or HOST:PORT (default: start a local one)")
    run.add_argument("--replicas", type=int, help="executor ray: actors per model (default 1)")
    run.add_argument("--gpus-per-replica", dest="gpus_per_replica", type=float,
                     help="executor ray: GPUs per actor, e.g. 4 for tensor_parallel_size 4")
    run.add_argument("--tokenizer", help="for openai/MODEL: local folder, embedded name or hub id "
                     "of the tokenizer and chat template (default: MODEL)")
    run.add_argument("--prompt-as", dest="prompt_as", choices=("tokens", "text"),
                     help="for openai/MODEL: send prompts as token ids (default) or text")
    run.add_argument("--thinking", choices=("drop", "keep"),
                     help="the answer's thinking in the user-turn prompt: drop it as the "
                     "template does (default) or keep it before the answer")
    run.add_argument("--enable-thinking", dest="enable_thinking", type=on_off,
                     help="Qwen3-style templates: on, off or on,off (each a model of its own, "
                     "MODEL[thinking=on]); default: the template's own")
    run.add_argument("--judge", action="append", help="LLM judge for what the rules leave "
                     "undecided, e.g. openai/gpt-5.4-mini (key from OPENAI_API_KEY); repeat for "
                     "several, whose majority then decides")
    run.add_argument("--labeller", choices=("cascade", "classifier", "rules"),
                     help="offline labels: cascade (rules, then the learned classifier; "
                     "default), classifier, or rules alone")
    run.add_argument("--classifier", type=Path, help="classifier parameters from "
                     "train-classifier (default: the shipped ones)")
    run.add_argument("--judge-scope", dest="judge_scope", choices=("undecided", "uncertain", "all"),
                     help="judge what the rules leave undecided (default), what the classifier "
                     "is unsure of, or all")
    run.add_argument("--judge-threshold", dest="judge_threshold", type=float,
                     help="scope uncertain: judge turns whose classifier probability is below it "
                     "(default 0.7)")
    run.add_argument("--judge-base-url", dest="judge_base_url",
                     help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    run.set_defaults(handler=handler)


def add_judge(sub: Subparsers, handler: Handler) -> None:
    judge = sub.add_parser("judge", help="label a finished run's user turns with an LLM judge",
                           description="(Re)label saved user turns with a judge, without "
                           "generating anything. Several judges live side by side in one run; "
                           "the last one judged counts in reports unless --labels says otherwise.")
    judge.add_argument("run", type=Path)
    judge.add_argument("--judge", dest="judges", action="append", required=True,
                       help="e.g. openai/gpt-5.4-mini; repeat for several judges: each is "
                       "stored under its own source and their majority decides")
    judge.add_argument("--scope", choices=("undecided", "uncertain", "all"), default="undecided",
                       help="judge only what the rules leave undecided (default), the turns the "
                       "classifier is unsure of (see --threshold), or all turns")
    judge.add_argument("--threshold", type=float, default=0.7, help="scope uncertain: judge "
                       "turns whose classifier probability is below it (default 0.7)")
    judge.add_argument("--base-url", help="an OpenAI-compatible server (default: OPENAI_BASE_URL "
                       "or the OpenAI API)")
    judge.add_argument("--concurrency", type=int, default=8)
    judge.set_defaults(handler=handler)


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
    annotate.add_argument("--annotator", required=True, help="your name; labels are stored as "
                          "human:NAME")
    annotate.add_argument("--size", type=int, help="sample size (default 100, stratified by "
                          "the rules' label so rare labels are seen)")
    annotate.add_argument("--seed", type=int)
    annotate.add_argument("--calibration", type=int, metavar="N", help="label a calibration "
                          "sample of N turns for corrected rates: random, stratified by the "
                          "run's labeller (half on its predicted follow-ups), inclusion "
                          "probabilities stored")
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
                        default="jsonl")
    export.add_argument("--out", type=Path, help="file to write (default: RUN/user_turns.FORMAT)")
    export.add_argument("--force", action="store_true", help="replace --out if it exists")
    export.set_defaults(handler=handler)


def add_doctor(sub: Subparsers, handler: Handler) -> None:
    doctor = sub.add_parser("doctor", help="check that a run folder's store is whole",
                            description="Check the run's database: that it is a userturn store "
                            "of a known schema, SQLite's integrity check, and what is planned "
                            "vs stored per stage. Exit 0 when whole, 1 when damaged.")
    doctor.add_argument("run", type=Path)
    doctor.set_defaults(handler=handler)


def names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def on_off(text: str) -> list[bool]:
    values = {"on": True, "off": False, "true": True, "false": False}
    try:
        return [values[part.strip().lower()] for part in text.split(",") if part.strip()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected on, off or on,off, got {text!r}") from None


def floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {text!r}") from None
