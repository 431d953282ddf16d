"""``userturn corpus check-judge``: a judge against people on the shipped corpus, in one command.
The work is in :mod:`userturn.labels.judge_check`; this module parses and prints."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from userturn.errors import ConfigError

SPLITS = ("test", "dev", "train", "all")


def add_check_judge(actions: Any) -> None:
    check = actions.add_parser(
        "check-judge", help="check a judge against people on the corpus's adjudicated turns",
        description="Judge the shipped corpus's adjudicated turns (the test split: nothing is "
        "fit on it), people's first, in a fixed stratified order, and print how the judge "
        "agrees with people per source. Every verdict is stored as it arrives (--output), so an "
        "interrupted check resumes and no verdict is paid for twice; the result is kept by the "
        "judge's name, and every rate that rests on the judge then quotes it.")
    check.add_argument("--judge", required=True, metavar="JUDGE",
                       help="a judge spec as `userturn judge` takes it: openai/MODEL (with "
                       "--base-url for any OpenAI-compatible server), a local model, "
                       "llamacpp/FILE.gguf")
    check.add_argument("--base-url", dest="judge_base_url", metavar="URL",
                       help="the judge's OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 "
                       "(default: OPENAI_BASE_URL, else the OpenAI API)")
    check.add_argument("--concurrency", dest="judge_concurrency", type=int, metavar="N",
                       help="judge requests in flight at most (default 8)")
    check.add_argument("--calibration", dest="judge_calibration", type=Path, metavar="FILE",
                       help="a local judge read from label probabilities: its calibration")
    check.add_argument("--limit", type=int, metavar="N",
                       help="judge the first N turns of the order only (a stratified sample)")
    check.add_argument("--split", choices=SPLITS, default="test",
                       help="the corpus split judged (default test)")
    check.add_argument("--sharegpt", type=Path, metavar="FILE",
                       help="people's ShareGPT turns as `corpus/sharegpt.py materialize` writes "
                       "them: measured as a source of their own")
    check.add_argument("--output", "-o", type=Path, metavar="DIR",
                       help="where verdicts and the result are kept (default: the user's cache, "
                       "by the judge's name, where later commands look for it)")
    check.add_argument("--fit-calibration", type=Path, metavar="FILE",
                       help="a judge read from label probabilities: also judge the train split "
                       "(never people's turns), fit the calibration that --judge-calibration "
                       "reads, write it to FILE, and check the calibrated judge")
    check.set_defaults(handler=_check_judge)


def _check_judge(args: argparse.Namespace, console: Console) -> int:
    from userturn.cli.console import progress_bars
    from userturn.labels import judge_check as jc
    from userturn.labels.plan import JudgeSpec

    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be 1 or more")
    if args.sharegpt is not None and not args.sharegpt.is_file():
        raise ConfigError(f"--sharegpt {args.sharegpt}: no such file")
    spec = JudgeSpec(judge=args.judge, judge_base_url=args.judge_base_url,
                     judge_calibration=args.judge_calibration,
                     **({} if args.judge_concurrency is None
                        else {"judge_concurrency": args.judge_concurrency}))
    turns = jc.judging_order(jc.corpus_turns(args.split, sharegpt=args.sharegpt))
    turns = turns[:args.limit] if args.limit else turns
    judge = _judge_to_ask(jc, spec, args, turns)
    folder = args.output or jc.check_folder(judge.name)
    raw = getattr(judge, "scores_of", None) or judge.name  # whose stored scores it reads
    with progress_bars() as progress:
        asked, failed = (0, 0) if raw != judge.name else jc.judge_corpus(
            judge, turns, folder, progress)
        if args.fit_calibration is not None:
            judge = _calibrated(jc, judge, folder, args.fit_calibration, progress, console)
    verdicts = (jc.read_verdicts(folder, raw) if judge.name == raw
                else jc.calibrated_verdicts(folder, raw, judge, turns))
    check = jc.measure(judge.name, turns, verdicts, args.split)
    saved = jc.save_check(check, folder)
    print_check(check, console)
    console.print(f"{asked} verdict(s) asked now ({failed} failed: asked again by the next run "
                  f"of the same command), the rest read back; verdicts and result in {folder}/ "
                  f"({saved.name}: every rate that rests on {judge.name} now quotes it)",
                  markup=False, highlight=False, soft_wrap=True)
    return 0


def _judge_to_ask(jc: Any, spec: Any, args: argparse.Namespace, turns: Any) -> Any:
    """The judge, built only where something is left to ask: a check whose verdicts are all
    stored reads them back without loading a local judge's model (seconds to minutes)."""
    from userturn.labels.judges import expected_judge_name

    name = expected_judge_name(args.judge, args.judge_calibration)
    folder = args.output or jc.check_folder(name)
    if args.fit_calibration is None:
        stored = jc.read_verdicts(folder, name)
        if all(t.key in stored and stored[t.key].label is not None for t in turns):
            return jc.NamedJudge(name)
        if args.judge_calibration is not None:  # the raw judge's stored scores, calibrated
            raw = expected_judge_name(args.judge)
            scores = jc.read_verdicts(folder, raw)
            if all(t.key in scores and scores[t.key].logprobs for t in turns):
                from userturn.labels.local_judge import JudgeCalibration

                return jc.NamedJudge(name, JudgeCalibration.load(args.judge_calibration), raw)
    (judge,) = spec.build_judges()
    if args.fit_calibration is not None and not hasattr(judge, "classify_with_scores"):
        raise ConfigError(f"--fit-calibration: {judge.name} writes its verdict as text; a "
                          "calibration needs a judge read from label probabilities (a local "
                          "model or llamacpp/FILE.gguf)")
    return judge


