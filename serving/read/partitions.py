"""Topic partitions read by offset: the consumers' fetch, without its protocol.

A consumer reads its partition forward page after page, so each page is served by the
private reader the previous page ended with (:class:`~serving.read.readers.ReaderPool`,
keyed by the next offset): its read-ahead keeps fetching from the bookies while the
consumer works, and only the first page of a consumer opens a reader. Opening one
checks the offset against the partition first: past the end offset, or before the
first offset still kept (truncated), raises ``OUT_OF_RANGE`` (40) -- a consumer then
applies its ``auto_offset_reset`` -- instead of a reader that would start elsewhere.
A partition's offsets are its stream's sequence ids.
"""

from __future__ import annotations

import operator
from typing import Final

from foundation.invariants import invariant
from foundation.names import partition_stream
from groups.offsets import check_offset
from serving.read.pages import Pages
from streams.dlsn import StartPosition
from streams.records import ReadRecord

__all__ = ["read_partition"]

# A ReadRecord is a tuple: [7] is its payload, [8] its key.
_VALUE: Final = operator.itemgetter(7)
_KEY: Final = operator.itemgetter(8)


async def read_partition(
    pages: Pages, topic: str, partition: int, offset: int, *, limit: int, wait_s: float
) -> list[ReadRecord]:
    """Up to ``limit`` records of ``topic``'s ``partition`` from ``offset`` (within the
    core's ``read_bytes_max`` of values and keys, at least one); ``wait_s > 0`` waits
    that long for a first record at the partition's end."""
    name = partition_stream(topic, partition)

    async def check() -> None:
        await check_offset(pages.ns, topic, partition, offset)

    recs = await pages.pool.read(
        name, StartPosition.sequence(offset), limit, wait_s, before_open=check
    )
    if recs:
        # Offsets are contiguous from the asked one (the reader never skips: it was
        # opened without skip_truncated, and sequence ids have no holes).
        invariant(
            recs[0][4] == offset and recs[-1][4] == offset + len(recs) - 1,
            "partition %s page from %d holds offsets %d..%d for %d records",
            name, offset, recs[0][4], recs[-1][4], len(recs),
        )  # fmt: skip
    page = _within_bytes(recs, pages.config.read_bytes_max)
    pages.metrics.count_served("partition", name, len(page))
    return page


def _within_bytes(recs: list[ReadRecord], bytes_max: int) -> list[ReadRecord]:
    """The leading records within ``bytes_max`` of values and keys (at least one). A
    page cut short leaves its reader parked at the wrong offset, so the next page opens
    another: the price of pages of very large records only. The sizes are summed in C
    first (a per-record Python loop was 10 % of a page's CPU in py-spy)."""
    payloads = list(map(_VALUE, recs))
    if None in payloads:  # null values (rare) count nothing
        payloads = [p or b"" for p in payloads]
    values = list(map(len, payloads))
    keys = sum(map(len, filter(None, map(_KEY, recs))))
    if sum(values) + keys <= bytes_max:
        return recs
    size = 0
    for i, r in enumerate(recs):
        size += values[i] + len(r[8] or b"")
        if size > bytes_max and i > 0:
            return recs[:i]
    return recs
