"""What a training run is: one validated object, written whole into the manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TrainSettings(BaseModel):
    """Shared by ``train sft`` and ``train rl``: the base, the split, LoRA and the evaluation."""

    model_config = ConfigDict(extra="forbid")

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
    # Generation: the training data, and the before/after probe (the probe's own defaults).
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 1.0], min_length=1)
    samples: int = Field(default=4, ge=1)
    max_tokens: int = Field(default=256, ge=1)
    user_max_tokens: int = Field(default=96, ge=1)
    generation_batch_size: int = Field(default=8, ge=1)
    evaluate: bool = True
    judge: str | None = Field(default=None, description="a labeller other than the rules for the "
                              "before/after (a judge spec, as for `userturn run --judge`)")
    judge_base_url: str | None = None


class SFTSettings(TrainSettings):
    data: str = Field(default="self", description="'self' (self-generated collaboration data) "
                      "or a multi-turn conversation file")
    loss_on: Literal["assistant", "user", "both"] = "both"
    data_samples: int = Field(default=8, ge=1, description="self data: user turns sampled per "
                              "training item")
    data_temperature: float = Field(default=1.0, gt=0.0)
    next_answer: bool = True
    mix_correct: bool = True


class RLSettings(TrainSettings):
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
