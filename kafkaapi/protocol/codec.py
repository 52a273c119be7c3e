"""Encode and decode a struct of a message table at one version (no I/O).

For each (struct, version) the field list is compiled once into a plan: the regular
fields in order with an encoder and a decoder each, the tagged fields (flexible versions
only) by tag, and the defaults of fields the version does not carry. Values are plain
dicts keyed by the tables' snake_case names; a field left out of a dict is written as
its default.

Flexible versions use compact strings, bytes and arrays and end every struct with a
tagged-field section: unsigned varint count, then per field unsigned varint tag,
unsigned varint size and the value (tags ascending; unknown tags are skipped).
A nullable struct field is preceded by an int8: -1 null, 1 present.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafkaapi.protocol import primitives as p
from kafkaapi.protocol.primitives import Reader, corrupt
from kafkaapi.protocol.schema import NULL, Arr, F, S, in_range

__all__ = ["Plan", "decode_struct", "encode_struct", "plan_of"]

Encoder = Callable[[Any, bytearray], None]
Decoder = Callable[[Reader], Any]
Default = Callable[[], Any]

_ZERO_UUID = uuid.UUID(int=0)
_FIXED: dict[str, tuple[Callable[[Any], bytes], Callable[[Reader], Any], Any]] = {
    "int8": (p.pack_int8, Reader.int8, 0),
    "int16": (p.pack_int16, Reader.int16, 0),
    "uint16": (p.pack_uint16, Reader.uint16, 0),
    "int32": (p.pack_int32, Reader.int32, 0),
    "uint32": (p.pack_uint32, Reader.uint32, 0),
    "int64": (p.pack_int64, Reader.int64, 0),
    "float64": (p.pack_float64, Reader.float64, 0.0),
    "bool": (lambda v: b"\x01" if v else b"\x00", Reader.boolean, False),
    "uuid": (lambda v: v.bytes, Reader.uuid, _ZERO_UUID),
}


@dataclass(frozen=True, slots=True)
class Plan:
    """A struct compiled for one version."""

    regular: tuple[tuple[str, Encoder, Decoder, Default], ...]
    tagged: tuple[tuple[int, str, Encoder, Decoder, Default], ...]
    absent: tuple[tuple[str, Default], ...]
    flexible: bool
    names: frozenset[str]  # every field of the struct, at any version


_PLANS: dict[tuple[int, int, bool], Plan] = {}


def plan_of(struct: S, version: int, flexible: bool) -> Plan:
    """The compiled plan (cached by the struct's identity: tables are module constants)."""
    key = (id(struct), version, flexible)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _compile(struct, version, flexible)
        _PLANS[key] = plan
    return plan


def _compile(struct: S, version: int, flexible: bool) -> Plan:
    regular: list[tuple[str, Encoder, Decoder, Default]] = []
    tagged: list[tuple[int, str, Encoder, Decoder, Default]] = []
    absent: list[tuple[str, Default]] = []
    for f in struct.fields:
        default = _default_of(f, version, flexible)
        if not in_range(version, f.versions):
            absent.append((f.name, default))
            continue
        nullable = in_range(version, f.nullable)
        enc, dec = _codec_of(f.type, version, flexible, nullable, f.name)
        if f.tag is not None:
            if flexible and in_range(version, f.tagged):
                tagged.append((f.tag, f.name, enc, dec, default))
            else:
                absent.append((f.name, default))
        else:
            regular.append((f.name, enc, dec, default))
    tagged.sort(key=lambda row: row[0])
    names = frozenset(f.name for f in struct.fields)
    return Plan(tuple(regular), tuple(tagged), tuple(absent), flexible, names)


def _default_of(f: F, version: int, flexible: bool) -> Default:
    if f.default is NULL:
        return lambda: None
    if f.default is not None:
        value = f.default
        return lambda: value
    kind = f.type
    if isinstance(kind, Arr):
        return list
    if isinstance(kind, S):
        plan_struct = kind
        return lambda: _defaults(plan_of(plan_struct, version, flexible))
    if kind in _FIXED:
        fixed = _FIXED[kind][2]
        return lambda: fixed
    return {"string": lambda: "", "bytes": lambda: b"", "records": lambda: None}[kind]


def _defaults(plan: Plan) -> dict[str, Any]:
    out = {name: d() for name, _, _, d in plan.regular}
    out.update({name: d() for _, name, _, _, d in plan.tagged})
    out.update({name: d() for name, d in plan.absent})
    return out


def _codec_of(
    kind: str | Arr | S, version: int, flexible: bool, nullable: bool, name: str
) -> tuple[Encoder, Decoder]:
    if isinstance(kind, Arr):
        return _array_codec(kind, version, flexible, nullable, name)
    if isinstance(kind, S):
        return _struct_codec(kind, version, flexible, nullable, name)
    if kind in _FIXED:
        pack, read, _ = _FIXED[kind]
        return (lambda v, out: out.extend(pack(v))), read
    return _sized_codec(kind, flexible, nullable, name)


def _null_refused(name: str) -> ValueError:
    return ValueError(f"field {name!r} is not nullable in this version")


def _sized_codec(kind: str, flexible: bool, nullable: bool, name: str) -> tuple[Encoder, Decoder]:
    is_text = kind == "string"

    def encode(value: Any, out: bytearray) -> None:
        if value is None:
            if not nullable:
                raise _null_refused(name)
            out.extend(b"\x00" if flexible else p.pack_int16(-1) if is_text else p.pack_int32(-1))
            return
        raw = value.encode() if is_text else bytes(value)
        if flexible:
            out.extend(p.uvarint(len(raw) + 1))
        elif is_text:
            out.extend(p.pack_int16(len(raw)))
        else:
            out.extend(p.pack_int32(len(raw)))
        out.extend(raw)

    def decode(reader: Reader) -> Any:
        if flexible:
            length = reader.compact_length()
        elif is_text:
            length = reader.classic_string_length()
        else:
            length = reader.classic_bytes_length()
        if length == -1:
            if not nullable:
                raise corrupt(f"null in non-nullable field {name!r}")
            return None
        return reader.text(length) if is_text else bytes(reader.take(length))

    return encode, decode


def _array_codec(
    kind: Arr, version: int, flexible: bool, nullable: bool, name: str
) -> tuple[Encoder, Decoder]:
    item_enc, item_dec = _codec_of(kind.item, version, flexible, False, name)

    def encode(value: Any, out: bytearray) -> None:
        if value is None:
            if not nullable:
                raise _null_refused(name)
            out.extend(b"\x00" if flexible else p.pack_int32(-1))
            return
        out.extend(p.uvarint(len(value) + 1) if flexible else p.pack_int32(len(value)))
        for item in value:
            item_enc(item, out)

    def decode(reader: Reader) -> Any:
        count = reader.array_count(flexible)
        if count == -1:
            if not nullable:
                raise corrupt(f"null array in non-nullable field {name!r}")
            return None
        return [item_dec(reader) for _ in range(count)]

    return encode, decode


def _struct_codec(
    kind: S, version: int, flexible: bool, nullable: bool, name: str
) -> tuple[Encoder, Decoder]:
    def encode(value: Any, out: bytearray) -> None:
        if nullable:
            out.extend(b"\xff" if value is None else b"\x01")
            if value is None:
                return
        elif value is None:
            raise _null_refused(name)
        encode_struct(plan_of(kind, version, flexible), value, out)

    def decode(reader: Reader) -> Any:
        if nullable and reader.int8() < 0:
            return None
        return decode_struct(plan_of(kind, version, flexible), reader)

    return encode, decode


def encode_struct(plan: Plan, value: Mapping[str, Any], out: bytearray) -> None:
    """Raises ValueError for a key the struct does not have (a misspelt field would
    otherwise be written as its default without a word)."""
    if not plan.names.issuperset(value):
        unknown = sorted(set(value) - plan.names)
        raise ValueError(f"no such field(s) {unknown}; the struct has {sorted(plan.names)}")
    for name, enc, _, default in plan.regular:
        enc(value[name] if name in value else default(), out)
    if plan.flexible:
        encode_tagged(plan, value, out)


def encode_tagged(plan: Plan, value: Mapping[str, Any], out: bytearray) -> None:
    """The tagged section: only fields whose value differs from their default."""
    present: list[tuple[int, bytes]] = []
    for tag, name, enc, _, default in plan.tagged:
        if name in value and value[name] != default():
            encoded = bytearray()
            enc(value[name], encoded)
            present.append((tag, bytes(encoded)))
    out.extend(p.uvarint(len(present)))
    for tag, body in present:
        out.extend(p.uvarint(tag))
        out.extend(p.uvarint(len(body)))
        out.extend(body)


def decode_struct(plan: Plan, reader: Reader) -> dict[str, Any]:
    out: dict[str, Any] = {name: dec(reader) for name, _, dec, _ in plan.regular}
    for name, default in plan.absent:
        out[name] = default()
    if plan.flexible:
        _decode_tagged(plan, reader, out)
    return out


def _decode_tagged(plan: Plan, reader: Reader, out: dict[str, Any]) -> None:
    known = {tag: (name, dec) for tag, name, _, dec, _ in plan.tagged}
    for _, name, _, _, default in plan.tagged:
        out[name] = default()
    count = reader.uvarint()
    if count > reader.remaining():
        raise corrupt(f"{count} tagged fields in {reader.remaining()} bytes")
    for _ in range(count):
        tag = reader.uvarint()
        body = reader.take(reader.uvarint())
        if tag in known:
            name, dec = known[tag]
            sub = Reader(body)
            out[name] = dec(sub)
            if sub.remaining():
                raise corrupt(f"tagged field {name!r}: {sub.remaining()} bytes left over")
