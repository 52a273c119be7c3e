"""The group coordinator's I/O on the core library: the group's log stream (created on
demand, read back for replay) and :class:`CoreTopics`, the
:class:`~groups.partition_offsets.TopicView` on topic records and partition streams.

A partition's *end offset* is its stream's next sequence id (``Namespace.end_offset``,
as of the LAC), its *start offset* the first sequence id still readable
(``stream_info().first_sequence_id``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import TYPE_CHECKING, Final

from foundation.errors import AlreadyExistsError, NotFoundError
from foundation.names import group_stream, partition_stream
from groups import log as group_log
from groups.assignors import TopicPartition
from groups.state import GroupState

if TYPE_CHECKING:
    from streams.namespace import Namespace

__all__ = ["CoreTopics", "ensure_group_log", "read_group_log"]

# Entries read per request while replaying a group log.
REPLAY_ENTRIES_PER_READ: Final = 64


async def ensure_group_log(ns: Namespace, group: str) -> bool:
    """Create the group's log stream unless it exists; True if this call created it."""
    name = group_stream(group)
    if await ns.exists(name):
        return False
    ctx = ns.context
    try:
        # Namespace.create_stream takes user names only; the group log is internal.
        await ctx.md.streams.create_stream(ns.name, name, None, ctime_ms=ctx.clock_ms())
    except AlreadyExistsError:
        return False
    return True


async def read_group_log(
    ns: Namespace, name: str, state: GroupState, now_ms: int
) -> group_log.Replayed:
    """Replay the log stream ``name`` into ``state``, from its first readable record to
    its end as of now (the caller holds the writer, so the end does not move)."""
    replayed = group_log.Replayed()
    for seg in await ns.segments(name):
        if seg.truncated or seg.last_entry_id < 0:
            continue
        first = seg.min_active_dlsn.entry_id if seg.min_active_dlsn is not None else 0
        for lo in range(first, seg.last_entry_id + 1, REPLAY_ENTRIES_PER_READ):
            hi = min(lo + REPLAY_ENTRIES_PER_READ - 1, seg.last_entry_id)
            records = await ns.read_entries(name, seg.seqno, lo, hi)
            group_log.replay(
                state,
                (group_log.decode(r.payload or b"", f"{name} at {r.dlsn}") for r in records),
                now_ms,
                replayed,
            )
    return replayed


class CoreTopics:
    """:class:`TopicView` on the core library: topic records and partition streams."""

    def __init__(self, ns: Namespace) -> None:
        from groups.topics import TopicAdmin

        self._ns = ns
        self._admin = TopicAdmin(ns)

    async def partition_counts(self, topics: Collection[str]) -> dict[str, int]:
        async def one(topic: str) -> tuple[str, int | None]:
            try:
                return topic, await self._admin.partitions(topic)
            except NotFoundError:
                return topic, None

        pairs = await asyncio.gather(*(one(t) for t in sorted(set(topics))))
        return {t: n for t, n in pairs if n is not None}

    async def end_offset(self, tp: TopicPartition) -> int:
        return await self._ns.end_offset(partition_stream(*tp))

    async def start_offset(self, tp: TopicPartition) -> int:
        return (await self._ns.stream_info(partition_stream(*tp))).first_sequence_id

    async def offset_for_time(self, tp: TopicPartition, ms: int) -> int:
        """The first offset at or after ``ms``; the end offset when there is none (the
        stream read to its end). An outage raises (retriable), never answers the end."""
        end = await self.end_offset(tp)
        record = await self._ns.record_at_time(partition_stream(*tp), ms)
        return end if record is None else record.sequence_id
