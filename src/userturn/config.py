"""The experiment config: one typed object, from a YAML file, with CLI flags on top (the flags
are generated from these fields, so each setting is defined here once)."""

from __future__ import annotations

import math
import os
import types
import typing
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from userturn.data import spec_file
from userturn.errors import ConfigError
from userturn.records import JudgeScopeName, Labeller

MAX_TEMPERATURE = 10.0  # beyond this sampling is uniform noise; inf/nan break every backend
MAX_ITEMS = 1_000_000
MAX_TOKENS = 1_000_000  # a budget; each backend also clamps it to what its context leaves

DEFAULT_MODEL = "smollm2"
DEFAULT_DATASET = "gsm_symbolic"

def _checked_url(value: str | None) -> str | None:
    try:
        return check_url(value, "the server address")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


# The judge settings, defined once for `userturn run` (the judge* keys of an experiment) and
# `userturn judge` (a ``JudgeSpec``): the same names, limits and help in both, and the defaults
# of ``JudgeSpec``.
JudgeModels = Annotated[str | list[str] | None, Field(
    description="e.g. openai/gpt-5.4-mini, or a list of judges (each stored "
    "under its own source, their majority deciding); key from OPENAI_API_KEY, never from a "
    "file")]
JudgeScope = Annotated[JudgeScopeName, Field(
    description="judge what the rules leave undecided, only the turns "
    "the classifier is unsure of (probability below the judge threshold), or all")]
JudgeThreshold = Annotated[float, Field(
    gt=0.0, le=1.0, description="judge scope uncertain: the classifier "
    "probability below which the judge is asked")]
JudgeBaseUrl = Annotated[str | None, AfterValidator(_checked_url), Field(
    description="the judge's OpenAI-compatible server, e.g. "
    "http://127.0.0.1:8000/v1; default: OPENAI_BASE_URL, else the OpenAI API")]
JudgeConcurrency = Annotated[int, Field(ge=1, le=256,
                                        description="judge requests in flight at most")]


def refuse_booleans_as_numbers(model: type[BaseModel], data: Any) -> Any:
    """``limit: true`` is a mistake, not 1: pydantic reads a boolean as the number 0 or 1, so a
    numeric setting given true or false is refused by name."""
    if isinstance(data, dict):
        for name, value in data.items():
            field = model.model_fields.get(name)
            if isinstance(value, bool) and field is not None and \
                    _numeric(field.annotation):
                raise ValueError(f"{name} takes a number, not {str(value).lower()}")
    return data


def _numeric(annotation: Any) -> bool:
    kinds = typing.get_args(annotation) if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else (annotation,)
    return any(kind in (int, float) for kind in kinds)

def unique_judges(judge: str | list[str] | None) -> list[str]:
    """The judge specs, one or several (``judge: [A, B]``), without repeats."""
    if judge is None:
        return []
    return list(dict.fromkeys([judge] if isinstance(judge, str) else judge))


