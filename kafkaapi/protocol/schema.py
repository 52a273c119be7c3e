"""The vocabulary of the message tables: a field has a name, a type, the versions it is
in, the versions it may be null in, and (in flexible versions) maybe a tag.

The tables (``apis_*.py``) transcribe Kafka's message schemas (its ``message/*.json``):
field names in snake_case, version ranges written as Kafka writes them (``"3+"``,
``"1-4"``, ``"none"``). Types: ``int8 int16 uint16 int32 uint32 int64 float64 bool
string bytes records uuid``, ``Arr(type)`` and ``S(*fields)`` (a struct).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NULL", "PRIMITIVES", "VERSION_MAX", "Api", "Arr", "F", "S", "in_range", "parse_range"]

# Kafka versions are int16; "3+" means 3 up to any later version.
VERSION_MAX = 32767

PRIMITIVES = frozenset(
    {"int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "bool", "string"}
    | {"bytes", "records", "uuid"}
)


class _Null:
    """A field's default of null (``default=NULL``), told apart from "no default"."""

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


@functools.cache  # a handful of distinct strings, asked on every request's header
def parse_range(text: str) -> tuple[int, int] | None:
    """``"3+"`` -> (3, VERSION_MAX), ``"1-4"`` -> (1, 4), ``"2"`` -> (2, 2), ``"none"``
    -> None."""
    if text == "none":
        return None
    if text.endswith("+"):
        return int(text[:-1]), VERSION_MAX
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def in_range(version: int, text: str | None) -> bool:
    if text is None:
        return False
    bounds = parse_range(text)
    return bounds is not None and bounds[0] <= version <= bounds[1]


@dataclass(frozen=True, slots=True)
class S:
    """A struct: an ordered tuple of fields."""

    fields: tuple[F, ...]

    def __init__(self, *fields: F) -> None:
        object.__setattr__(self, "fields", fields)


@dataclass(frozen=True, slots=True)
class Arr:
    """An array of a primitive type (by name) or of structs."""

    item: str | S


@dataclass(frozen=True, slots=True)
class F:
    """One field. ``default`` is the value an encoder writes when the message leaves the
    field out, and the value a decoder gives for a field the version does not carry."""

    name: str
    type: str | Arr | S
    versions: str
    nullable: str | None = None
    tag: int | None = None
    tagged: str | None = None
    default: Any = field(default=None)


@dataclass(frozen=True, slots=True)
class Api:
    """One row of the API table: a key, the version range Bookline speaks, the first
    flexible version, and the request and response schemas."""

    name: str
    key: int
    versions: tuple[int, int]  # every version the tables (Kafka's schemas) define
    advertised: tuple[int, int]  # what ApiVersions offers: none Kafka marks deprecated
    flexible: str
    request: S
    response: S
