"""Pages of records by position, from a stream's shared feed when it covers the
position, else from a private reader (:class:`Pages`). No HTTP here.

Positions inside the read core are sequence ids: a start (earliest, latest, DLSN,
``seq:N``, ``txid:N``, ``time:MS``) is turned into one when that is cheap (``seq``,
``latest``, a DLSN inside a feed's ring); otherwise a private reader seeks it and the
page's last record tells the next sequence id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.read.config import ReadConfig
from serving.read.feeds import FeedRegistry
from serving.read.frames import CachedRecord
from serving.read.metrics import ReadMetrics
from serving.read.readers import ReaderPool
from streams.dlsn import PositionKind, StartPosition
from streams.records import ReadRecord

if TYPE_CHECKING:
    from streams.namespace import Namespace
    from streams.reader import RawRecordSet

__all__ = ["Pages"]


class Pages:
    """Reads by position over one core's feeds and private readers."""

    def __init__(
        self,
        ns: Namespace,
        feeds: FeedRegistry,
        pool: ReaderPool,
        config: ReadConfig,
        metrics: ReadMetrics,
    ) -> None:
        self.ns = ns
        self.feeds = feeds
        self.pool = pool
        self.config = config
        self.metrics = metrics

    async def resolve_seq(self, name: str, pos: StartPosition) -> int | None:
        """The position as a sequence id, when that is cheap to know."""
        if pos.kind is PositionKind.SEQUENCE:
            return pos.value
        feed = self.feeds.get(name)
        if pos.kind is PositionKind.LATEST:
            # After every record acknowledged before the call: a feed's head (it learns
            # a record when its tail does, a moment after the acknowledgement) may lag.
            end = await self.ns.end_offset(name)
            return end if feed is None else max(end, feed.next_seq)
        if pos.kind is PositionKind.DLSN and feed is not None:
            assert pos.dlsn_value is not None
            return feed.seq_of(pos.dlsn_value)
        return None

    async def read_page(
        self, name: str, pos: StartPosition, limit: int, wait_s: float
    ) -> tuple[list[CachedRecord] | list[ReadRecord], str]:
        """Records from ``pos`` and where to continue; ``wait_s > 0`` long-polls (from
        the stream's feed, opened for it)."""
        cfg = self.config
        follow = wait_s > 0
        seq = await self.resolve_seq(name, pos)
        if seq is not None:
            feed = self.feeds.get(name)
            if feed is None and (follow or pos.kind is PositionKind.LATEST):
                feed = await self.feeds.open(name, seq)
            if feed is not None and feed.covers(seq):
                items = feed.slice(seq, limit, cfg.read_bytes_max)
                if not items and follow and await feed.wait_beyond(seq, wait_s):
                    items = feed.slice(seq, limit, cfg.read_bytes_max)
                if items or feed.at_head:
                    self.metrics.count_served("feed", name, len(items))
                    return items, f"seq:{seq + len(items)}"
                if feed.error is not None:  # its reader fails: what lies beyond is unknown
                    raise feed.error
                follow = False  # the feed is behind the stream: read what it lacks
            start = StartPosition.sequence(seq)
        else:
            start = pos
        recs = await self.pool.read(name, start, limit, wait_s if follow else 0.0)
        self.metrics.count_served("private", name, len(recs))
        if recs:
            nxt = recs[-1].sequence_id + 1
            if follow and len(recs) < limit and self.feeds.get(name) is None:
                await self.feeds.open(name, nxt)  # this reader reached the head
            return recs, f"seq:{nxt}"
        return recs, f"seq:{seq}" if seq is not None else str(pos)

    async def read_sets(
        self, name: str, pos: StartPosition, bytes_max: int, wait_s: float
    ) -> tuple[list[RawRecordSet], int]:
        """Record sets as stored from ``pos`` by a private reader (a catch-up read: no
        feed, nothing decoded) and the sequence id to continue from (-1: unknown yet)."""
        seq = pos.value if pos.kind is PositionKind.SEQUENCE else None
        start = StartPosition.sequence(seq) if seq is not None else pos
        sets = await self.pool.read_sets(name, start, bytes_max, wait_s)
        self.metrics.count_served("sets", name, sum(s.user_count for s in sets))
        if sets:
            return sets, sets[-1].next_sequence_id
        return sets, seq if seq is not None else -1
