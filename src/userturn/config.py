"""The experiment: the probe's plan, the engine and the labelling plan composed under the YAML
keys and CLI flags users know, from a YAML file with flags on top (the flags are generated from
the fields, so each setting is defined once, in the spec of the stage that owns it).

Each stage is given its own spec, not the whole experiment: ``Experiment.plan`` for the probe,
``.engine`` for how the models run, ``.labelling`` for the labelling stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError

from userturn.data import spec_file
from userturn.errors import ConfigError
from userturn.labels.plan import JudgeSpec, LabellingPlan
from userturn.probe.engine import EngineSpec
from userturn.probe.plan import ProbePlan
from userturn.settings import Composed, DocumentError, DocumentLoader, parse_yaml


class Experiment(Composed):
    """Models x datasets x temperatures x samples, how they run and how their user turns are
    labelled. Greedy (temperature 0) gets one sample.

    Made of the three stages' specs, read and written flat (``limit``, ``batch_size``,
    ``judge``: each setting under its own name, in the YAML file, the flags and a stored run).
    Their order is the order of the help: what to probe before how to run and label it."""

    plan: ProbePlan = Field(default_factory=ProbePlan)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    labelling: LabellingPlan = Field(default_factory=LabellingPlan)

    @classmethod
    def given(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Accept ``model:`` and ``dataset:`` for a single one."""
        data = dict(data)
        for single, plural in (("model", "models"), ("dataset", "datasets")):
            if single in data:
                if plural in data:
                    raise ValueError(f"give either {single} or {plural}, not both")
                value = data.pop(single)
                data[plural] = value if isinstance(value, list) else [value]
        return data

    def lost_settings(self) -> list[str]:
        """Of an experiment read back from a run: what its plan no longer names
        (``ProbePlan.lost_settings``)."""
        return self.plan.lost_settings()

    @property
    def judge_spec(self) -> JudgeSpec:
        """The judges' settings alone: what `userturn judge` takes."""
        return JudgeSpec.model_construct(
            self.labelling.model_fields_set & set(JudgeSpec.model_fields),
            **{name: getattr(self.labelling, name) for name in JudgeSpec.model_fields})


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


class _UniqueKeyLoader(DocumentLoader):
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
        data = parse_yaml(text, _UniqueKeyLoader)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except DocumentError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML{yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of settings, not {type(data).__name__}")
    return data


def yaml_problem(error: yaml.YAMLError) -> str:
    """`` at line N`` where the parser knows it, and what is wrong where it is a value that did
    not convert (the parser's own words about syntax are left out: the line says where)."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark else ""
    if isinstance(error, yaml.constructor.ConstructorError) and error.problem:
        return f"{where}: {error.problem}"
    return where
