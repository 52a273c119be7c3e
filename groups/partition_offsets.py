"""Partition offsets as a group coordinator sees them (:class:`PartitionOffsets`): the
end and start offsets of the partitions it reports lag for, read through a
:class:`TopicView` and cached briefly, and where a reset puts a partition
(:func:`reset_plan`).

Lag of a partition = end offset - committed offset, or end - start when the group has
committed nothing there (everything still kept is unread). Never negative.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable
from typing import Final, Protocol

from foundation.errors import NotFoundError
from foundation.gather import gather_bounded
from groups.assignors import TopicPartition
from groups.wire import ResetPlan, ResetRequest

__all__ = [
    "OFFSET_READS_CONCURRENT",
    "PartitionOffsets",
    "TopicView",
    "reset_plan",
]

# Partitions whose offsets are read at once (each costs a ZooKeeper read and a LAC read).
OFFSET_READS_CONCURRENT: Final = 16


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

        await gather_bounded(tps, one, OFFSET_READS_CONCURRENT)

    async def reset_target(
        self, tp: TopicPartition, to: str, value: int | None
    ) -> tuple[int, bool]:
        """(offset, clamped): where a reset ``to`` earliest | latest | offset | datetime
        puts ``tp``. An offset past the end is clamped to the end (as Kafka does, and
        said so: ``clamped``); one below the first kept offset is raised to it (the
        records before are gone)."""
        if to == "earliest":
            return await self.topics.start_offset(tp), False
        if to == "latest":
            return await self.topics.end_offset(tp), False
        assert value is not None
        if to == "datetime":
            return await self.topics.offset_for_time(tp, value), False
        end = await self.topics.end_offset(tp)
        if value > end:
            return end, True
        return max(value, await self.topics.start_offset(tp)), False


async def reset_plan(
    offsets: PartitionOffsets, topics: Collection[str], req: ResetRequest
) -> ResetPlan:
    """Where ``req`` puts every partition of ``topics`` (NOT_FOUND naming the topics
    that do not exist); nothing is changed. The coordinator applies the plan; a dry run
    of a group that does not exist yet shows it without creating the group."""
    counts = await offsets.topics.partition_counts(topics)
    unknown = [t for t in topics if t not in counts]
    if unknown:
        raise NotFoundError(f"unknown topic(s) {', '.join(unknown)}")
    tps = [(t, p) for t in topics for p in range(counts[t])]
    targets = await gather_bounded(
        tps, lambda tp: offsets.reset_target(tp, req.to, req.value), OFFSET_READS_CONCURRENT
    )
    return ResetPlan(
        offsets={tp: offset for tp, (offset, _c) in zip(tps, targets, strict=True)},
        clamped=frozenset(tp for tp, (_o, c) in zip(tps, targets, strict=True) if c),
        dry_run=req.dry_run,
    )
