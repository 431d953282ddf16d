"""What a training run is: one validated object, written whole (flat) into the manifest.

It is made of specs, as the experiment is: what only training has is training's own
(:class:`Training`, :class:`Evaluation`, and each method's :class:`SFTMethod` or
:class:`RLMethod`); the probe's sampling settings are the probe's plan and the judge is the
judge's spec, so a temperature, a token budget or a judge's address is checked, and refused, in
``userturn train`` exactly as in ``userturn run``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from userturn.config import Experiment
from userturn.labels.plan import JudgeSpec, LabellingPlan
from userturn.probe.engine import MAX_BATCH, EngineSpec
from userturn.probe.plan import ProbePlan, check_temperature
from userturn.settings import Composed, Part, Spec

# The probe's settings a training run takes: the training data and the before/after probe are
# generated with them (the probe's own defaults). The judge: who labels the before/after.
SAMPLING = ("temperatures", "samples", "max_tokens", "user_max_tokens")
JUDGING = ("judge", "judge_base_url")


class Training(Spec):
    """The base, the split, LoRA and the optimiser."""

    model: str = "smollm2"
    dataset: str = "gsm_symbolic"
    eval_items: int = Field(default=20, ge=1, description="held-out items: the dataset's first N "
                            "(what `userturn run --limit N` probes)")
    train_items: int = Field(default=40, ge=1, description="training items: the next N")
    seed: int = Field(default=0, ge=0)
    output: Path = Path("runs/train")
    full: bool = Field(default=False, description="full fine-tuning instead of a LoRA adapter")
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    learning_rate: float | None = Field(default=None, gt=0.0, description="default: 2e-4 for "
                                        "LoRA SFT, 1e-5 for full SFT, 1e-5 for RL")
    max_steps: int = Field(default=-1, description="-1: epochs decide")
    epochs: float = Field(default=1.0, gt=0.0)
    batch_size: int = Field(default=4, ge=1)
    gradient_accumulation: int = Field(default=1, ge=1)
    max_length: int = Field(default=1024, ge=16)
    device: str | None = None
    gradient_checkpointing: bool | None = Field(default=None, description="recompute "
                                                "activations to save memory; default: on with "
                                                "a GPU, off on CPU (where it only costs time)")


class Evaluation(Spec):
    """How training generates (its data, the reward's user turns) and whether the before/after
    runs."""

    generation_batch_size: int = Field(default=8, ge=1, le=MAX_BATCH)
    evaluate: bool = True


class SFTMethod(Spec):
    data: str = Field(default="self", description="'self' (self-generated collaboration data) "
                      "or a multi-turn conversation file")
    loss_on: Literal["assistant", "user", "both"] = "both"
    data_samples: int = Field(default=8, ge=1, description="self data: user turns sampled per "
                              "training item")
    data_temperature: Annotated[float, AfterValidator(
        lambda t: check_temperature(t, "data_temperature"))] = Field(default=1.0, gt=0.0)
    next_answer: bool = True
    mix_correct: bool = True


class RLMethod(Spec):
    algorithm: Literal["grpo", "rloo"] = "grpo"
    reward: Literal["probe", "collab"] = "probe"
    num_generations: int = Field(default=4, ge=2)
    beta: float = Field(default=0.04, ge=0.0, description="KL anchor to the base model (on by "
                        "default; GRPO's own default is off)")
    max_completion_length: int | None = Field(default=None, ge=1, description="default: "
                                              "user_max_tokens (probe), max_tokens (collab)")
    rl_temperature: float = Field(default=1.0, gt=0.0)
    restatement_penalty: float = 1.0
    drift_penalty: float = 1.0
    length_penalty: float = 0.01
    free_tokens: int = 64
    follow_weight: float = 0.5
    token_weight: float = 0.001
    collab_samples: int = Field(default=2, ge=1)


class TrainSettings(Composed):
    """Shared by ``train sft`` and ``train rl``: training's own settings, the probe's sampling
    and the before/after's judge. The parts' order is the order of the help."""

    training: Training = Field(default_factory=Training)
    probe: Annotated[ProbePlan, Part(only=SAMPLING)] = Field(default_factory=ProbePlan)
    evaluation: Evaluation = Field(default_factory=Evaluation)
    judging: Annotated[JudgeSpec, Part(only=JUDGING)] = Field(default_factory=JudgeSpec)

    def experiment(self, model: str, dataset: str, output: Path, *, limit: int | None,
                   temperatures: list[float] | None = None, samples: int | None = None,
                   judge: bool = False) -> Experiment:
        """A probe run of training's (the self-generated data, the answers the reward follows,
        the before/after): the probe's settings, with the run's models, items and folder and,
        where given, its own temperatures and samples; ``judge``: labelled by the judge too."""
        plan = ProbePlan(models=[model], datasets=[dataset], limit=limit, seed=self.training.seed,
                         output=output, **{
                             **{name: getattr(self.probe, name) for name in SAMPLING},
                             **({} if temperatures is None else {"temperatures": temperatures}),
                             **({} if samples is None else {"samples": samples})})
        engine = EngineSpec(batch_size=self.evaluation.generation_batch_size)
        labelling = LabellingPlan(judge=self.judging.judge, judge_scope="all",
                                  judge_base_url=self.judging.judge_base_url) if judge else \
            LabellingPlan()
        return Experiment(plan=plan, engine=engine, labelling=labelling)


class SFTSettings(TrainSettings):
    method: SFTMethod = Field(default_factory=SFTMethod)


class RLSettings(TrainSettings):
    method: RLMethod = Field(default_factory=RLMethod)
