"""Test helpers for the Kafka codec: hypothesis strategies drawn from the message
tables themselves (any field of any table is generated at any version), and the
kafka-python classes used as the byte-for-byte oracle."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import strategies as st

from kafkaapi.protocol.schema import Arr, F, S, in_range

_INTS = {
    "int8": 8,
    "int16": 16,
    "int32": 32,
    "int64": 64,
}


def value_of(kind: str | Arr | S, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    if isinstance(kind, Arr):
        return st.lists(value_of(kind.item, version, flexible), max_size=3)
    if isinstance(kind, S):
        return struct_of(kind, version, flexible)
    if kind in _INTS:
        bits = _INTS[kind]
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    simple: dict[str, st.SearchStrategy[Any]] = {
        "uint16": st.integers(0, 0xFFFF),
        "uint32": st.integers(0, 0xFFFFFFFF),
        "float64": st.floats(allow_nan=False),
        "bool": st.booleans(),
        "string": st.text(max_size=12),
        "bytes": st.binary(max_size=16),
        "records": st.binary(max_size=16),
        "uuid": st.uuids().map(lambda u: uuid.UUID(int=u.int)),
    }
    return simple[kind]


def field_of(f: F, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    value = value_of(f.type, version, flexible)
    if in_range(version, f.nullable):
        return st.none() | value
    return value


def present(f: F, version: int, flexible: bool) -> bool:
    if not in_range(version, f.versions):
        return False
    return f.tag is None or (flexible and in_range(version, f.tagged))


def struct_of(struct: S, version: int, flexible: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            f.name: field_of(f, version, flexible)
            for f in struct.fields
            if present(f, version, flexible)
        }
    )


def kafka_python_classes() -> dict[str, Any]:
    """kafka-python's message classes by schema name (``MetadataRequest``, ...)."""
    import kafka.protocol.admin
    import kafka.protocol.consumer
    import kafka.protocol.metadata
    import kafka.protocol.producer
    from kafka.protocol.api_message import ApiMessage

    del kafka  # imported for their classes' registration only
    found: dict[str, Any] = {}
    pending: list[Any] = [ApiMessage]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if getattr(cls, "_class_version", None) is None and getattr(cls, "_json", None):
            found.setdefault(cls.name, cls)
    return found
