"""The group log: the records a coordinator appends to its group's stream ``g~group``
and their replay into a :class:`~groups.state.GroupState` (pure: bytes in, bytes out).

Every record is one stream record whose payload is::

    magic  b"BLG"         3 bytes
    format 1              1 byte   (this layout; another is refused, never guessed)
    crc    CRC32C(body)   4 bytes, big-endian; checked before the body is decoded
    body   msgpack map    {"k": kind, ...}

Kinds (offsets as ``{topic: [[partition, offset], ...]}``, compact for many partitions):

* ``snapshot`` ``{"state": GroupState.snapshot()}`` -- membership, generation, assignor,
  partition counts and the target assignment; written on every change of those.
* ``commit``   ``{"gen": G, "member": id, "offsets": ...}`` -- a member's commit
  (checked by the coordinator before it was written; replay applies it as is).
* ``reset``    ``{"offsets": ...}`` -- an operator's reset.
* ``deleted``  ``{}`` -- the group was deleted: members and offsets are gone (the
  generation is kept, so a member of the old group can never pass for a current one).
* ``full``     ``{"state": ..., "offsets": ...}`` -- everything: written every
  ``compact_records`` records, after which everything before it is truncated, so
  replay starts at (or just before) the last ``full``.

Replay applies records in log order; each kind's effect replaces or updates what the
earlier ones left, so replaying a prefix that a ``full`` supersedes is harmless.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Mapping
from typing import Any, Final

import crc32c
import msgpack

from foundation.errors import ChecksumError, InvariantViolation, ProtocolVersionError
from foundation.invariants import invariant
from groups.assignors import TopicPartition
from groups.state import GroupState

__all__ = [
    "Commit",
    "Deleted",
    "Full",
    "GroupRecord",
    "Replayed",
    "Reset",
    "Snapshot",
    "decode",
    "encode",
    "replay",
]

MAGIC: Final = b"BLG"
FORMAT: Final = 1
_HEADER: Final = struct.Struct(">3sBI")


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    state: Mapping[str, Any]  # GroupState.snapshot()


@dataclasses.dataclass(frozen=True, slots=True)
class Commit:
    generation: int
    member_id: str
    offsets: Mapping[TopicPartition, int]


@dataclasses.dataclass(frozen=True, slots=True)
class Reset:
    offsets: Mapping[TopicPartition, int]


@dataclasses.dataclass(frozen=True, slots=True)
class Deleted:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Full:
    state: Mapping[str, Any]
    offsets: Mapping[TopicPartition, int]


GroupRecord = Snapshot | Commit | Reset | Deleted | Full


# -- encoding ---------------------------------------------------------------------------


def encode(record: GroupRecord) -> bytes:
    body: bytes = msgpack.packb(_to_map(record), use_bin_type=True)
    return _HEADER.pack(MAGIC, FORMAT, crc32c.crc32c(body)) + body


def _to_map(record: GroupRecord) -> dict[str, Any]:
    match record:
        case Snapshot(state):
            return {"k": "snapshot", "state": dict(state)}
        case Commit(generation, member_id, offsets):
            return {
                "k": "commit",
                "gen": generation,
                "member": member_id,
                "offsets": _offsets_out(offsets),
            }
        case Reset(offsets):
            return {"k": "reset", "offsets": _offsets_out(offsets)}
        case Deleted():
            return {"k": "deleted"}
        case Full(state, offsets):
            return {"k": "full", "state": dict(state), "offsets": _offsets_out(offsets)}
    raise InvariantViolation(f"not a group record: {record!r}")


def _offsets_out(offsets: Mapping[TopicPartition, int]) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {}
    for (topic, p), offset in sorted(offsets.items()):
        out.setdefault(topic, []).append([p, offset])
    return out


# -- decoding ---------------------------------------------------------------------------


def decode(payload: bytes, where: str = "group log") -> GroupRecord:
    """The record in ``payload``; ChecksumError if it is damaged or not a group record,
    ProtocolVersionError for a format or kind this version does not know."""
    if len(payload) < _HEADER.size:
        raise ChecksumError(f"{where}: record of {len(payload)} bytes is too short")
    magic, fmt, crc = _HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise ChecksumError(f"{where}: not a group log record (magic {magic!r})")
    if fmt != FORMAT:
        raise ProtocolVersionError(f"{where}: group log format {fmt}; this version reads {FORMAT}")
    body = payload[_HEADER.size :]
    if crc32c.crc32c(body) != crc:
        raise ChecksumError(f"{where}: group log record checksum mismatch")
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # TypeError: a map key
        raise ChecksumError(f"{where}: undecodable group log record: {exc}") from exc
    try:
        return _from_map(obj)
    except (KeyError, TypeError, ValueError) as exc:
        raise ChecksumError(f"{where}: malformed group log record: {exc!r}") from exc


def _from_map(obj: Any) -> GroupRecord:
    if not isinstance(obj, dict):
        raise TypeError("the body is not a map")
    kind = obj["k"]
    if kind == "snapshot":
        return Snapshot(_state_in(obj["state"]))
    if kind == "commit":
        return Commit(_int(obj["gen"]), _str(obj["member"]), _offsets_in(obj["offsets"]))
    if kind == "reset":
        return Reset(_offsets_in(obj["offsets"]))
    if kind == "deleted":
        return Deleted()
    if kind == "full":
        return Full(_state_in(obj["state"]), _offsets_in(obj["offsets"]))
    raise ProtocolVersionError(f"unknown group log record kind {kind!r}")


def _state_in(raw: Any) -> dict[str, Any]:
    """A snapshot checked and in GroupState.snapshot()'s own shape (restore trusts it)."""
    if not isinstance(raw, dict):
        raise TypeError("state is not a map")
    assignor = raw.get("assignor")
    return {
        "generation": _int(raw["generation"]),
        "assignor": None if assignor is None else _str(assignor),
        "partitions": {_str(t): _int(n) for t, n in raw.get("partitions", {}).items()},
        "members": [
            {
                "id": _str(m["id"]),
                "instance": None if m.get("instance") is None else _str(m["instance"]),
                "topics": [_str(t) for t in m["topics"]],
                "session_ms": _int(m["session_ms"]),
                "assigned": [(_str(t), _int(p)) for t, p in m["assigned"]],
            }
            for m in raw["members"]
        ],
    }


