"""What every stage's settings share: the checks a typed spec runs on its values (no number given
as a boolean, an http(s) address, a folder name a file system takes). The lowest floor: the specs
of the probe, the engine and the labelling (``probe.plan``, ``probe.engine``, ``labels.plan``) and
the experiment that composes them (``config``) all use these, so none imports another for them."""

from __future__ import annotations

import os
import types
import typing
import urllib.parse
from pathlib import Path
from typing import Any, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, model_validator

from userturn.errors import ConfigError


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
    """A stage's typed settings: frozen, no unknown key, no boolean read as a number."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, data: Any) -> Any:
        return refuse_booleans_as_numbers(cls, data)

    @classmethod
    def stored(cls: type[S], config: Mapping[str, Any]) -> S:
        """This spec's part of a stored experiment (a run's ``meta.config``), read with this
        version's types; what other stages own is left out, and ``model_fields_set`` says which
        settings the run stored. A run so old or damaged that it no longer reads is one error,
        not a traceback in a report."""
        try:
            return cls.model_validate({name: value for name, value in config.items()
                                       if name in cls.model_fields}, context=STORED)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "settings"
            message = first["msg"].removeprefix("Value error, ")
            raise ConfigError(f"the run's stored experiment does not read ({where}: {message})"
                              ) from None
        except ConfigError as exc:
            raise ConfigError(f"the run's stored experiment does not read: {exc}") from None


S = TypeVar("S", bound=Spec)
