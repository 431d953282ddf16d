"""What every stage's settings share: the checks a typed spec runs on its values (no number given
as a boolean, text that is text, an http(s) address, a folder name a file system takes), and the
one reader of the JSON and YAML documents users hand us (config files, flags, data files,
calibrations, lm-eval's logs), bounded so that no document can recurse, expand or overflow
past the point where it is refused in one line. The lowest floor: the specs of the probe, the
engine and the labelling (``probe.plan``, ``probe.engine``, ``labels.plan``), the experiment that
composes them (``config``) and every reader of a user's file use these, so none imports another
for them."""

from __future__ import annotations

import json
import os
import re
import types
import typing
import urllib.parse
from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

from userturn.errors import ConfigError

# -- documents: JSON and YAML from outside, read with bounds ---------------------------------
# No setting, data row, calibration or lm-eval record is nested anywhere near this deep; the
# bound holds for every reader and whatever walks the value after it, well below Python's own
# recursion limit (a parser that recurses past that limit is refused the same way).
MAX_DEPTH = 64
# Values in one YAML document with every alias expanded: a config holds a few hundred. An alias
# is the same object again, cheap to build, but whatever copies the document later (validation,
# the stored experiment) expands it: ten levels of ten aliases are ten billion values.
MAX_YAML_VALUES = 100_000
TOO_DEEP = "nested too deep to read"
_DIGITS = re.compile(r"limit \((\d+) digits\).*value has (\d+) digits")


class DocumentError(ValueError):
    """A JSON or YAML document that parsed (or began to) but cannot be used as read: nested too
    deep, too large once its aliases are expanded, or a number Python will not convert."""


def parse_json(text: str | bytes) -> Any:
    """The value of a JSON document, bounded (:func:`checked_shape`). ``json.JSONDecodeError``
    for text that is not JSON (its position in it), :class:`DocumentError` for the rest."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:  # the parser recurses per level, past Python's limit here
        raise DocumentError(TOO_DEEP) from None
    except ValueError as error:  # a number of more digits than int() converts
        raise DocumentError(unreadable_value(error)) from None
    return checked_shape(value)


def parse_yaml(text: str, loader: type[yaml.SafeLoader] | None = None) -> Any:
    """The value of a YAML document (safe tags only), bounded like JSON and with its aliases
    expanded at most :data:`MAX_YAML_VALUES` values. ``yaml.YAMLError`` (with its line) for
    text that is not YAML or holds a value that cannot be converted, :class:`DocumentError`
    for a document too deep or too large."""
    try:
        value = yaml.load(text, Loader=loader or DocumentLoader)  # noqa: S506 (safe loaders)
    except RecursionError:  # the composer recurses per level, past Python's limit here
        raise DocumentError(TOO_DEEP) from None
    return checked_shape(value, MAX_YAML_VALUES)


class DocumentLoader(yaml.SafeLoader):
    """YAML's safe loader whose value conversions fail as YAML errors at their line (an integer
    of more digits than ``int()`` converts, a date with a thirteenth month), not as a bare
    ``ValueError`` from inside the constructor."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as error:
            raise yaml.constructor.ConstructorError(
                None, None, unreadable_value(error), node.start_mark) from None


def unreadable_value(error: ValueError | OverflowError) -> str:
    """Why a value did not convert, in the user's terms (not Python's advice to raise its
    limit)."""
    found = _DIGITS.search(str(error))
    if found:
        return f"a number of {found.group(2)} digits (at most {found.group(1)} are read)"
    return f"a value that cannot be read ({error})"


def checked_shape(value: Any, max_values: int | None = None) -> Any:
    """``value`` when no list or mapping in it is nested more than :data:`MAX_DEPTH` deep and,
    with ``max_values``, it holds at most that many values counting a shared one (a YAML
    alias) each time it appears; :class:`DocumentError` otherwise. Level by level, without
    recursion, and it stops at the bound: an alias bomb or an alias inside its own anchor
    costs ``max_values`` steps, not memory. Only plain dicts and lists are walked: the parsers
    make no others, and the exact class test keeps a large data file's walk quick."""
    level = [value] if value.__class__ is dict or value.__class__ is list else []
    depth = seen = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise DocumentError(TOO_DEEP)
        inner: list[Any] = []
        for container in level:
            items = container.values() if container.__class__ is dict else container
            seen += len(items)
            if max_values is not None and seen > max_values:
                raise DocumentError(f"more than {max_values:,} values once its aliases are "
                                    "expanded (anchors repeated inside anchors): write the "
                                    "values out")
            inner.extend([item for item in items
                          if item.__class__ is dict or item.__class__ is list])
        level = inner
    return value


