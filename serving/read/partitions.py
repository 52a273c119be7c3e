"""Topic partitions read by offset: the consumers' fetch, without its protocol.

A consumer reads its partition forward page after page, so each page is served by the
private reader the previous page ended with (:class:`~serving.read.readers.ReaderPool`,
keyed by the next offset): its read-ahead keeps fetching from the bookies while the
consumer works, and only the first page of a consumer opens a reader. Opening one
checks the offset against the partition first: past the end offset, or before the
first offset still kept (truncated), raises ``OUT_OF_RANGE`` (40) -- a consumer then
applies its ``auto_offset_reset`` -- instead of a reader that would start elsewhere.
A partition's offsets are its stream's sequence ids.

A Kafka fetch (:func:`fetch_partition`) differs in three ways: a consumer at the tail
is served from the partition's shared feed when the feed covers its offset (the feed's
pump learns a record once for every tailer, and the fetch needs no reader of its own;
an empty slice is an empty answer, as Kafka's, not "no records" -- the high watermark
says what exists); a read at the end answers at once: the fetch long-polls on the
feeds itself, so the private reader's end-of-stream grace (``AT_END_GRACE_S``) would
only add to every tailing fetch's latency, one partition after another; and a
catch-up read hands the record sets through as stored, for the Kafka front end to
cut its batch from their columns (building a ``ReadRecord`` per record was 38 % of
a catch-up fetch's CPU, issue 25).
"""

from __future__ import annotations

from foundation.invariants import invariant
from foundation.names import partition_stream
from groups.offsets import check_offset
from serving.read.pages import Pages
from serving.read.readers import AT_END_GRACE_S
from streams.dlsn import StartPosition
from streams.reader_items import RawRecordSet
from streams.records import ReadRecord

__all__ = ["fetch_partition", "read_partition"]


async def read_partition(
    pages: Pages, topic: str, partition: int, offset: int, *, limit: int, wait_s: float
) -> list[ReadRecord]:
    """Up to ``limit`` records of ``topic``'s ``partition`` from ``offset`` (within the
    core's ``read_bytes_max`` of values and keys, at least one); ``wait_s > 0`` waits
    that long for a first record at the partition's end."""
    bytes_max = pages.config.read_bytes_max
    recs = await _private(pages, topic, partition, offset, limit, wait_s, AT_END_GRACE_S, bytes_max)
    return _counted(pages, partition_stream(topic, partition), recs)


async def fetch_partition(
    pages: Pages, topic: str, partition: int, offset: int, *, limit: int, bytes_max: int
) -> tuple[list[ReadRecord], list[RawRecordSet]]:
    """A Kafka fetch's page of ``topic``'s ``partition`` from ``offset``, as records or
    as record sets (the other list empty): up to ``limit`` records within about
    ``bytes_max`` (at least one) from the partition's feed when it covers ``offset``,
    else whole record sets as stored by a kept private reader, about ``bytes_max`` of
    them (stored bytes, as Kafka's limits count), not waiting; the first set may
    begin before ``offset`` (see the module)."""
    name = partition_stream(topic, partition)
    feed = pages.feeds.get(name)
    if feed is not None and feed.covers(offset) and feed.error is None:
        # Even when its reader is between two LAC polls (not at_head): the fetch then
        # long-polls on this feed, where a private reader would wait to read the tail
        # itself (1-2 s a fetch on a loaded machine).
        items = feed.slice(offset, limit, bytes_max)
        pages.metrics.count_served("feed", name, len(items))
        return [item.record for item in items], []

    async def check() -> None:
        await check_offset(pages.ns, topic, partition, offset)

    bytes_max = min(bytes_max, pages.config.read_bytes_max)
    sets = await pages.pool.read_sets(
        name, StartPosition.sequence(offset), bytes_max, 0.0, before_open=check, grace_s=0.0
    )
    pages.metrics.count_served("partition", name, sum(s.user_count for s in sets))
    return [], sets


async def _private(  # noqa: PLR0917 - private, the two callers' arguments
    pages: Pages,
    topic: str,
    partition: int,
    offset: int,
    limit: int,
    wait_s: float,
    grace_s: float,
    bytes_max: int,
) -> list[ReadRecord]:
    """Records by the kept private reader at ``offset`` (a new one checked first),
    within about ``bytes_max`` of values and keys (the reader keeps the rest)."""

    async def check() -> None:
        await check_offset(pages.ns, topic, partition, offset)

    name = partition_stream(topic, partition)
    recs = await pages.pool.read(
        name, StartPosition.sequence(offset), limit, wait_s,
        before_open=check, grace_s=grace_s, bytes_max=bytes_max,
    )  # fmt: skip
    if recs:
        # Offsets increase from the asked one: contiguous, or sparse where compaction
        # removed records (streams.compaction), never before it (the reader was opened
        # without skip_truncated).
        invariant(
            recs[0][4] >= offset and recs[-1][4] >= recs[0][4] + len(recs) - 1,
            "partition %s page from %d holds offsets %d..%d for %d records",
            name, offset, recs[0][4], recs[-1][4], len(recs),
        )  # fmt: skip
    return recs


def _counted(pages: Pages, name: str, page: list[ReadRecord]) -> list[ReadRecord]:
    pages.metrics.count_served("partition", name, len(page))
    return page
