"""``userturn train sft | rl | eval``. The flags are generated from the settings models, so the
CLI, a YAML config and the manifest name every setting the same way."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel
from rich.console import Console

from userturn.cli.flags import Flag, add_flags, flag_values
from userturn.config import load_settings
from userturn.train.settings import RLSettings, SFTSettings

SFT_HELP = ("Supervised fine-tuning toward collaboration (TRL SFTTrainer, LoRA by default). "
            "Default data: self-generated collaboration conversations (the model answers "
            "training items, samples user turns, keeps those the offline cascade (rules, then "
            "the classifier) labels follow_up, adds its next answer, mixes in its own correct "
            "answers). Then the probe runs on base and "
            "checkpoint over the held-out items and the paired before/after is printed.")
RL_HELP = ("Reinforcement learning with TRL's GRPO (or RLOO) and a userturn reward: probe (the "
           "cascade's verdict on the model's own user turn, with restatement, drift and length "
           "penalties) or collab (task correctness + follow-up rate of user turns a frozen base "
           "samples after the answer - answer tokens). LoRA, a KL anchor on by default. Then the "
           "paired before/after.")


def one_or_many(values: list[str]) -> str | list[str]:
    """One judge as its spec, several as a list: a manifest stores one as it always has."""
    return values[0] if len(values) == 1 else values


# The judge is the run's judge setting (`userturn run --judge`), repeated for several.
TRAIN_FLAGS = {"judge": Flag(repeat=True, collect=one_or_many, metavar="JUDGE")}


def add_train_parser(sub: Any, run_handler: Callable[..., int]) -> None:
    train = sub.add_parser("train", help="post-train toward collaboration, then probe base vs "
                           "checkpoint", description="Post-training, then the before/after.")
    kinds = train.add_subparsers(dest="train_command", required=True, metavar="KIND")
    for name, model, text in (("sft", SFTSettings, SFT_HELP), ("rl", RLSettings, RL_HELP)):
        parser = kinds.add_parser(name, help=text.split(".")[0], description=text)
        parser.add_argument("config", nargs="?", type=Path, help="settings YAML file (flags win)")
        add_flags(parser, model, TRAIN_FLAGS)
        parser.set_defaults(handler=run_handler, settings_model=model)
    evaluate = kinds.add_parser("eval", help="repeat the before/after of a training folder",
                                description="Probe base and checkpoint over the held-out items "
                                "again (resumes finished work) and print the comparison.")
    evaluate.add_argument("folder", type=Path)
    evaluate.set_defaults(handler=run_handler, settings_model=None)


def settings_from(args: argparse.Namespace) -> BaseModel:
    model: type[BaseModel] = args.settings_model
    return load_settings(model, args.config, flag_values(args, model, TRAIN_FLAGS))


def train_command(args: argparse.Namespace, console: Console) -> int:
    # Read before training's libraries load and the progress bars open: a bad setting is one
    # line at once, as in `userturn run`.
    settings = None if args.train_command == "eval" else settings_from(args)
    from userturn.cli.console import progress_bars
    from userturn.report.compare import print_comparison
    from userturn.train.trainers import evaluate_checkpoint, run_rl, run_sft

    log = lambda text: console.print(text)  # noqa: E731
    with progress_bars() as progress:
        if settings is None:
            result = evaluate_checkpoint(args.folder, progress=progress)
            folder = args.folder
        else:
            runner = run_sft if args.train_command == "sft" else run_rl
            outcome = runner(settings, progress=progress, log=log)  # type: ignore[arg-type]
            result, folder = outcome.before_after, outcome.output
    if result is None:
        console.print(f"checkpoint in {folder}/model; before/after: userturn train eval {folder}")
        return 0
    for index, (labeller, (comparisons, accuracy)) in enumerate(result.by_labeller.items()):
        console.print(f"Labels: {labeller}", style="bold", markup=False)
        # Accuracy does not depend on the labeller: its table is printed once.
        print_comparison(comparisons, accuracy if index == 0 else [], console,
                         (str(result.base_run), str(result.tuned_run)))
    console.print(result.note)
    console.print(f"pages: {folder}/before_after.html; manifest: {folder}/manifest.json")
    return 0