class JudgeSpec(BaseModel):
    """Who judges which turns, where: what `userturn judge` is given (an experiment holds the
    same settings under the same names, see ``Experiment.judge_spec``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    judge: JudgeModels = None
    judge_scope: JudgeScope = "undecided"
    judge_threshold: JudgeThreshold = 0.7
    judge_base_url: JudgeBaseUrl = None
    judge_concurrency: JudgeConcurrency = 8

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, data: Any) -> Any:
        return refuse_booleans_as_numbers(cls, data)

    @property
    def judges(self) -> list[str]:
        return unique_judges(self.judge)


_JUDGE = JudgeSpec()
  # the judge defaults, for an experiment's judge* keys


class Experiment(BaseModel):
    """Models x datasets x temperatures x samples. Greedy (temperature 0) gets one sample."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
    seed: int = Field(default=0, ge=0, description="run seed; every sample's seed derives from it")
    batch_size: Annotated[int, Field(ge=1, le=4096)] | Literal["auto"] = Field(
        default="auto", description="prompts per backend batch; auto: on a GPU the largest "
        "batch that fits (halved on running out of memory, once per run), on the CPU 8")
    system_prompt: str | None = Field(default=None, description="a system message put before "
                                      "every item's conversation")
    answerers: list[str] = Field(
        default_factory=lambda: ["self"], min_length=1,
        description="where the assistant answer comes from: self (the probed model), reference "
                    "(the dataset's solution), or another model spec (answerer x prober)")
    perturbations: list[str] = Field(
        default_factory=list, description="e.g. truncate:0.5, append_question:specific, "
        "wrong_answer, swap, empty, refusal; the unperturbed context always runs too")
    user_turn_variants: list[str] = Field(
        default_factory=list, description="the user turn's opening as a factor: native, "
        "prefill:TEXT, system:none|default|TEXT, template:FILE, warmup:K; each a model of its "
        "own (MODEL[user=SPEC]) paired with native, which always runs too")
    fields: dict[str, str] = Field(
        default_factory=dict, description="your file's columns: query, answer, id, system")
    skip_invalid: bool = Field(default=False, description="record and count malformed rows "
                               "instead of stopping at the first")
    context_turns: int | None = Field(default=None, ge=1, description="conversation datasets: "
                                      "the probe context is the first k user turns (default 1)")
    output: Path = Field(default=Path("runs/demo"), description="the run folder")
    base_url: str | list[str] | None = Field(
        default=None, description="openai/MODEL models: the OpenAI-compatible server (its "
        "/v1/completions endpoint), or a list of servers of the same model")
    endpoint_concurrency: int = Field(default=8, ge=1, description="openai/MODEL models: "
                                      "requests in flight at most, per server")
    executor: Literal["local", "ray"] = Field(
        default="local", description="where generations run: in this process (local) or on Ray "
        "actors, each holding one backend (pip install 'userturn[ray]')")
    ray_address: str | None = Field(default=None, description="executor ray: the cluster "
                                    "(auto, or HOST:PORT); default: a local cluster")
    replicas: int = Field(default=1, ge=1, description="executor ray: actors per model")
    gpus_per_replica: float = Field(default=0.0, ge=0.0, description="executor ray: GPUs of "
                                    "each actor (vLLM: its tensor_parallel_size)")
    unit_size: int = Field(default=256, ge=1, description="executor ray: requests per work unit")
    unit_timeout: float = Field(default=1800.0, gt=0.0, description="executor ray: seconds a "
                                "unit may run before it is cancelled and requeued")
    unit_retries: int = Field(default=2, ge=0, description="executor ray: requeues of a failed "
                              "unit before its requests are stored as errors")
    max_restarts: int = Field(default=3, ge=0, description="executor ray: restarts of a dead "
                              "actor (Ray's max_restarts)")
    tokenizer: str | None = Field(default=None, description="openai/MODEL models: where the "
                                  "tokenizer and chat template come from (default: MODEL)")
    prompt_as: Literal["tokens", "text"] = Field(
        default="tokens", description="openai/MODEL models: send the rendered prompt as token "
        "ids (vLLM, SGLang, llama.cpp) or as text (transformers serve)")
    backend_args: dict[str, Any] = Field(
        default_factory=dict, description="engine arguments for vllm/ and llamacpp/ models, "
        "as they are (e.g. tensor_parallel_size, data_parallel_size, n_ctx, n_gpu_layers)")
    thinking: Literal["drop", "keep"] = Field(
        default="drop", description="the assistant answer's thinking in the user-turn prompt: "
        "drop (as the template drops it from history) or keep (shown before the answer)")
    enable_thinking: list[bool] | None = Field(
        default=None, description="Qwen3-style templates: probe each model with thinking on "
        "and/or off, each a model of its own, e.g. MODEL[thinking=on]; unset: template default")
    judge: JudgeModels = _JUDGE.judge
    labeller: Labeller = Field(
        default="cascade", description="who labels the user turns offline: cascade (the rules "
        "decide the clear cases, the learned classifier labels every other turn), the "
        "classifier alone, or the rules alone (undecided turns stay undecided)")
    classifier: Path | None = Field(default=None, description="the classifier's parameters "
                                    "(from userturn train-classifier); default: the shipped one")
    judge_scope: JudgeScope = _JUDGE.judge_scope
    judge_threshold: JudgeThreshold = _JUDGE.judge_threshold
    judge_base_url: JudgeBaseUrl = _JUDGE.judge_base_url
    judge_concurrency: JudgeConcurrency = _JUDGE.judge_concurrency

    @property
    def judges(self) -> list[str]:
        """The judge specs, one or several (``judge: [A, B]``), without repeats."""
        return unique_judges(self.judge)

    @property
    def judge_spec(self) -> JudgeSpec:
        return JudgeSpec(**{name: getattr(self, name) for name in JudgeSpec.model_fields})

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, data: Any) -> Any:
        return refuse_booleans_as_numbers(cls, data)

    @model_validator(mode="before")
    @classmethod
    def _singular_names(cls, data: Any) -> Any:
        """Accept ``model:`` and ``dataset:`` for a single one."""
        if isinstance(data, dict):
            data = dict(data)
            for single, plural in (("model", "models"), ("dataset", "datasets")):
                if single in data:
                    if plural in data:
                        raise ValueError(f"give either {single} or {plural}, not both")
                    value = data.pop(single)
                    data[plural] = value if isinstance(value, list) else [value]
        return data

    @field_validator("base_url")
    @classmethod
    def _base_urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list):
            if not value or not all(value):
                raise ValueError("base_url takes one address or a list of addresses")
            return value[0] if len(value) == 1 else value  # one in a list: as given alone
        return value

    @field_validator("temperatures")
    @classmethod
    def _temperatures(cls, values: list[float]) -> list[float]:
        if not all(math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE for t in values):
            bad = next(t for t in values if not (math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE))
            raise ValueError(f"temperatures must be numbers from 0 (greedy) to "
                             f"{MAX_TEMPERATURE:g}, got {bad}")
        return sorted(set(values))

    @field_validator("base_url")
    @classmethod
    def _urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list):  # several replicas' addresses: each checked
            return [_checked_url(url) or url for url in value]
        return _checked_url(value)

    @field_validator("output", mode="before")
    @classmethod
    def _output_folder(cls, value: Any) -> Any:
        if isinstance(value, (str, Path)):
            check_folder_name(str(value), "output")
        return value

    @field_validator("classifier")
    @classmethod
    def _classifier_file(cls, value: Path | None) -> Path | None:
        """The classifier file is read whole here, before any dataset or model loads: a wrong
        file fails in one line, not after the run has generated everything."""
        if value is not None:
            from userturn.labels.classifier import LinearModel

            try:
                LinearModel.load(value)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
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

    @field_validator("perturbations")
    @classmethod
    def _perturbations(cls, values: list[str]) -> list[str]:
        from userturn.probe.perturb import parse_perturbations

        return [p.spec for p in parse_perturbations(values)]

    @field_validator("user_turn_variants")
    @classmethod
    def _user_turn_variants(cls, values: list[str]) -> list[str]:
        from userturn.probe.user_variants import parse_user_variants

        return [v.spec for v in parse_user_variants(values)]

    def samples_at(self, temperature: float) -> int:
        return 1 if temperature <= 0 else self.samples