def _calibrated(jc: Any, judge: Any, folder: Path, out: Path, progress: Any,
                console: Console) -> Any:
    """Judge the train split too, fit the calibration there, write it, and return the judge
    under its calibrated name (its verdicts are read from the stored scores)."""
    train = [t for t in jc.judging_order(jc.corpus_turns("train")) if t.group != jc.PEOPLE]
    jc.judge_corpus(judge, train, folder, progress)
    calibration = jc.fit_calibration(judge, train, jc.read_verdicts(folder, judge.name))
    calibration.save(out)
    console.print(f"wrote {out}: {calibration.fit_on} (use it with --judge-calibration {out})",
                  markup=False, highlight=False, soft_wrap=True)
    return jc.calibrated_judge(judge, calibration)


def _k(value: float, interval: tuple[float, float] | None = None) -> str:
    if math.isnan(value):
        return "-"
    if interval is None or any(math.isnan(v) for v in interval):
        return f"{value:.2f}"
    return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _p(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.0f}%"


def print_check(check: Any, console: Console) -> None:
    """The check's table, one row per source, then each source's confusion matrix."""
    from userturn.records import LABELS

    table = Table(title=f"{check.judge} against people ({check.split} split)")
    for name in ("source", "turns", "errors", f"kappa {len(LABELS)}-way", "kappa follow-up",
                 "follow-up P", "follow-up R", "judge's rate", "people's rate",
                 "people vs people kappa"):
        table.add_column(name, justify="left" if name == "source" else "right")
    for group in (*check.groups, check.overall):
        table.add_row(group.group, str(group.n), str(group.errors),
                      _k(group.kappa, group.kappa_interval),
                      _k(group.kappa_follow_up, group.kappa_follow_up_interval),
                      _p(group.precision), _p(group.recall), _p(group.judge_rate),
                      _p(group.people_rate),
                      f"{_k(group.annotators_kappa)} / {_k(group.annotators_kappa_follow_up)}")
    console.print(table)
    short = [label[:8] for label in LABELS]
    for group in check.groups:
        matrix = Table(title=f"{group.group}: people (rows) by the judge (columns)")
        matrix.add_column("")
        for name in short:
            matrix.add_column(name, justify="right")
        for label, row in zip(short, group.matrix):
            matrix.add_row(label, *map(str, row))
        console.print(matrix)
    console.print("kappa: Cohen's, with a 95% interval over queries (whole queries resampled); "
                  "follow-up P/R: precision and recall of the judge's follow-ups; people vs "
                  f"people: the two annotators' own kappa ({len(LABELS)}-way / follow-up) on the "
                  "same turns, the ceiling a judge is read against", style="dim", markup=False)
