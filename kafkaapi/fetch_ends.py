"""Each fetched partition's end and start offsets, as a fetch answers them (its high
watermark and log start offset) without waiting for a look-up (:class:`PartitionEnds`).

A look-up is a stream's ``stream_info``: its segments from ZooKeeper, the open
segment's LAC from the bookies -- waiting up to the read timeout for the LAC to cover
the last entry the bookies hold -- and that entry read and decoded. Done on every
fetch, for every partition, it was most of a fetch's time: a consumer reading 300,000
records waited 5 s on each of its fetches while the LAC of an idle writer's last entry
lagged (issue 25). A fetch now answers the offsets last looked up and refreshes them in
the background, one look-up at a time per partition; only a partition's first fetch
waits for one. A high watermark is never below the records answered (the fetch takes
the larger), so a stale one only understates the lag for a moment.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING, Final

from foundation.errors import BooklineError
from foundation.names import partition_stream

if TYPE_CHECKING:
    from serving.read.pages import Pages

__all__ = ["PartitionEnds"]

log = logging.getLogger(__name__)

# How old the offsets answered may be before a fetch starts a look-up for newer ones
# (a look-up decodes the stream's last entry: at 0.5 s, a tenth of a catch-up fetch's
# CPU in py-spy).
REFRESH_S: Final = 1.0
# Partitions remembered at most (least recently fetched dropped).
PARTITIONS_MAX: Final = 10_000

Ends = tuple[int, int]  # (end offset as of the LAC, first kept offset)
_Key = tuple[str, int]


class PartitionEnds:
    def __init__(self) -> None:
        self._known: collections.OrderedDict[_Key, tuple[Ends, float]] = collections.OrderedDict()
        self._looking: dict[_Key, asyncio.Task[Ends | BooklineError]] = {}

    async def get(self, pages: Pages, topic: str, index: int) -> Ends | BooklineError:
        """The partition's (end, start) offsets: the last ones looked up (a newer
        look-up started when they are older than REFRESH_S), else a look-up's."""
        key = (topic, index)
        known = self._known.get(key)
        if known is None:
            return await asyncio.shield(self._look_up(pages, key))
        self._known.move_to_end(key)
        ends, at = known
        if time.monotonic() - at > REFRESH_S:
            self._look_up(pages, key)
        return ends

    def _look_up(self, pages: Pages, key: _Key) -> asyncio.Task[Ends | BooklineError]:
        """The partition's look-up in progress, else a new one."""
        task = self._looking.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._info(pages, key))
            self._looking[key] = task
            task.add_done_callback(lambda _t: self._looking.pop(key, None))
        return task

    async def _info(self, pages: Pages, key: _Key) -> Ends | BooklineError:
        topic, index = key
        try:
            info = await pages.ns.stream_info(partition_stream(topic, index))
        except BooklineError as exc:
            self._known.pop(key, None)  # e.g. deleted: the fetch answers the error
            return exc
        ends = (int(info.next_sequence_id), int(info.first_sequence_id))
        self._known[key] = (ends, time.monotonic())
        self._known.move_to_end(key)
        while len(self._known) > PARTITIONS_MAX:
            self._known.popitem(last=False)
        return ends