Settings = TypeVar("Settings", bound=BaseModel)


def load_experiment(path: Path | None, overrides: Mapping[str, Any]) -> Experiment:
    return load_settings(Experiment, path, overrides)


def load_settings(model: type[Settings], path: Path | None,
                  overrides: Mapping[str, Any]) -> Settings:
    """The config file (if any) with non-None overrides (the flags given) on top, validated
    as ``model``: the one loader of every command's settings. Relative dataset paths in the
    file are the file's: resolved against its folder, not the current one."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _with_file_paths(read_yaml(Path(path)), Path(path).parent)
    for key, value in overrides.items():
        if value is not None:
            data.pop({"models": "model", "datasets": "dataset"}.get(key, ""), None)
            data[key] = value
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        # "Value error, " is pydantic's prefix for a validator's own message: the message reads
        # better alone.
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"invalid config ({where}): {message}") from None


def _with_file_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    for name in ("dataset", "datasets"):
        specs = data.get(name)
        if isinstance(specs, str):
            data[name] = _resolve_spec(specs, folder)
        elif isinstance(specs, list):
            data[name] = [_resolve_spec(s, folder) if isinstance(s, str) else s for s in specs]
    return data


def _resolve_spec(spec: str, folder: Path) -> str:
    named = spec_file(spec)
    if named is None:
        return spec
    before, file = named
    return before + _resolve(file, folder)


def _resolve(path: str, folder: Path) -> str:
    given = Path(path).expanduser()
    return str(given if given.is_absolute() else (folder / given).resolve())


def check_folder_name(path: str, what: str, name_max: int = 255) -> None:
    """A folder to write: not empty (that would be the current folder), and no part of it
    longer than a file system allows (255 bytes on every common one; it fails deep in the
    store)."""
    if not path.strip():
        raise ValueError(f"{what} is empty: give the run folder's name (e.g. runs/demo)")
    for size, part in ((len(os.fsencode(part)), part) for part in Path(path).parts):
        if size > name_max:
            raise ValueError(f"{what}: the name {part[:40]}... is {size} bytes long; a file "
                             f"system takes at most {name_max}")


def check_url(url: str | None, what: str = "--base-url") -> str | None:
    """An http(s) address with a host, or a one-line error (before anything is loaded)."""
    if url is None:
        return None
    example = "give one like http://127.0.0.1:8000/v1"
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:  # urllib's own check: an IPv6 host with one bracket
        raise ConfigError(f"{what} {url!r} is not a valid address (unbalanced brackets "
                          f"around the host): {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} {url!r} is not an http(s) address: {example}")
    if parts.netloc.count("[") != parts.netloc.count("]") or "[" in parts.path + parts.query:
        raise ConfigError(f"{what} {url!r} is not a valid address (unbalanced brackets): "
                          f"{example}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{what} {url!r} has an invalid port") from None
    # Each would fail only after five retries; a password would be stored with the run.
    if port == 0 or any(c.isspace() or ord(c) < 32 for c in parts.netloc):
        raise ConfigError(f"{what} {url!r} has port 0 or a space or a control character in "
                          f"its host: {example}")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{what} has a user name or password in it (user:password@): give "
                          f"the address alone ({example}) and the key in OPENAI_API_KEY")
    return url.strip()


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML whose mappings may not repeat a key: a repeated setting is a mistake, never a
    silent "the last one wins"."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise ConfigError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}")
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a config file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                          f"offset {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of settings, not {type(data).__name__}")
    return data