# -- text: what is not a character cannot be stored ---------------------------------------------
# Undecodable bytes survive decoding as lone surrogates (errors="surrogateescape": a command
# line, a data file read so that its error can name the field), and JSON and YAML escapes
# ("\ud800") make them too. SQLite, the tokenizers and every file we write refuse them.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def bad_text_path(value: Any, path: str = "") -> str | None:
    """The key path (``a.b[2]``) of the first string in ``value`` holding bytes that were not
    UTF-8 (or a lone surrogate escape); None when all text is clean. ``""`` means ``value``
    itself."""
    found = bad_text(value, path)
    return found[0] if found is not None else None


def bad_text(value: Any, path: str = "") -> tuple[str, str] | None:
    """The key path and the text of the first string in ``value`` that is not text, or None."""
    if isinstance(value, str):
        return (path, value) if LONE_SURROGATE.search(value) else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and LONE_SURROGATE.search(key):
                return inner, key
            found = bad_text(item, inner)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            found = bad_text(item, f"{path}[{position}]")
            if found is not None:
                return found
    return None


def utf8_reason(text: str) -> str:
    """What is wrong with text that :func:`bad_text` found: a byte that was not UTF-8
    (``surrogateescape``), or a lone surrogate."""
    match = LONE_SURROGATE.search(text)
    code = ord(match.group()) if match else 0
    if match and 0xDC80 <= code <= 0xDCFF:
        return f"invalid UTF-8 (byte 0x{code - 0xDC00:02x} at character {match.start()})"
    return "invalid UTF-8 (a lone surrogate)"


def refuse_text_that_is_not_text(data: Any) -> Any:
    """A setting holding bytes that were not UTF-8 (a flag in another encoding) or a lone
    surrogate (a YAML or JSON escape) is refused by name, before anything is stored: the
    store, the tokenizer and the report could not take it later."""
    found = bad_text(data) if isinstance(data, dict) else None
    if found is not None:
        raise ValueError(f"{found[0]}: {utf8_reason(found[1])}; write it as UTF-8 text")
    return data


def refuse_booleans_as_numbers(fields: Mapping[str, FieldInfo], data: Any) -> Any:
    """``limit: true`` is a mistake, not 1: pydantic reads a boolean as the number 0 or 1, so a
    numeric setting (one of ``fields``) given true or false is refused by name."""
    if isinstance(data, dict):
        for name, value in data.items():
            field = fields.get(name)
            if isinstance(value, bool) and field is not None and \
                    _numeric(field.annotation):
                raise ValueError(f"{name} takes a number, not {str(value).lower()}")
    return data


def _numeric(annotation: Any) -> bool:
    kinds = typing.get_args(annotation) if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else (annotation,)
    return any(kind in (int, float) for kind in kinds)


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


def url_setting(value: str | None) -> str | None:
    """``check_url`` as a settings validator: a bad address is the field's own error."""
    try:
        return check_url(value, "the server address")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


# The validation context of a stored experiment: what was checked when the run started (a file
# on the machine that ran it) is not checked again where it is read.
STORED = {"stored": True}


def reading_stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("stored"))


class Spec(BaseModel):
    """A stage's typed settings: frozen, no unknown key, no boolean read as a number, no text
    that is not text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, data: Any) -> Any:
        return refuse_booleans_as_numbers(cls.model_fields, data)

    @model_validator(mode="before")
    @classmethod
    def _only_text(cls, data: Any) -> Any:
        return refuse_text_that_is_not_text(data)

    @classmethod
    def stored(cls: type[S], config: Mapping[str, Any]) -> S:
        """This spec's part of a stored experiment (a run's ``meta.config``), read with this
        version's types; what other stages own is left out, and ``model_fields_set`` says which
        settings the run stored. A run so old or damaged that it no longer reads is one error,
        not a traceback in a report."""
        return read_stored(cls, cls.model_fields, config)


S = TypeVar("S", bound=Spec)


Read = TypeVar("Read", bound=BaseModel)


def read_stored(model: type[Read], fields: Mapping[str, FieldInfo],
                config: Mapping[str, Any]) -> Read:
    """``model`` read from a stored experiment, with only the settings of ``fields`` (what
    other stages own is left out): the one reader behind every ``stored``."""
    try:
        return model.model_validate({name: value for name, value in config.items()
                                     if name in fields}, context=STORED)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"the run's stored experiment does not read ({where}: {message})"
                          ) from None
    except ConfigError as exc:
        raise ConfigError(f"the run's stored experiment does not read: {exc}") from None


# -- settings made of specs -----------------------------------------------------------------------

class Part:
    """How a spec sits in a :class:`Composed` model (``Annotated[ProbePlan, Part(...)]``):
    ``only`` names the settings of it that are read and written (the others keep the spec's
    defaults), when a command takes some of a stage's settings, not all."""

    def __init__(self, only: tuple[str, ...] | None = None) -> None:
        self.only = only


