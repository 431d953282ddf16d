"""One config drives the command line: every experiment setting is a `userturn run` flag, the
flags override a YAML file, and `run` and `judge` share one judge spec."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pydantic
import pytest
from pydantic import BaseModel

import userturn
from userturn.cli import arguments
from userturn.cli.flags import Flag, add_flags
from userturn.cli.main import main
from userturn.cli.train import add_train_parser, settings_from
from userturn.config import Experiment
from userturn.errors import ConfigError
from userturn.labels.classifier import MODEL_FILE
from userturn.labels.plan import JudgeSpec
from userturn.probe.plan import ProbePlan
from userturn.train.settings import Evaluation, RLSettings, SFTMethod, SFTSettings, Training

FIXTURES = Path(__file__).parent / "fixtures"

# For each setting: flags that set it, and the value they give (never the default).
EXAMPLES: dict[str, tuple[list[str], Any]] = {
    "models": (["--model", "tiny", "--model", "fake/probe"], ["tiny", "fake/probe"]),
    "datasets": (["--dataset", "gsm8k", "--dataset", "gsm_symbolic"], ["gsm8k", "gsm_symbolic"]),
    "limit": (["--limit", "all"], None),
    "temperatures": (["--temperatures", "0.7,0"], [0.0, 0.7]),
    "samples": (["--samples", "3"], 3),
    "top_p": (["--top-p", "0.9"], 0.9),
    "max_tokens": (["--max-tokens", "64"], 64),
    "user_max_tokens": (["--user-max-tokens", "32"], 32),
    "arms": (["--arms", "opened,continuation"], ["opened", "continuation"]),
    "continuation_max_tokens": (["--continuation-max-tokens", "48"], 48),
    "seed": (["--seed", "7"], 7),
    "batch_size": (["--batch-size", "2"], 2),
    "system_prompt": (["--system-prompt", "Be brief."], "Be brief."),
    "answerers": (["--answerer", "self", "--answerer", "reference"], ["self", "reference"]),
    "perturbations": (["--perturbation", "empty", "--perturbation", "truncate:0.3"],
                      ["empty", "truncate:0.3"]),
    "user_turn_variants": (["--user-turn-variant", "prefill:So"], ["prefill:So"]),
    "fields": (["--field", "query=question", "--field", "answer=target"],
               {"query": "question", "answer": "target"}),
    "skip_invalid": (["--skip-invalid"], True),
    "context_turns": (["--context-turns", "2"], 2),
    "output": (["-o", "runs/x"], Path("runs/x")),
    "base_url": (["--base-url", "http://a:8000/v1", "--base-url", "http://b:8000/v1"],
                 ["http://a:8000/v1", "http://b:8000/v1"]),
    "endpoint_concurrency": (["--endpoint-concurrency", "3"], 3),
    "executor": (["--executor", "ray"], "ray"),
    "ray_address": (["--ray-address", "auto"], "auto"),
    "replicas": (["--replicas", "2"], 2),
    "gpus_per_replica": (["--gpus-per-replica", "0.5"], 0.5),
    "unit_size": (["--unit-size", "16"], 16),
    "unit_timeout": (["--unit-timeout", "60"], 60.0),
    "unit_retries": (["--unit-retries", "0"], 0),
    "max_restarts": (["--max-restarts", "1"], 1),
    "tokenizer": (["--tokenizer", "smollm2"], "smollm2"),
    "prompt_as": (["--prompt-as", "text"], "text"),
    "backend_args": (["--backend-arg", "n_ctx=4096", "--backend-arg", "flash_attn=true"],
                     {"n_ctx": 4096, "flash_attn": True}),
    "thinking": (["--thinking", "keep"], "keep"),
    "enable_thinking": (["--enable-thinking", "on,off"], [True, False]),
    "judge": (["--judge", "openai/a", "--judge", "openai/b"], ["openai/a", "openai/b"]),
    "labeller": (["--labeller", "rules"], "rules"),
    # a real classifier file: the setting reads it whole when validated
    "classifier": (["--classifier", str(MODEL_FILE)], MODEL_FILE),
    "judge_scope": (["--judge-scope", "all"], "all"),
    "judge_threshold": (["--judge-threshold", "0.5"], 0.5),
    "judge_base_url": (["--judge-base-url", "http://127.0.0.1:9/v1"], "http://127.0.0.1:9/v1"),
    "judge_concurrency": (["--judge-concurrency", "2"], 2),
    "judge_calibration": (["--judge-calibration", str(FIXTURES / "judge_calibration_identity.json")],
                          FIXTURES / "judge_calibration_identity.json"),
}

# The flags of `userturn run` and `userturn judge` before they were generated: scripts and docs
# use them.
OLD_RUN_FLAGS = (
    "--model", "--dataset", "--field", "--skip-invalid", "--context-turns", "--limit",
    "--temperatures", "--samples", "--top-p", "--max-tokens", "--user-max-tokens", "--seed",
    "--batch-size", "--system-prompt", "--answerer", "--perturbation", "--user-turn-variant",
    "--output", "-o", "--base-url", "--endpoint-concurrency", "--executor", "--ray-address",
    "--replicas", "--gpus-per-replica", "--tokenizer", "--prompt-as", "--thinking",
    "--enable-thinking", "--judge", "--labeller", "--classifier", "--judge-scope",
    "--judge-threshold", "--judge-base-url")
OLD_JUDGE_FLAGS = ("--judge", "--scope", "--threshold", "--base-url", "--concurrency")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="userturn")
    sub = parser.add_subparsers(dest="command", required=True)
    arguments.add_run(sub, lambda *_: 0)
    arguments.add_judge(sub, lambda *_: 0)
    add_train_parser(sub, lambda *_: 0)
    return parser


def _subparser(name: str) -> argparse.ArgumentParser:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def run_flags(*argv: str, config: Path | None = None) -> Experiment:
    args = _parser().parse_args(["run", *([str(config)] if config else []), *argv])
    return arguments.experiment_from(args)


def setting(exp: Experiment, name: str) -> Any:
    """A setting read from the spec that owns it."""
    (value,) = [getattr(part, name) for part in (exp.plan, exp.engine, exp.labelling)
                if name in type(part).model_fields]
    return value


def test_every_experiment_field_is_a_run_flag():
    dests = {action.dest for action in _subparser("run")._actions}
    settings = set(Experiment.setting_fields())
    assert settings <= dests, settings - dests
    # A field added without an example here fails too, so the check below covers it.
    assert set(EXAMPLES) == settings


@pytest.mark.parametrize("field", sorted(EXAMPLES))
def test_each_flag_sets_its_field(field):
    argv, expected = EXAMPLES[field]
    assert expected != Experiment.setting_fields()[field].get_default(
        call_default_factory=True)
    value = setting(run_flags(*argv), field)
    if field in ("perturbations", "user_turn_variants"):  # parsed once: compared by their specs
        value = [parsed.spec for parsed in value]
    assert value == expected


def test_the_flags_of_before_still_parse():
    run = {option for action in _subparser("run")._actions for option in action.option_strings}
    judge = {option for action in _subparser("judge")._actions
             for option in action.option_strings}
    assert set(OLD_RUN_FLAGS) <= run, set(OLD_RUN_FLAGS) - run
    assert set(OLD_JUDGE_FLAGS) <= judge, set(OLD_JUDGE_FLAGS) - judge


def test_flags_override_the_flat_keys_of_a_file(tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text("model: tiny\ndataset: gsm_symbolic\nlimit: 5\nskip_invalid: true\n"
                      "judge: openai/a\njudge_scope: uncertain\njudge_threshold: 0.6\n"
                      "backend_args: {n_ctx: 2048, n_threads: 2}\n")
    kept = run_flags(config=config)
    plan, labelling = kept.plan, kept.labelling
    assert (plan.models, plan.limit, plan.skip_invalid) == (["tiny"], 5, True)
    assert (labelling.judges, labelling.judge_scope, labelling.judge_threshold) == (
        ["openai/a"], "uncertain", 0.6)
    over = run_flags("--model", "fake/probe", "--limit", "all", "--no-skip-invalid",
                     "--judge-threshold", "0.3", "--backend-arg", "n_ctx=4096", config=config)
    assert (over.plan.models, over.plan.limit, over.plan.skip_invalid) == (
        ["fake/probe"], None, False)
    assert (over.labelling.judge_scope, over.labelling.judge_threshold) == ("uncertain", 0.3)
    assert over.engine.backend_args == {"n_ctx": 4096}  # a flag replaces it, as for lists
    assert over.plan.datasets == ["gsm_symbolic"]


def test_the_help_is_the_field_descriptions_with_defaults():
    text = _subparser("run").format_help()
    assert "assistant turn budget; default: 256" in " ".join(text.split())
    assert "executor ray: requests per work unit; default: 256" in " ".join(text.split())


def test_run_and_judge_share_one_judge_spec():
    judge = _parser().parse_args(["judge", "RUN", "--judge", "openai/a"])
    assert arguments.judge_spec_from(judge) == Experiment(judge=["openai/a"]).judge_spec
    judge = _parser().parse_args(["judge", "RUN", "--judge", "openai/a", "--judge", "openai/b",
                                  "--scope", "uncertain", "--threshold", "0.4", "--base-url",
                                  "http://127.0.0.1:9/v1", "--concurrency", "3"])
    spec = arguments.judge_spec_from(judge)
    assert spec == run_flags("--judge", "openai/a", "--judge", "openai/b", "--judge-scope",
                             "uncertain", "--judge-threshold", "0.4", "--judge-base-url",
                             "http://127.0.0.1:9/v1", "--judge-concurrency", "3").judge_spec
    assert spec.judges == ["openai/a", "openai/b"] and spec.judge_concurrency == 3


@pytest.mark.parametrize("flags, words", [
    (["--threshold", "1.5"], "invalid config (judge_threshold): Input should be less than or "
                             "equal to 1"),
    (["--base-url", "ftp://x"], "'ftp://x' is not an http(s) address"),
    (["--concurrency", "0"], "invalid config (judge_concurrency)"),
])
def test_judge_settings_are_checked_as_for_a_run(flags, words, tmp_path, gsm_file, capsys):
    out = tmp_path / "run"
    userturn.run(models=["fake/probe"], datasets=[str(gsm_file)], limit=1, samples=1,
                 output=out)
    capsys.readouterr()
    assert main(["judge", str(out), "--judge", "openai/a", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words in err, err
    sources = {label.source for turn in userturn.load_run(out).turns() for label in turn.labels}
    assert not any(source.startswith("judge:") for source in sources)  # nothing judged


def test_bad_flag_values_are_one_line(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--model", "fake/probe", "--backend-arg", "n_ctx", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "userturn: error: bad setting 'n_ctx': write KEY=VALUE, e.g. n_ctx=4096"
    assert not out.exists()
    with pytest.raises(SystemExit):
        run_flags("--limit", "many")
    assert "expected a whole number or all, got 'many'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_flags("--top-p", "high")
    assert "expected a number, got 'high'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_flags("--batch-size", "big")
    assert "expected a whole number or auto, got 'big'" in capsys.readouterr().err


def test_the_batch_size_is_auto_unless_given(tmp_path):
    assert run_flags().engine.batch_size == "auto"
    assert run_flags("--batch-size", "AUTO").engine.batch_size == "auto"
    config = tmp_path / "exp.yaml"
    config.write_text("batch_size: 32\n")
    assert run_flags(config=config).engine.batch_size == 32
    config.write_text("batch_size: 0\n")
    with pytest.raises(ConfigError, match="batch_size"):
        run_flags(config=config)


def test_train_settings_load_like_an_experiment(tmp_path):
    """One loader: a train file with flags on top, relative dataset paths read as the file's,
    and the same one-line error."""
    folder = tmp_path / "cfg"
    folder.mkdir()
    config = folder / "sft.yaml"
    config.write_text("dataset: gsm8k:data/train.jsonl\neval_items: 5\nsamples: 2\n")
    args = _parser().parse_args(["train", "sft", str(config), "--samples", "3",
                                 "--temperatures", "0,0.5"])
    settings = settings_from(args)
    assert isinstance(settings, SFTSettings)
    assert (settings.training.eval_items, settings.probe.samples) == (5, 3)
    assert settings.probe.temperatures == [0.0, 0.5]
    assert settings.training.dataset == f"gsm8k:{folder / 'data' / 'train.jsonl'}"
    bad = _parser().parse_args(["train", "sft", "--eval-items", "0"])
    with pytest.raises(ConfigError, match=r"invalid config \(eval_items\)"):
        settings_from(bad)


def test_training_is_made_of_the_probe_and_judge_specs_and_of_its_own():
    assert {name: field.annotation for name, field in SFTSettings.model_fields.items()} == {
        "training": Training, "probe": ProbePlan, "evaluation": Evaluation,
        "judging": JudgeSpec, "method": SFTMethod}
    settings = RLSettings(temperatures=[1, 0], judge="openai/j", algorithm="rloo")
    assert type(settings.probe) is ProbePlan and settings.probe.temperatures == [0.0, 1.0]
    assert type(settings.judging) is JudgeSpec and settings.judging.judges == ["openai/j"]
    assert settings.method.algorithm == "rloo"
    # Only the settings it takes: a run's arms or judge scope are not training's.
    for other in ({"arms": ["continuation"]}, {"judge_scope": "all"}):
        with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
            RLSettings(**other)
    # The manifest is flat, as it always was.
    assert list(SFTSettings().model_dump())[:3] == ["model", "dataset", "eval_items"]
    assert "temperatures" in SFTSettings().model_dump() and "arms" not in SFTSettings().model_dump()
    # Its probe runs are experiments of those specs.
    exp = settings.experiment("tiny", "gsm_symbolic", Path("runs/t/eval-base"), limit=5,
                              judge=True)
    assert (exp.plan.models, exp.plan.limit, exp.plan.temperatures) == (["tiny"], 5, [0.0, 1.0])
    assert (exp.labelling.judges, exp.labelling.judge_scope) == (["openai/j"], "all")
    assert exp.engine.batch_size == settings.evaluation.generation_batch_size


@pytest.mark.parametrize("flags", [
    ["--temperatures", "11"], ["--temperatures", "nan"], ["--samples", "0"],
    ["--samples", "20000"], ["--max-tokens", "0"], ["--user-max-tokens", "2000000"],
    ["--judge-base-url", "ftp://x"], ["--judge-base-url", "http://u:p@127.0.0.1:9/v1"],
])
@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_train_refuses_what_run_refuses_in_the_same_line(flags, kind, tmp_path, capsys):
    assert main(["run", *flags, "-o", str(tmp_path / "run")]) == 2
    refused = capsys.readouterr().err
    assert main(["train", kind, *flags, "--output", str(tmp_path / "train")]) == 2
    assert capsys.readouterr().err == refused and refused.count("\n") == 1
    assert not (tmp_path / "run").exists() and not (tmp_path / "train").exists()


def test_a_judge_spec_is_what_an_experiment_holds():
    exp = Experiment(judge="openai/a", judge_scope="all", judge_concurrency=4)
    assert exp.judge_spec == JudgeSpec(judge="openai/a", judge_scope="all", judge_concurrency=4)
    assert JudgeSpec().model_dump() == {name: setting(Experiment(), name)
                                        for name in JudgeSpec.model_fields}


def test_a_setting_without_a_command_line_form_fails_when_the_parser_is_built():
    class Odd(BaseModel):
        weights: dict[str, float] = {}

    with pytest.raises(TypeError, match="Odd.weights: no command-line form"):
        add_flags(argparse.ArgumentParser(), Odd)
    with pytest.raises(TypeError, match="names no field of Odd"):
        add_flags(argparse.ArgumentParser(), Odd, {"weight": Flag(repeat=True)})


def test_a_copy_changes_flat_settings_through_their_specs_checks():
    """``Experiment.model_copy(update=...)`` names settings flat, as a file or a flag does: the
    part that owns each is made again (with its checks); a name no part takes is refused, never
    set beside the parts where nothing reads it."""
    exp = Experiment(models=["tiny"], user_turn_variants=["prefill:So"], limit=20)
    copy = exp.model_copy(update={"limit": 3, "temperatures": [0.0], "judge": ["smollm2"]})
    assert (copy.plan.limit, copy.plan.temperatures, copy.labelling.judge) == (3, [0.0],
                                                                               ["smollm2"])
    assert copy.plan.user_turn_variants == exp.plan.user_turn_variants  # the rest kept
    assert exp.plan.limit == 20  # a copy: the original is as it was
    assert copy.model_dump()["limit"] == 3  # stored flat as it reads
    with pytest.raises(ValueError, match="has no setting limt"):
        exp.model_copy(update={"limt": 3})
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1"):
        exp.model_copy(update={"limit": -3})
    with pytest.raises(ValueError, match="given whole"):
        exp.model_copy(update={"plan": exp.plan, "limit": 3})
    assert exp.model_copy(update={"plan": copy.plan}).plan.limit == 3
