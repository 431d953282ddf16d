"""What the probe plans: models x datasets x temperatures x samples, the answers, perturbations and
user-turn variants, with the values parsed once (a ``Perturbation``, a ``UserVariant``).

The probe's stages read this spec only (:mod:`.pipeline`); how the models run is the engine's spec
(:mod:`.engine`), how turns are labelled the labelling plan (:mod:`userturn.labels.plan`), and
``userturn.config.Experiment`` composes the three under the YAML keys and flags users know. A run
stores the experiment it ran; ``meta.stored(ProbePlan)`` reads the plan back for the report
and the exports.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, ValidationInfo, field_validator

from userturn.probe.perturb import Perturbation, parse_perturbations
from userturn.probe.user_variants import UserVariant, parse_user_variants
from userturn.records import DEFAULT_ARM, Arm
from userturn.settings import Spec, check_folder_name, reading_stored

MAX_TEMPERATURE = 10.0  # beyond this sampling is uniform noise; inf/nan break every backend
MAX_ITEMS = 1_000_000
MAX_TOKENS = 1_000_000  # a budget; each backend also clamps it to what its context leaves

DEFAULT_MODEL = "smollm2"
DEFAULT_DATASET = "gsm_symbolic"


def samplable(temperature: float) -> bool:
    """A temperature every backend takes: finite, from 0 (greedy) to MAX_TEMPERATURE; the one
    test of every setting that samples (the probe's temperatures, training's)."""
    return math.isfinite(temperature) and 0 <= temperature <= MAX_TEMPERATURE


def check_temperature(value: float, name: str) -> float:
    """One sampling temperature, as a settings validator."""
    if not samplable(value):
        raise ValueError(f"{name} must be a number from 0 (greedy) to {MAX_TEMPERATURE:g}, "
                         f"got {value}")
    return value


def _perturbations(values: Any) -> Any:
    if isinstance(values, (list, tuple)) and all(isinstance(v, str) for v in values):
        return parse_perturbations(values)
    return values


def _user_variants(values: Any, info: ValidationInfo) -> Any:
    if isinstance(values, (list, tuple)) and all(isinstance(v, str) for v in values):
        # A stored run's template file was read when it generated: reading it back needs none.
        return parse_user_variants(values, check_files=not reading_stored(info))
    return values


def _specs(values: Any) -> list[str]:
    return [value.spec for value in values]


# Parsed once, when the settings are read; stored and shown as their specs ("truncate:0.5").
Perturbations = Annotated[list[Perturbation], BeforeValidator(_perturbations),
                          PlainSerializer(_specs, return_type=list[str])]
UserVariants = Annotated[list[UserVariant], BeforeValidator(_user_variants),
                         PlainSerializer(_specs, return_type=list[str])]


class ProbePlan(Spec):
    """Models x datasets x temperatures x samples. Greedy (temperature 0) gets one sample."""

    models: list[str] = Field(default_factory=lambda: [DEFAULT_MODEL], min_length=1,
                              description="model specs: an embedded name, a local folder, a hub "
                              "id, or ENGINE/MODEL (openai/, vllm/, llamacpp/, fake/)")
    datasets: list[str] = Field(default_factory=lambda: [DEFAULT_DATASET], min_length=1,
                                description="gsm_symbolic (offline), gsm8k (hub), any spec of "
                                "`userturn datasets`, or a .jsonl/.json/.parquet/.csv file")
    limit: int | None = Field(default=20, ge=1, le=MAX_ITEMS,
                              description="items per dataset; all (or null) for every item")
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 1.0], min_length=1,
                                      description="sampling temperatures, 0 = greedy")
    samples: int = Field(default=4, ge=1, le=10_000,
                         description="user turns per item at each T > 0")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling at T > 0")
    max_tokens: int = Field(default=256, ge=1, le=MAX_TOKENS, description="assistant turn budget")
    user_max_tokens: int = Field(default=96, ge=1, le=MAX_TOKENS,
                                 description="generated user turn budget")
    arms: list[Arm] = Field(
        default_factory=lambda: [DEFAULT_ARM], min_length=1,
        description="how the user turn is asked for: opened (the probe opens the USER header) "
        "and/or continuation (the assistant's turn is closed and the model goes on: who speaks "
        "next is measured too)")
    continuation_max_tokens: int = Field(
        default=128, ge=1, le=MAX_TOKENS, description="the continuation arm's budget: the role "
        "header the model writes, a short user turn and its end-of-turn marker")
    seed: int = Field(default=0, ge=0, description="run seed; every sample's seed derives from it")
    system_prompt: str | None = Field(default=None, description="a system message put before "
                                      "every item's conversation")
    answerers: list[str] = Field(
        default_factory=lambda: ["self"], min_length=1,
        description="where the assistant answer comes from: self (the probed model), reference "
                    "(the dataset's solution), or another model spec (answerer x prober)")
    perturbations: Perturbations = Field(
        default_factory=list, description="e.g. truncate:0.5, append_question:specific, "
        "wrong_answer, swap, empty, refusal; the unperturbed context always runs too")
    user_turn_variants: UserVariants = Field(
        default_factory=list, description="the user turn's opening as a factor: native, "
        "prefill:TEXT, system:none|default|TEXT, template:FILE, warmup:K; each a condition of "
        "its own (the user_variant column; MODEL[user=SPEC] in the tables) paired with native, "
        "which always runs too")
    fields: dict[str, str] = Field(
        default_factory=dict, description="your file's columns: query, answer, id, system")
    skip_invalid: bool = Field(default=False, description="record and count malformed rows "
                               "instead of stopping at the first")
    context_turns: int | None = Field(default=None, ge=1, description="conversation datasets: "
                                      "the probe context is the first k user turns (default 1)")
    output: Path = Field(default=Path("runs/demo"), description="the run folder")
    thinking: Literal["drop", "keep"] = Field(
        default="drop", description="the assistant answer's thinking in the user-turn prompt: "
        "drop (as the template drops it from history) or keep (shown before the answer)")
    enable_thinking: list[bool] | None = Field(
        default=None, description="Qwen3-style templates: probe each model with thinking on "
        "and/or off, each a condition of its own (the enable_thinking column; "
        "MODEL[thinking=on] in the tables); unset: template default")

    @field_validator("temperatures")
    @classmethod
    def _temperatures(cls, values: list[float]) -> list[float]:
        bad = [t for t in values if not samplable(t)]
        if bad:
            raise ValueError(f"temperatures must be numbers from 0 (greedy) to "
                             f"{MAX_TEMPERATURE:g}, got {bad[0]}")
        return sorted(set(values))

    @field_validator("arms")
    @classmethod
    def _arms(cls, values: list[str]) -> list[str]:
        if len(set(values)) != len(values):
            raise ValueError("arms names each arm once: opened, continuation")
        return values

    @field_validator("output", mode="before")
    @classmethod
    def _output_folder(cls, value: Any) -> Any:
        if isinstance(value, (str, Path)):
            check_folder_name(str(value), "output")
        return value

    @field_validator("limit", mode="before")
    @classmethod
    def _all_items(cls, value: Any) -> Any:
        return None if isinstance(value, str) and value.strip().lower() == "all" else value

    @field_validator("enable_thinking", mode="before")
    @classmethod
    def _enable_thinking(cls, value: Any) -> Any:
        return [value] if isinstance(value, bool) else value  # one value: a list of one

    @field_validator("enable_thinking")
    @classmethod
    def _enable_thinking_values(cls, values: list[bool] | None) -> list[bool] | None:
        if values is not None and (not values or len(set(values)) != len(values)):
            raise ValueError("enable_thinking takes true, false or both, each once (leave it "
                             "out for the template default)")
        return values

    def samples_at(self, temperature: float) -> int:
        return 1 if temperature <= 0 else self.samples

    def lost_settings(self) -> list[str]:
        """Of a plan read back from a run (``stored``): what the run probed that its stored
        experiment no longer names. Every run stores its models and datasets; read without them,
        the defaults would make it a run of smollm2 on gsm_symbolic."""
        return [name for name in ("models", "datasets") if name not in self.model_fields_set]
