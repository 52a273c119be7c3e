"""The partitions a group consumer holds, each in one state (:class:`HeldPartition`):

* ``ASSIGNING`` -- the coordinator gave it; ``on_assign`` and its start position come at
  the next ``poll``;
* ``ACTIVE`` -- fetched; ``poll`` returns its records;
* ``REVOKING`` -- taken away: its fetch is stopped at once (:func:`stop_soon`; records
  not yet returned are dropped); at the next ``poll`` it is committed and released.

A held partition keeps its source (a core reader or the read proxy route) across
fetches; :func:`stop` ends its fetch and (by default) its source.
"""

from __future__ import annotations

import asyncio
import enum

from groups.fetchers import PartitionFetch, PartitionSource

__all__ = ["HeldPartition", "PartState", "stop", "stop_soon"]


class PartState(enum.Enum):
    ASSIGNING = "assigning"
    ACTIVE = "active"
    REVOKING = "revoking"


class HeldPartition:
    """One held partition."""

    __slots__ = (
        "closing", "fetch", "paused", "position", "revoking_since", "seek_to", "source", "state",
    )  # fmt: skip

    def __init__(self, source: PartitionSource) -> None:
        self.state = PartState.ASSIGNING
        self.source = source
        self.fetch: PartitionFetch | None = None
        # A fetch stopped in the background (revoked): awaited before the next one, so
        # two reads never run on one source.
        self.closing: asyncio.Task[None] | None = None
        self.position: int | None = None  # offset of the next record poll returns
        self.seek_to: int | str | None = None  # a seek waiting for the next poll
        self.paused = False
        self.revoking_since = 0.0


def stop_soon(part: HeldPartition, *, close_source: bool = False) -> None:
    """Stop a partition's fetching now (its buffered records are dropped at once); the
    fetch task (and the source) finish closing in the background (``part.closing``)."""
    fetch, part.fetch = part.fetch, None
    if fetch is not None:
        fetch.batches.clear()
        fetch.buffered = 0
    previous = part.closing

    async def finish() -> None:
        if previous is not None:
            await previous
        if fetch is not None:
            await fetch.close()
        if close_source:
            await part.source.close()

    part.closing = asyncio.get_running_loop().create_task(finish())


async def stop(part: HeldPartition, *, close_source: bool = True) -> None:
    fetch, part.fetch = part.fetch, None
    closing, part.closing = part.closing, None
    if closing is not None:
        await closing
    if fetch is not None:
        await fetch.close()
    if close_source:
        await part.source.close()
