"""Command-line flags generated from a settings model's fields, so a setting is named, typed,
documented and defaulted once (in the model) and the CLI, a YAML file and the stored config all
call it the same. A field's flag is ``--field-name`` with a parser chosen from its type; a
``Flag`` entry covers the few that read better renamed, repeated or parsed another way."""

from __future__ import annotations

import argparse
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from userturn.errors import ConfigError
from userturn.settings import Composed, DocumentError, parse_yaml


@dataclass(frozen=True)
class Flag:
    """How one field appears on the command line where ``--field-name`` and its type's parser
    do not fit: other names, one value per use (``repeat``), its own parser, and ``collect``
    to turn the repeated values into the field's value."""

    names: tuple[str, ...] = ()
    repeat: bool = False
    parse: Callable[[str], Any] | None = None
    collect: Callable[[list[Any]], Any] | None = None
    metavar: str | None = None
    required: bool = False
    choices: Callable[[], Sequence[str]] | None = None
    """The values it takes, read from their table when the parser is built."""


def settings_of(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """The settings a model takes, flat: a composed model's are its specs' (``Composed``)."""
    return model.setting_fields() if issubclass(model, Composed) else dict(model.model_fields)


def add_flags(parser: argparse.ArgumentParser, model: type[BaseModel],
              table: Mapping[str, Flag] | None = None) -> None:
    """One flag per field of ``model``; each defaults to None (unset: the file's value, else
    the model's default), so flags override a config file only where given."""
    table = table or {}
    fields = settings_of(model)
    unknown = set(table) - set(fields)
    if unknown:  # a renamed field left behind in the table
        raise TypeError(f"flag table names no field of {model.__name__}: {sorted(unknown)}")
    for name, field in fields.items():
        flag = table.get(name, Flag())
        names = flag.names or ("--" + name.replace("_", "-"),)
        kwargs: dict[str, Any] = {"dest": name, "default": None,
                                  "help": _help(field, flag.repeat)}
        if flag.metavar:
            kwargs["metavar"] = flag.metavar
        if flag.required:
            kwargs["required"] = True
        if flag.parse is None and not flag.repeat:
            kwargs.update(_by_type(model, name, field.annotation))
        if flag.parse is not None:
            kwargs["type"] = flag.parse
        if flag.choices is not None:
            kwargs["choices"] = list(flag.choices())
        if flag.repeat:
            kwargs["action"] = "append"
        if "choices" not in kwargs and kwargs.get("action") is not argparse.BooleanOptionalAction:
            kwargs.setdefault("metavar", names[0].lstrip("-").replace("-", "_").upper())
        parser.add_argument(*names, **kwargs)


def flag_values(args: argparse.Namespace, model: type[BaseModel],
                table: Mapping[str, Flag] | None = None) -> dict[str, Any]:
    """The fields the flags set (None: not given), collected into each field's shape."""
    table = table or {}
    values: dict[str, Any] = {}
    for name in settings_of(model):
        value = getattr(args, name)
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            value = [part for piece in value for part in piece]  # `0,1 2` -> [0, 1, 2]
        collect = table[name].collect if name in table else None
        values[name] = collect(value) if collect is not None and value is not None else value
    return values


def _by_type(model: type[BaseModel], name: str, annotation: Any) -> dict[str, Any]:
    """The argparse options for a field from its type (None left out of a union)."""
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if _is_union(annotation) else [annotation]
    if kinds == [bool]:
        return {"action": argparse.BooleanOptionalAction}
    if len(kinds) == 1 and typing.get_origin(kinds[0]) is Literal:
        return {"choices": typing.get_args(kinds[0])}
    if kinds in ([int], [float], [str], [Path]):
        # A path stays text until the settings validate it: Path("") would be ".", and
        # `-o ''` would then store the run in the current folder instead of being refused.
        return {"type": {float: number, Path: str}.get(kinds[0], kinds[0])}
    if len(kinds) == 1 and typing.get_origin(kinds[0]) is list:
        item = typing.get_args(kinds[0])[0]
        if typing.get_origin(item) is Literal:  # names, checked against the choices by the spec
            return {"type": names, "nargs": "+", "metavar": name.rstrip("s").upper()}
        if item in (float, bool, str):
            # A list is given comma-separated (0,1) or space-separated (0 1), as most CLIs
            # take it; flag_values joins the pieces.
            return {"type": {float: numbers, bool: on_off, str: names}[item], "nargs": "+"}
    raise TypeError(f"{model.__name__}.{name}: no command-line form for {annotation}; give it "
                    "a Flag entry (e.g. repeated KEY=VALUE collected by key_values)")


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _help(field: FieldInfo, repeated: bool) -> str:
    """The field's description and its default (argparse reads %-formats in help: escaped).
    A default of None goes unsaid: the description says what unset means."""
    parts = [field.description or ""]
    if repeated:
        parts.append("repeat the flag for several")
    default = field.get_default(call_default_factory=True)
    if isinstance(default, bool):
        parts.append(f"default: {'on' if default else 'off'}")
    elif default is not None:
        shown = ",".join(str(v) for v in default) if isinstance(default, (list, dict)) else \
            str(default)
        parts.append(f"default: {shown or 'none'}")
    return "; ".join(part for part in parts if part).replace("%", "%%")


def number(text: str) -> float:
    """A number; its range (nan and inf included) is the setting's to check, in one line."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def check_range(flag: str, value: float, *, low: float, high: float = math.inf,
                low_open: bool = False, means: str = "") -> float:
    """``value`` if it is a finite number in [low, high] (``low_open``: above low), else one
    ConfigError line naming the flag: nan, inf and negatives never reach the code that uses
    them (where nan compares false with everything and passes any check written as ``<``)."""
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bounds = (f"above {low:g}" if low_open else f"from {low:g}") + \
            (f" to {high:g}" if math.isfinite(high) else "")
        raise ConfigError(f"{flag} takes a number {bounds}{means}, got {value:g}")
    return value


def numbers(text: str) -> list[float]:
    """A comma list of finite numbers, e.g. ``0,0.7,1``."""
    try:
        return [number(part) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected numbers (0,1 or 0 1), got {text!r}; "
                                         "a CONFIG file goes before the flags") from None


def names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def on_off(text: str) -> list[bool]:
    values = {"on": True, "off": False, "true": True, "false": False}
    try:
        return [values[part.strip().lower()] for part in text.split(",") if part.strip()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected on, off or on,off, got {text!r}") from None


def count_or(word: str) -> Callable[[str], int | str]:
    """A flag parser for a count or ``word`` (``all`` for no limit, ``auto`` for what the device
    holds), as the same key takes in a file (``limit: all``, ``batch_size: auto``)."""

    def parse(text: str) -> int | str:
        if text.strip().lower() == word:
            return word
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number or {word}, got "
                                             f"{text!r}") from None

    parse.__name__ = f"count_or_{word}"  # argparse names the parser in its usage errors
    return parse


def key_values(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` flags to a mapping; each value read as YAML reads it (``4`` a number,
    ``true`` a boolean, ``[0, 1]`` a list), as the same key in a config file would be."""
    mapping: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"bad setting {pair!r}: write KEY=VALUE, e.g. n_ctx=4096")
        try:
            mapping[key.strip()] = parse_yaml(text) if text.strip() else ""
        except DocumentError as error:  # the pair itself may be megabytes: named by its key
            raise ConfigError(f"bad setting {key.strip()!r}: the value cannot be used "
                              f"({error})") from None
        except yaml.YAMLError:
            raise ConfigError(f"bad setting {pair!r}: the value is not valid YAML") from None
    return mapping
