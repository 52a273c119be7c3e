"""Typed, frozen, validated configuration, loaded from TOML + environment + flags.

Every service declares its settings as a ``@dataclass(frozen=True, slots=True)`` with a
comment per field and cross-field checks in ``__post_init__`` that raise
:class:`~foundation.errors.ConfigError`. :func:`load_config` is the one place settings
are read, in increasing precedence:

1. the dataclass defaults;
2. a TOML file (optionally one ``[section]`` of it);
3. environment variables ``<PREFIX><FIELD>`` upper-cased (``BOOKLINE_BOOKIE_PORT``);
4. explicit overrides (command-line flags), ``None`` meaning "not given".

Values from strings (environment) are converted by the field's annotated type; unknown
keys are errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from foundation.errors import ConfigError

T = TypeVar("T")

__all__ = ["ConfigError", "MetadataConfig", "check_bounds", "config_to_dict", "load_config"]


def _convert(name: str, value: object, annotation: Any) -> object:
    """Convert ``value`` to the annotated type; strings come from the environment."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "null")):
            return None
        return _convert(name, value, args[0])
    if origin is tuple:
        (item_type, *_rest) = typing.get_args(annotation)
        if isinstance(value, str):
            items: list[object] = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, list | tuple):
            items = list(value)
        else:
            raise ConfigError(f"setting {name!r}: expected a list, got {value!r}")
        return tuple(_convert(name, v, item_type) for v in items)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"setting {name!r}: expected a boolean, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise ConfigError(f"setting {name!r}: expected an integer, got {value!r}")
        try:
            return int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"setting {name!r}: expected an integer, got {value!r}") from exc
    if annotation is float:
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"setting {name!r}: expected a number, got {value!r}") from exc
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"setting {name!r}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"setting {name!r}: unsupported type {annotation!r}")


def check_setting(name: str, text: str, annotation: Any) -> None:
    """ConfigError unless ``text`` (a flag's value) converts to ``annotation``."""
    _convert(name, text, annotation)


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_config(
    cls: type[T],
    *,
    path: str | Path | None = None,
    section: str | None = None,
    env_prefix: str | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """Build ``cls`` from defaults < TOML file < environment < overrides."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, object] = {}

    if path is not None:
        try:
            with open(path, "rb") as fh:
                data: dict[str, Any] = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        if section is not None:
            data = data.get(section, {})
            if not isinstance(data, dict):
                raise ConfigError(f"config file {path}: [{section}] must be a table")
        for key, value in data.items():
            if isinstance(value, dict):
                continue  # other sections of a shared file
            if key not in fields:
                raise ConfigError(
                    f"config file {path}: unknown setting {key!r} in "
                    f"[{section or cls.__name__}]{_did_you_mean(key, fields)}"
                )
            values[key] = _convert(f"{section}.{key}" if section else key, value, hints[key])

    env = os.environ if environ is None else environ
    if env_prefix:
        for key in fields:
            raw = env.get(f"{env_prefix}{key}".upper())
            if raw is not None:
                values[key] = _convert(key, raw, hints[key])

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in fields:
            raise ConfigError(
                f"unknown setting {key!r} for {cls.__name__}{_did_you_mean(key, fields)}"
            )
        values[key] = _convert(key, value, hints[key])

    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from exc


def check_bounds(
    section: str,
    config: object,
    *,
    positive: Iterable[str] = (),
    non_negative: Iterable[str] = (),
) -> None:
    """The one check of settings' signs: a ConfigError naming ``section.field`` for the
    first field of ``positive`` that is not above 0, or of ``non_negative`` below 0.
    (Cross-field rules and ranges stay with each config: they say more than a sign.)"""
    for name in positive:
        if getattr(config, name) <= 0:
            raise ConfigError(f"{section}.{name} must be positive")
    for name in non_negative:
        if getattr(config, name) < 0:
            raise ConfigError(f"{section}.{name} must be >= 0")


def config_to_dict(config: object) -> dict[str, object]:
    """Plain dict of a config dataclass (for logging and `cluster.json`)."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"{config!r} is not a dataclass instance")
    return dataclasses.asdict(config)


@dataclasses.dataclass(frozen=True, slots=True)
class MetadataConfig:
    """Where the cluster's metadata lives. Shared by every service and client."""

    # ZooKeeper connect string, e.g. "127.0.0.1:2181" (a chroot suffix is allowed).
    zk: str = "127.0.0.1:2181"
    # Root znode of this cluster; several clusters can share one ZooKeeper.
    root: str = "/bookline"
    # ZooKeeper session timeout: how long a dead process keeps its ephemeral nodes.
    session_timeout_ms: int = 10_000
    # How long to wait for the first connection before giving up.
    connect_timeout_ms: int = 15_000
    # ZooKeeper digest credentials: a file (mode 0600) holding "user:password". With it
    # the session authenticates and every znode it creates gets a digest ACL giving that
    # user everything and nobody else anything (every process of the cluster must use
    # the same user). "" = the file BOOKLINE_METADATA_DIGEST_FILE names, else none.
    digest_file: str = ""
    # Talk to ZooKeeper over TLS (zk names the servers' secureClientPort), with the
    # process's [tls] certificates; none follows [tls] enabled.
    tls: bool | None = None

    def __post_init__(self) -> None:
        if not self.zk:
            raise ConfigError("metadata.zk must name at least one ZooKeeper server")
        if not self.root.startswith("/") or (self.root.endswith("/") and self.root != "/"):
            raise ConfigError(f"metadata.root must be an absolute znode path, got {self.root!r}")
        if not 1_000 <= self.session_timeout_ms <= 120_000:
            raise ConfigError("metadata.session_timeout_ms must be within 1000..120000")
        check_bounds("metadata", self, positive=("connect_timeout_ms",))