def _offsets_in(raw: Any) -> dict[TopicPartition, int]:
    if not isinstance(raw, dict):
        raise TypeError("offsets are not a map")
    out: dict[TopicPartition, int] = {}
    for topic, pairs in raw.items():
        for p, offset in pairs:
            out[(_str(topic), _int(p))] = _int(offset)
    return out


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"expected a non-negative int, got {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


# -- replay -----------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Replayed:
    """What replay found besides the state."""

    records: int = 0
    since_full: int = 0  # records after the last ``full`` (all of them if none)
    deleted: bool = False  # the last lifecycle record was ``deleted``


def replay(
    state: GroupState,
    records: Iterable[GroupRecord],
    now_ms: int,
    into: Replayed | None = None,
) -> Replayed:
    """Apply ``records`` (log order) to ``state``; members get fresh sessions from
    ``now_ms`` (deadlines are not logged). ``into`` continues an earlier call's counts
    (replay in chunks)."""
    out = into if into is not None else Replayed()
    for record in records:
        out.records += 1
        out.since_full += 1
        if not isinstance(record, Deleted | Commit):
            out.deleted = False
        match record:
            case Snapshot(snap):
                state.restore(snap, now_ms)
            case Commit(_gen, _member, offsets):
                state.apply_commit(offsets)
            case Reset(offsets):
                state.offsets.update(offsets)
            case Deleted():
                _clear(state)
                out.deleted = True
            case Full(snap, offsets):
                state.restore(snap, now_ms)
                state.offsets = dict(offsets)
                out.since_full = 0
    return out


def _clear(state: GroupState) -> None:
    generation = state.generation
    state.restore({"generation": generation, "assignor": None, "members": []}, 0)
    state.offsets = {}
    invariant(state.generation == generation, "generation changed on delete")
