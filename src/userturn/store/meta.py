"""A run's metadata as one typed value: what ran, when, with which versions, and how its turns
are labelled.

The store keeps it in its ``meta`` table, one JSON value per key (an annotator's sample under
``annotation_sample:NAME``); :meth:`RunMeta.from_rows` and :meth:`RunMeta.rows` are the only
translation between the two, and only :class:`~userturn.store.database.RunStore` calls them.
Older runs lack some keys (defaults stand in) or hold keys this version no longer writes (kept as
extra fields, written back unchanged).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from userturn.records import Labeller
from userturn.settings import S

SAMPLE_PREFIX = "annotation_sample:"


class ModelMeta(BaseModel):
    """One probed or answering model as the run used it."""

    model_config = ConfigDict(extra="allow")  # variant and template details vary by backend

    revision: str = ""
    template_hash: str = ""
    system_message: str | None = None
    """What the probe prompt did with the run's system message, in plain words."""
    template_variables: dict[str, Any] | None = None
    user_turn_variant: str | None = None
    base_model: str | None = None


class AnnotationSample(BaseModel):
    """The turns one annotator was given, and how they were drawn."""

    model_config = ConfigDict(extra="allow")

    keys: list[str]
    size: int
    seed: int
    strata_source: str | None = None
    """The source whose labels stratified the sample (an annotation sample)."""
    labeller: list[str] | None = None
    """The label sources a calibration sample was stratified by."""
    inclusion: dict[str, float] | None = None
    """A calibration sample's inclusion probability of each key."""

    @property
    def calibration(self) -> bool:
        return self.inclusion is not None


class StageTime(BaseModel):
    """Where a run's time went in one stage: wall seconds, what it did (``count`` of ``unit``)
    and the tokens it generated (None where a stage generates none, e.g. labelling)."""

    stage: str  # model load, answers, user turns, labelling, judge
    seconds: float
    count: int = 0
    unit: str = ""
    tokens: int | None = None

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.seconds if self.tokens is not None and self.seconds > 0 \
            else None

    @property
    def per_second(self) -> float | None:
        return self.count / self.seconds if self.seconds > 0 else None

    def line(self) -> str:
        """One line, as a researcher planning a sweep reads it and multiplies."""
        done = f", {self.count} {self.unit}" if self.unit else ""
        rated = self.unit not in ("", "models") and self.per_second  # loading has no rate
        rate = f" ({self.per_second:.2f} {self.unit}/s)" if rated else ""
        tokens = (f", {self.tokens} tokens ({self.tokens_per_second:.1f} tokens/s)"
                  if self.tokens is not None and self.tokens_per_second is not None else "")
        return f"{self.stage}: {self.seconds:.2f} s{done}{rate}{tokens}"


class RunMeta(BaseModel):
    """Everything a run records about itself besides its generations and labels."""

    model_config = ConfigDict(extra="allow")

    config: dict[str, Any] = Field(default_factory=dict)
    """The experiment as run (``Experiment.model_dump``), kept as written: an older run's
    settings stay readable after the experiment's fields change."""
    versions: dict[str, str] = Field(default_factory=dict)
    started: float | None = None
    finished: float | None = None
    """When the run last finished (None: it has not, or stopped early)."""
    models: dict[str, ModelMeta] = Field(default_factory=dict)
    skipped: dict[str, int] = Field(default_factory=dict)
    """Dataset -> rows skipped at load as invalid."""
    dataset_notes: dict[str, list[str]] = Field(default_factory=dict)
    label_sources: list[str] = Field(default_factory=lambda: ["rules"])
    """Which sources decide a turn's label, in order: the first that labelled it wins."""
    labeller: Labeller | None = None  # a row of labels.sources.LABELLERS (run_labeller checks)
    """The offline labeller of the run (None: a run labelled before it was recorded)."""
    annotation_samples: dict[str, AnnotationSample] = Field(default_factory=dict)
    """Annotator name -> the sample they label."""
    schema_version: int | None = None
    stages: list[StageTime] = Field(default_factory=list)
    """Where the runs into the folder spent their time, stage by stage, added up (a resumed run
    adds what it did, not what it read back)."""

    @property
    def finished_now(self) -> bool:
        """Whether the latest run into the folder finished (a stamp from an earlier run that a
        later one restarted does not count)."""
        return self.finished is not None and self.finished >= (self.started or 0)

    def stored(self, spec: type[S]) -> S:
        """The stored experiment's part that ``spec`` owns, typed (``meta.stored(ProbePlan)``):
        read with this version's types, an older run's missing settings at their defaults, and a
        run whose experiment no longer reads refused in one line (``Spec.stored``). Readers take
        the experiment this way, never by key from :attr:`config`."""
        return spec.stored(self.config)

    @classmethod
    def from_rows(cls, rows: Mapping[str, Any]) -> RunMeta:
        """The metadata from the store's key -> decoded JSON rows."""
        samples = {key[len(SAMPLE_PREFIX):]: value for key, value in rows.items()
                   if key.startswith(SAMPLE_PREFIX)}
        plain = {key: value for key, value in rows.items() if not key.startswith(SAMPLE_PREFIX)}
        return cls.model_validate({**plain, "annotation_samples": samples})

    def rows(self, fields: Iterable[str]) -> dict[str, Any]:
        """The store rows (key -> JSON-ready value) that hold ``fields``."""
        out: dict[str, Any] = {}
        for name in fields:
            if name == "annotation_samples":
                out.update({f"{SAMPLE_PREFIX}{annotator}": sample.model_dump(exclude_none=True)
                            for annotator, sample in self.annotation_samples.items()})
            elif name == "models":
                out[name] = {spec: model.model_dump(exclude_none=True)
                             for spec, model in self.models.items()}
            elif name in type(self).model_fields:
                out[name] = self.model_dump(mode="json", include={name})[name]
            else:
                out[name] = (self.model_extra or {})[name]
        return out


class MetaChanges(TypedDict, total=False):
    """The fields of :class:`RunMeta` a command changes, with their types:
    ``RunStore.update_meta(finished=time.time())`` is checked by the type checker, and a name not
    here is refused when called. Each is typed as the :class:`RunMeta` field of the same name
    (``tests/test_store_rows.py`` holds them together); ``schema_version`` is the store's own."""

    config: dict[str, Any]
    versions: dict[str, str]
    started: float | None
    finished: float | None
    models: dict[str, ModelMeta]
    skipped: dict[str, int]
    dataset_notes: dict[str, list[str]]
    label_sources: list[str]
    labeller: Labeller | None
    annotation_samples: dict[str, AnnotationSample]
    stages: list[StageTime]


def damaged_meta(rows: Mapping[str, str]) -> str:
    """What is wrong with the store's raw ``meta`` rows (key -> JSON text), in words naming the
    damaged keys ("'config' is not JSON"); "" when they make a valid :class:`RunMeta`."""
    decoded: dict[str, Any] = {}
    broken: list[str] = []
    for key, text in rows.items():
        try:
            decoded[key] = json.loads(text)
        except (ValueError, TypeError, RecursionError):
            broken.append(key)
    if broken:
        return " and ".join(f"{key!r}" for key in broken) + (" is" if len(broken) == 1 else
                                                               " are") + " not JSON"
    try:
        RunMeta.from_rows(decoded)
    except ValidationError as exc:
        fields = sorted({str(error["loc"][0]) for error in exc.errors() if error["loc"]})
        return (" and ".join(f"{name!r}" for name in fields) or "a value") + " has the wrong shape"
    return ""
