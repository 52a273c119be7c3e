"""A tail's batches: where a follower of a stream starts, then the stream's shared feed
batch by batch. No I/O of its own: the front end sends each batch (the read proxy: one
WebSocket frame each, :mod:`readproxy.tail`).

The tail starts where its position says; a start that is not a sequence id (a txid, a
time, a DLSN behind the ring, earliest) is found with a first private batch. Then it
follows the stream's shared feed (at most ``batch_records_max`` records a batch) and
catches up with a private reader whenever it is behind the feed's ring (a slow client,
a feed restarted after eviction). While nothing arrives it yields an empty batch every
``wait_slice_s``, so the front end can look at its client between batches.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Final

from serving.read.feeds import Feed
from serving.read.frames import CachedRecord, pack_record
from serving.read.pages import Pages
from streams.dlsn import PositionKind, StartPosition

__all__ = ["WAIT_SLICE_S", "Batch", "follow"]

# A follower yields (an empty batch when nothing came) at least this often while waiting.
WAIT_SLICE_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class Batch:
    items: list[CachedRecord]
    next_seq: int  # where the batch after this one starts
    path: str  # where its records came from: "feed" or "private"


async def follow(
    pages: Pages,
    name: str,
    pos: StartPosition,
    batch_records_max: int,
    wait_slice_s: float = WAIT_SLICE_S,
) -> AsyncGenerator[Batch, None]:
    """Batches of ``name`` from ``pos`` until the caller stops asking (close the
    generator: ``contextlib.aclosing``; that detaches it from the feed)."""
    first = await _first_batch(pages, name, pos, batch_records_max)
    if first.items:
        yield first
    seq = first.next_seq
    feed: Feed = await pages.feeds.open(name, seq)
    feed.subscribers += 1
    pages.metrics.add_subscribers(1)
    try:
        while True:
            if pages.feeds.get(name) is not feed:
                feed.subscribers -= 1
                feed = await pages.feeds.open(name, seq)
                feed.subscribers += 1
            if seq < feed.first_seq:  # behind the ring: catch up privately
                recs = await pages.pool.read(
                    name, StartPosition.sequence(seq), batch_records_max, wait_slice_s
                )
                if recs:
                    seq = recs[-1].sequence_id + 1
                yield Batch([pack_record(r) for r in recs], seq, "private")
                continue
            items = feed.slice(seq, batch_records_max, pages.config.read_bytes_max)
            if not items:
                await feed.wait_beyond(seq, wait_slice_s)
            seq += len(items)
            yield Batch(items, seq, "feed")
    finally:
        feed.subscribers -= 1
        pages.metrics.add_subscribers(-1)


async def _first_batch(pages: Pages, name: str, pos: StartPosition, records_max: int) -> Batch:
    """The sequence id the tail follows from, with a first private batch when the start
    is not one, or from the stream's info when it has nothing there."""
    seq = await pages.resolve_seq(name, pos)
    if seq is not None:
        return Batch([], seq, "feed")
    recs = await pages.pool.read(name, pos, records_max, 0.0)
    if recs:
        return Batch([pack_record(r) for r in recs], recs[-1].sequence_id + 1, "private")
    info = await pages.ns.stream_info(name)
    if pos.kind is not PositionKind.EARLIEST or info.first_sequence_id is None:
        return Batch([], int(info.next_sequence_id), "feed")
    return Batch([], int(info.first_sequence_id), "feed")
