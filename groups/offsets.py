"""Offsets of a topic partition looked up in its stream: whether an offset can be read
(:func:`check_offset`) and which offset ``earliest``, ``latest`` or ``time:MS`` names
(:func:`offset_at`). Core-library only (no HTTP, no thin client), so the serving
floor's read core and the consumer's fetchers share it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from foundation.errors import BadRequestError, NotFoundError, OutOfRangeError
from foundation.names import partition_stream
from streams.dlsn import PositionKind, StartPosition

if TYPE_CHECKING:
    from streams.namespace import Namespace

__all__ = ["check_offset", "offset_at", "parse_at"]


_LOOKUP_KINDS: Final = (PositionKind.EARLIEST, PositionKind.LATEST, PositionKind.TIMESTAMP)


def parse_at(at: str) -> StartPosition:
    """``earliest`` | ``latest`` | ``time:MS``, as the start position it names."""
    try:
        start = StartPosition.parse(at) if at else None
    except BadRequestError as exc:
        raise BadRequestError(
            f"offset lookup {at!r}: expected earliest, latest or time:MS"
        ) from exc
    if start is None or start.kind not in _LOOKUP_KINDS:
        raise BadRequestError(f"offset lookup {at!r}: expected earliest, latest or time:MS")
    return start


async def check_offset(ns: Namespace, topic: str, partition: int, offset: int) -> None:
    """NotFoundError for a missing partition; OutOfRangeError for an offset past the
    end offset or before the first offset still kept."""
    name = partition_stream(topic, partition)
    if not await ns.exists(name):
        raise NotFoundError(f"topic {topic} has no partition {partition} (or does not exist)")
    info = await ns.stream_info(name)
    if offset > info.next_sequence_id:
        raise OutOfRangeError(
            f"offset {offset} of {topic}/{partition} is past its end offset {info.next_sequence_id}"
        )
    if offset < info.first_sequence_id:
        raise OutOfRangeError(
            f"offset {offset} of {topic}/{partition} was truncated; the first offset "
            f"kept is {info.first_sequence_id}"
        )


async def offset_at(ns: Namespace, topic: str, partition: int, at: str) -> int:
    """The partition's first offset still kept (``earliest``), its end offset
    (``latest``: the offset the next record gets), or the offset of its first record
    written at or after ``time:MS`` (the end offset when there is none yet). Raises
    the bookies' error (retriable) rather than answer the end offset for records not
    read."""
    start = parse_at(at)
    name = partition_stream(topic, partition)
    if not await ns.exists(name):
        raise NotFoundError(f"topic {topic} has no partition {partition} (or does not exist)")
    if start.kind is PositionKind.LATEST:
        return await ns.end_offset(name)
    if start.kind is PositionKind.EARLIEST:
        return int((await ns.stream_info(name)).first_sequence_id)
    end = await ns.end_offset(name)
    # Found, or none: the stream read to its end (an outage or a slow read raises).
    record = await ns.record_at_time(name, start.value)
    return end if record is None else record.sequence_id
