"""Partition offsets as a group coordinator sees them (:class:`PartitionOffsets`): the
end and start offsets of the partitions it reports lag for, read through a
:class:`TopicView` and cached briefly, and where a reset puts a partition.

Lag of a partition = end offset - committed offset, or end - start when the group has
committed nothing there (everything still kept is unread). Never negative.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Final, Protocol, TypeVar

from foundation.errors import NotFoundError, OutOfRangeError
from groups.assignors import TopicPartition

__all__ = ["OFFSET_READS_CONCURRENT", "PartitionOffsets", "TopicView", "gather_bounded"]

# Partitions whose offsets are read at once (each costs a ZooKeeper read and a LAC read).
OFFSET_READS_CONCURRENT: Final = 16

R = TypeVar("R")


class TopicView(Protocol):
    """Topic metadata and partition offsets, as the coordinator needs them
    (:class:`groups.coordinator_store.CoreTopics` on the core library)."""

    async def partition_counts(self, topics: Collection[str]) -> dict[str, int]:
        """Partition counts of the topics that exist (the others are left out)."""
        ...

    async def end_offset(self, tp: TopicPartition) -> int: ...

    async def start_offset(self, tp: TopicPartition) -> int: ...

    async def offset_for_time(self, tp: TopicPartition, ms: int) -> int:
        """The first offset whose record's timestamp is >= ``ms`` (the end if none)."""
        ...


@dataclasses.dataclass(slots=True)
class _Cached:
    end: int
    end_at_ms: int
    start: int | None = None
    start_at_ms: int = 0


class PartitionOffsets:
    """Cached end/start offsets; ``clock_ms`` is the coordinator's clock."""

    def __init__(self, topics: TopicView, clock_ms: Callable[[], int]) -> None:
        self.topics = topics
        self._clock = clock_ms
        self._cache: dict[TopicPartition, _Cached] = {}

    def end(self, tp: TopicPartition) -> int:
        """The cached end offset, -1 when none was read."""
        cached = self._cache.get(tp)
        return -1 if cached is None else cached.end

    def start(self, tp: TopicPartition) -> int | None:
        cached = self._cache.get(tp)
        return None if cached is None else cached.start

    def cached_end(self, tp: TopicPartition) -> int | None:
        cached = self._cache.get(tp)
        return None if cached is None else cached.end

    def lag(self, tp: TopicPartition, committed: int | None) -> int | None:
        cached = self._cache.get(tp)
        if cached is None:
            return None
        base = committed if committed is not None else cached.start
        return None if base is None else max(0, cached.end - base)

    async def read(
        self,
        tps: Iterable[TopicPartition],
        max_age_ms: int,
        wants_start: Callable[[TopicPartition], bool] = lambda tp: False,
    ) -> None:
        """Re-read the end offsets older than ``max_age_ms`` (and the start offsets of
        the partitions ``wants_start`` names); partitions whose stream is gone are
        forgotten."""
        now = self._clock()

        async def one(tp: TopicPartition) -> None:
            try:
                cached = self._cache.get(tp)
                if cached is None or now - cached.end_at_ms >= max_age_ms:
                    end = await self.topics.end_offset(tp)
                    cached = self._cache.setdefault(tp, _Cached(end, now))
                    cached.end, cached.end_at_ms = end, now
                if wants_start(tp) and (
                    cached.start is None or now - cached.start_at_ms >= max_age_ms
                ):
                    cached.start, cached.start_at_ms = await self.topics.start_offset(tp), now
            except NotFoundError:
                self._cache.pop(tp, None)

        await gather_bounded(list(tps), one)

    async def reset_target(self, tp: TopicPartition, to: str, value: int | None) -> int:
        """Where a reset ``to`` earliest | latest | offset | datetime puts ``tp``. An
        offset past the end is OUT_OF_RANGE; one below the first kept offset is raised
        to it (the records before are gone)."""
        if to == "earliest":
            return await self.topics.start_offset(tp)
        if to == "latest":
            return await self.topics.end_offset(tp)
        assert value is not None
        if to == "datetime":
            return await self.topics.offset_for_time(tp, value)
        end = await self.topics.end_offset(tp)
        if value > end:
            raise OutOfRangeError(
                f"offset {value} of {tp[0]}/{tp[1]} is beyond the partition's end offset {end}"
            )
        return max(value, await self.topics.start_offset(tp))


async def gather_bounded(
    items: list[TopicPartition], fn: Callable[[TopicPartition], Awaitable[R]]
) -> list[R]:
    """``fn`` over ``items``, at most OFFSET_READS_CONCURRENT at once, in order."""
    limit = asyncio.Semaphore(OFFSET_READS_CONCURRENT)

    async def one(tp: TopicPartition) -> R:
        async with limit:
            return await fn(tp)

    return list(await asyncio.gather(*(one(tp) for tp in items)))
