"""Orphaned stream ledgers: spares a dead writer left behind, and their collection.

A stream writer creates the ledger of its next segment in advance (its *spare*,
:mod:`streams.writer.segments`) and tags it at creation -- ledger metadata is written
before any entry, so no ledger of a stream exists untagged -- with the stream
(``stream`` = ``ns/name``) and the node of the stream lock its writer held
(``writer-lock`` = ``member-<seq>``). A clean shutdown deletes the spare; a killed
writer leaves it behind. A ledger is an **orphan** when all of these hold:

* it is tagged with a stream, and no segment of that stream references it;
* the writer that could still roll into it is gone: its lock node no longer exists
  (ephemeral and sequential, a lock node never comes back). A ledger tagged by an
  older build without the lock tag counts as gone only when nobody holds or waits for
  the stream's lock at all;
* it is older than ``orphan_ledger_age_ms``.

Ledgers without a stream tag belong to users of the ledger API and are never collected.

The delete races a writer turning the spare into a segment, and ZooKeeper settles it:
opening a segment is a transaction that checks the ledger's znode exists and bumps the
stream's max-txid znode (:mod:`metadata.segments`); the collector reads the max-txid
version *before* listing the segments, and deletes the ledger in a transaction that
checks that version. Whichever commits first makes the other fail: a collector that
loses looks again next time; a writer whose spare vanished opens on a new ledger.

The elected auditor runs :meth:`OrphanCollector.collect` every
``orphan_check_interval_ms``; ``bookline ledger list`` uses :meth:`OrphanCollector.role`
to show each ledger as a segment, a live writer's spare, or an orphan.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from foundation.errors import BadVersionError, NotFoundError
from metadata.layout import LOCK_PREFIX
from metadata.ledger_metadata import LedgerMetadata
from metadata.segments import TAG_STREAM, TAG_WRITER_LOCK

if TYPE_CHECKING:
    from metadata.client import MetadataClient

log = logging.getLogger(__name__)

__all__ = ["LedgerRole", "OrphanCollector"]


class LedgerRole(enum.Enum):
    SEGMENT = "segment"  # a segment of its stream references it
    SPARE = "spare"  # created in advance by a live writer of its stream
    ORPHAN = "orphan"  # unreferenced, its writer gone: collected once old enough
    NONE = ""  # not a stream's ledger (the ledger API's own)


@dataclasses.dataclass(frozen=True, slots=True)
class _StreamView:
    """What a stream's metadata says, read in this order: the max-txid version first,
    then the segments (a segment opened after the version was read changes it)."""

    exists: bool
    max_txid_version: int
    referenced: frozenset[int]


class OrphanCollector:
    """Finds and deletes orphaned stream ledgers (one pass per :meth:`collect`)."""

    def __init__(
        self,
        md: MetadataClient,
        *,
        min_age_ms: int,
        reads_in_flight_max: int,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._md = md
        self._min_age_ms = min_age_ms
        self._reads_in_flight_max = reads_in_flight_max
        self._wall_ms = wall_ms
        self.collected = 0  # ledgers deleted as orphans, over this object's life

    # -- what a ledger is --------------------------------------------------------------

    @staticmethod
    def stream_of(meta: LedgerMetadata) -> tuple[str, str] | None:
        """``(namespace, stream)`` of a stream's ledger, None for any other ledger."""
        tag = meta.custom.get(TAG_STREAM)
        if not tag:
            return None
        ns, sep, stream = tag.decode("utf-8", "replace").partition("/")
        return (ns, stream) if sep and ns and stream else None

    async def role(
        self, meta: LedgerMetadata, views: dict[tuple[str, str], _StreamView] | None = None
    ) -> LedgerRole:
        """What ``meta``'s ledger is now (``views`` caches streams across calls)."""
        key = self.stream_of(meta)
        if key is None:
            return LedgerRole.NONE
        view = await self._view(key, views)
        if meta.ledger_id in view.referenced:
            return LedgerRole.SEGMENT
        return LedgerRole.SPARE if await self._writer_alive(key, meta) else LedgerRole.ORPHAN

    async def _view(
        self, key: tuple[str, str], views: dict[tuple[str, str], _StreamView] | None
    ) -> _StreamView:
        if views is not None and key in views:
            return views[key]
        ns, stream = key
        try:
            _txid, version = await self._md.streams.get_max_txid(ns, stream)
            segments = await self._md.segments.list_segments(ns, stream)
            view = _StreamView(True, version, frozenset(s.ledger_id for s, _v in segments))
        except NotFoundError:
            view = _StreamView(False, -1, frozenset())  # the stream was deleted
        if views is not None:
            views[key] = view
        return view

    async def _writer_alive(self, key: tuple[str, str], meta: LedgerMetadata) -> bool:
        """Whether the writer that created this ledger may still hold the stream's lock."""
        lock_dir = self._md.layout.lock(*key)
        node = meta.custom.get(TAG_WRITER_LOCK)
        if node:
            name = node.decode("utf-8", "replace")
            return await self._md.zk.exists(f"{lock_dir}/{name}") is not None
        try:  # an older build's ledger: any contender might be its writer
            children = await self._md.zk.get_children(lock_dir)
        except NotFoundError:
            return False
        return any(c.startswith(LOCK_PREFIX) for c in children)

    # -- collecting ------------------------------------------------------------------

    async def collect(self) -> int:
        """One pass over every ledger; delete the orphans. Returns how many."""
        views: dict[tuple[str, str], _StreamView] = {}
        batch: list[int] = []
        deleted = 0

        async def flush() -> None:
            nonlocal deleted
            reads = await asyncio.gather(*(self._read(i) for i in batch))
            batch.clear()
            for read in reads:
                if read is not None and await self._collect_one(*read, views):
                    deleted += 1

        async for ledger_id in self._md.ledgers.iter_ledger_ids():
            batch.append(ledger_id)
            if len(batch) >= self._reads_in_flight_max:
                await flush()
        await flush()
        self.collected += deleted
        return deleted

    async def _read(self, ledger_id: int) -> tuple[LedgerMetadata, int] | None:
        try:
            return await self._md.ledgers.read(ledger_id)
        except NotFoundError:
            return None  # deleted while we listed

    async def _collect_one(
        self, meta: LedgerMetadata, version: int, views: dict[tuple[str, str], _StreamView]
    ) -> bool:
        key = self.stream_of(meta)
        if key is None or self._wall_ms() - meta.ctime_ms < self._min_age_ms:
            return False
        if await self.role(meta, views) is not LedgerRole.ORPHAN:
            return False
        view = views[key]
        try:
            if view.exists:
                await self._md.segments.delete_unreferenced_ledger(
                    key[0], key[1], meta.ledger_id, version, view.max_txid_version
                )
            else:
                await self._md.ledgers.delete(meta.ledger_id, version)
        except BadVersionError:
            # A segment was opened (maybe on this ledger) or the ledger changed since
            # we looked: decide again on the next pass, from fresh metadata.
            views.pop(key, None)
            return False
        except NotFoundError:
            return False  # deleted meanwhile, or its stream was
        log.info(
            "collected orphaned ledger %d of stream %s/%s (%s, writer gone, created %d ms ago)",
            meta.ledger_id, key[0], key[1], meta.state.value, self._wall_ms() - meta.ctime_ms,
        )  # fmt: skip
        return True