class Composed(BaseModel):
    """Settings made of stages' specs, each spec a field, read and written flat: the YAML keys,
    the flags and a stored experiment name each setting as its spec does (``limit``, not
    ``plan.limit``), and a bad one is refused under its own name, as a flat model would refuse
    it. Each spec runs its own checks; none is written twice."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def parts(cls) -> dict[str, tuple[type[Spec], tuple[str, ...]]]:
        """Each part's field name, its spec and the settings it takes, in order."""
        found = {}
        for name, field in cls.model_fields.items():
            spec = field.annotation
            if not (isinstance(spec, type) and issubclass(spec, Spec)):
                raise TypeError(f"{cls.__name__}.{name} is not a spec: a composed model holds "
                                "specs only")
            only = next((m.only for m in field.metadata if isinstance(m, Part)), None)
            found[name] = (spec, tuple(only) if only is not None else tuple(spec.model_fields))
        names = [setting for _, settings in found.values() for setting in settings]
        twice = sorted({setting for setting in names if names.count(setting) > 1})
        if twice:  # read flat, a setting must have one owner
            raise TypeError(f"{cls.__name__}: {', '.join(twice)} in more than one part")
        return found

    @classmethod
    def setting_fields(cls) -> dict[str, FieldInfo]:
        """Every setting, flat, in the parts' order and each part's own: what the flags, the
        help and the YAML file list."""
        return {name: spec.model_fields[name]
                for spec, names in cls.parts().values() for name in names}

    @classmethod
    def stored(cls: type[C], config: Mapping[str, Any]) -> C:
        """These settings read back from a stored experiment (see :meth:`Spec.stored`)."""
        return read_stored(cls, cls.setting_fields(), config)

    @classmethod
    def given(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The settings as given, before they are shared out: where a composed model takes
        another spelling of a setting (``model:`` for ``models:``)."""
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _flat(cls, data: Any, handler: Any) -> Any:
        """A flat mapping shared out to the parts; their errors named by the setting alone."""
        if not isinstance(data, dict):
            return handler(data)
        data = cls.given(data)
        fields = cls.setting_fields()
        refuse_booleans_as_numbers(fields, data)
        refuse_text_that_is_not_text(data)
        parts = cls.parts()
        owner = {name: part for part, (_, names) in parts.items() for name in names}
        split: dict[str, dict[str, Any]] = {part: {} for part in parts}
        # A spec given whole (in code: ``Experiment(plan=ProbePlan(...))``) is held as it is;
        # no file or flag can give one, so a key ``plan:`` in a file stays an unknown setting.
        whole = {key: value for key, value in data.items()
                 if key in parts and isinstance(value, parts[key][0])}
        unknown = []
        for key, value in data.items():
            if key in owner and owner[key] in whole:
                raise ValueError(f"{key} is a setting of the {owner[key]} given whole: give "
                                 f"the {owner[key]} or its settings, not both")
            if key in owner:
                split[owner[key]][key] = value
            elif key not in whole:
                unknown.append((key, value))
        errors: list[InitErrorDetails] = []
        try:
            composed = handler({**{part: values for part, values in split.items() if values},
                                **whole})
        except ValidationError as exc:
            errors = [InitErrorDetails(type=PydanticCustomError(e["type"], _literal(e["msg"])),
                                       loc=tuple(e["loc"][1:]), input=e["input"])
                      for e in exc.errors()]
        # After the settings' own errors, as a flat model lists them.
        errors += [InitErrorDetails(type="extra_forbidden", loc=(key,), input=value)
                   for key, value in unknown]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return composed

    def model_copy(self: C, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> C:
        """A copy with settings changed, named flat as everywhere else (``limit``, not
        ``plan.limit``), or a part given whole (``plan=ProbePlan(...)``): each changed part is
        made again through its own checks, so a bad value is refused here, and a name no part
        takes is refused rather than set beside the parts, where nothing would read it."""
        if not update:
            return super().model_copy(deep=deep)
        parts = self.parts()
        owner = {name: part for part, (_, names) in parts.items() for name in names}
        unknown = sorted(key for key in update if key not in owner and key not in parts)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no setting {', '.join(unknown)}")
        changed: dict[str, Any] = {key: value for key, value in update.items() if key in parts}
        for key in update:
            if key in owner and owner[key] in changed:
                raise ValueError(f"{key} is a setting of the {owner[key]} given whole: "
                                     f"give the {owner[key]} or its settings, not both")
        for part in {owner[key] for key in update if key in owner}:
            spec = getattr(self, part)
            kept = {name: getattr(spec, name) for name in spec.model_fields_set}
            given = {key: value for key, value in update.items() if owner.get(key) == part}
            changed[part] = type(spec).model_validate({**kept, **given})
        return super().model_copy(update=changed, deep=deep)

    @model_serializer(mode="wrap")
    def _flat_dump(self, handler: Any) -> dict[str, Any]:
        """Written flat, each setting under its own name (a stored run's ``config``)."""
        dumped = handler(self)
        return {name: dumped[part][name]
                for part, (_, names) in self.parts().items() for name in names}


def _literal(message: str) -> str:
    """A message kept as it was said: braces in it are not a template's."""
    return message.replace("{", "{{").replace("}", "}}")


C = TypeVar("C", bound=Composed)
