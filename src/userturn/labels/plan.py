"""How a run's user turns are labelled: the offline labeller, the classifier's parameters, and
which judges are asked about which turns. ``JudgeSpec`` is what `userturn judge` is given;
``LabellingPlan`` adds the offline labeller for a run (``userturn.config.Experiment`` composes it
under the same YAML keys and flags). The plan builds its judges and works out the run's label
sources, each in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from userturn.errors import ConfigError
from userturn.labels.sources import DEFAULT_LABELLER, OfflineLabeller, labeller_named
from userturn.records import JudgeScopeName, Labeller
from userturn.settings import Spec, reading_stored, url_setting

JudgeModels = Annotated[str | list[str] | None, Field(
    description="e.g. openai/gpt-5.4-mini, llamacpp/FILE.gguf, a local model, or a list of "
    "judges (each stored under its own source, their majority deciding); key from "
    "OPENAI_API_KEY, never from a file")]


def unique_judges(judge: str | list[str] | None) -> list[str]:
    """The judge specs, one or several (``judge: [A, B]``), without repeats."""
    if judge is None:
        return []
    return list(dict.fromkeys([judge] if isinstance(judge, str) else judge))


def checked_file(value: Path | None, info: ValidationInfo,
                 load: Callable[[Path], object]) -> Path | None:
    """A parameters file read whole by ``load`` when the settings are read, before any dataset
    or model loads: a wrong file fails in one line, not after the run has generated everything.
    (A stored run's file was read when it ran: reading its settings back does not need it.)"""
    if value is not None and not reading_stored(info):
        try:
            load(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return value


class JudgeSpec(Spec):
    """Who judges which turns, where: what `userturn judge` is given (a run's labelling plan
    holds the same settings under the same names)."""

    judge: JudgeModels = None
    judge_scope: JudgeScopeName = Field(
        default="undecided", description="judge what the rules leave undecided, only the turns "
        "the classifier is unsure of (probability below the judge threshold), or all")
    judge_threshold: float = Field(
        default=0.7, gt=0.0, le=1.0, description="judge scope uncertain: the classifier "
        "probability below which the judge is asked")
    judge_base_url: Annotated[str | None, AfterValidator(url_setting)] = Field(
        default=None, description="the judge's OpenAI-compatible server, e.g. "
        "http://127.0.0.1:8000/v1; default: OPENAI_BASE_URL, else the OpenAI API")
    judge_concurrency: int = Field(default=8, ge=1, le=256,
                                   description="judge requests in flight at most")
    judge_calibration: Path | None = Field(
        default=None, description="a local judge read from label probabilities: the "
        "calibration fit for it on labelled turns (benchmarks/judge_quality.py "
        "--fit-calibration; docs/classifier.md)")

    @field_validator("judge_calibration")
    @classmethod
    def _calibration_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        from userturn.labels.local_judge import JudgeCalibration

        return checked_file(value, info, JudgeCalibration.load)

    @property
    def judges(self) -> list[str]:
        """The judge specs, one or several (``judge: [A, B]``), without repeats."""
        return unique_judges(self.judge)

    def build_judges(self, sleep: Callable[[float], None] | None = None) -> list:  # type: ignore[type-arg]
        """Every judge, built and checked (a spec that names no judge, a missing key, a bad
        address: one error before anything is sent). ``sleep``: how an API client waits
        between retries."""
        from userturn.labels.judges import judge_from_spec

        calibration = None
        if self.judge_calibration is not None:
            from userturn.labels.local_judge import JudgeCalibration

            if len(self.judges) != 1:
                raise ConfigError("judge_calibration calibrates one judge: give one judge "
                                  f"with it, not {len(self.judges)}")
            calibration = JudgeCalibration.load(self.judge_calibration)
        return [judge_from_spec(spec, base_url=self.judge_base_url, sleep=sleep,
                                concurrency=self.judge_concurrency, calibration=calibration)
                for spec in self.judges]


class LabellingPlan(JudgeSpec):
    """The offline labeller and the judges of a run."""

    labeller: Labeller = Field(
        default=DEFAULT_LABELLER, description="who labels the user turns offline: cascade (the rules "
        "decide the clear cases, the learned classifier labels every other turn), the "
        "classifier alone, or the rules alone (undecided turns stay undecided)")
    classifier: Path | None = Field(default=None, description="the classifier's parameters "
                                    "(from userturn train-classifier); default: the shipped one")

    @field_validator("labeller")
    @classmethod
    def _known_labeller(cls, value: str) -> str:
        """A row of the labeller table (:mod:`.sources`), else its one error."""
        try:
            return labeller_named(value).name
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("classifier")
    @classmethod
    def _classifier_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        from userturn.labels.classifier import LinearModel

        return checked_file(value, info, LinearModel.load)

    @property
    def offline(self) -> OfflineLabeller:
        return labeller_named(self.labeller)
