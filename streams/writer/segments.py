"""A writer's segments: recovery at open, rolls and seals.

Opening (:meth:`Segments.open`, with the stream's lock already held):

1. if the last segment is still in progress, *recover* its ledger: recovery fences the
   bookies, so an old writer -- even one whose ZooKeeper session is still alive because
   it is paused -- can never get another entry acknowledged; then read the recovered
   last entry to learn the segment's counters;
2. seal that segment and open a new one (a fresh ledger) in **one** ZooKeeper
   transaction that also bumps the stream's max txid. A new owner always starts a new
   segment: the segment is the writer's epoch.

Segments roll when they pass the size or age limit: the sender waits for the old
ledger's adds, closes it, and seals + opens the next segment in one transaction on a
ledger that was created in advance, so a roll costs one ZooKeeper round trip.

That ledger (the *spare*) is tagged at creation with the stream and this writer's lock
node, so once the writer is gone without deleting it (``kill -9``) the elected auditor
can tell it is an orphan and collect it (:mod:`ledger.orphans`). Opening a segment
checks its ledger still exists; a spare that vanished (deleted by hand, or collected
while this writer's lock was lost) is replaced by a fresh ledger, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from foundation.errors import (
    BadVersionError,
    BooklineError,
    EndOfStreamError,
    NotFoundError,
    fresh,
)
from foundation.invariants import invariant
from ledger.reader import LedgerReader
from ledger.writer import LedgerWriter
from metadata.ownership import StreamLock
from metadata.segments import TAG_STREAM, TAG_WRITER_LOCK, SegmentMetadata, TruncationState
from metadata.streams import StreamOptions
from streams.context import CoreContext
from streams.recordset import decode_header, decode_read_records

log = logging.getLogger(__name__)
# Seal transactions tried when only a compaction's max-txid bump (not the segment)
# changed in between: each swap bumps once, so a few attempts always get through.
SEAL_ATTEMPTS_MAX = 5

__all__ = ["SegmentState", "Segments"]


@dataclasses.dataclass(slots=True)
class SegmentState:
    """The segment being written, with what the sender submitted into it so far."""

    meta: SegmentMetadata
    version: int
    ledger: LedgerWriter
    records: int = 0  # user records submitted into this segment
    bytes: int = 0  # payload bytes submitted
    first_txid: int = -1
    last_txid: int = -1
    last_slot: int = -1
    opened_ms: int = 0
    sealing: bool = False  # its ledger is being closed: nothing more may be submitted


class Segments:
    """The segment lifecycle of one writer. ``failed`` returns the writer's error, if
    any: a seal checks it once the ledger's adds are done."""

    def __init__(
        self,
        ctx: CoreContext,
        stream: str,
        lock: StreamLock,
        options: StreamOptions,
        failed: Callable[[], BooklineError | None],
    ) -> None:
        self._ctx = ctx
        self._cfg = ctx.config
        self._stream = stream
        self._lock = lock
        self._failed = failed
        self._rollover_bytes = options.segment_rollover_bytes or self._cfg.segment_rollover_bytes
        self._rollover_ms = options.segment_rollover_ms or self._cfg.segment_rollover_ms
        # The stream's own quorums (a topic's partitions carry the topic's), else the
        # namespace's.
        cfg = self._cfg
        self._quorums = options.quorums or (cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum)
        self.current: SegmentState | None = None
        self._next_ledger: asyncio.Task[LedgerWriter] | None = None  # created in advance
        # Held while segment metadata is rewritten (seal, truncation, retention).
        self.meta_lock = asyncio.Lock()

    def apply_options(self, options: StreamOptions) -> None:
        """New stream options: rolls and quorums from the next segment on."""
        cfg = self._cfg
        self._rollover_bytes = options.segment_rollover_bytes or cfg.segment_rollover_bytes
        self._rollover_ms = options.segment_rollover_ms or cfg.segment_rollover_ms
        self._quorums = options.quorums or (cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum)

    @property
    def seqno(self) -> int:
        return self.current.meta.seqno if self.current is not None else 0

    # -- opening -----------------------------------------------------------------------

    async def open(self) -> int:
        """Recover and seal the previous segment, open this writer's; the txid floor."""
        ctx, ns = self._ctx, self._ctx.namespace
        segments = await ctx.segments(self._stream)
        self._next_ledger = self._spare()
        last = segments[-1] if segments else None
        sealed: tuple[SegmentMetadata, int] | None = None
        if last is not None and not last[0].is_sealed:
            recovered, ended = await self._recover(last[0])
            sealed = (recovered, last[1])
            prev: SegmentMetadata | None = recovered
            if ended:
                # The previous writer queued its end-of-stream marker but did not seal
                # (it crashed or lost the lock): seal for it, and refuse to go on.
                max_txid, max_version = await ctx.md.streams.get_max_txid(ns, self._stream)
                await ctx.md.segments.seal_and_open(
                    ns, self._stream, recovered, last[1], None,
                    max_txid=max(max_txid, recovered.last_txid), max_txid_version=max_version,
                )  # fmt: skip
                raise EndOfStreamError(f"stream {ns}/{self._stream} was marked ended")
        else:
            prev = last[0] if last is not None else None
            if prev is not None and await self._ended_in(prev):
                raise EndOfStreamError(f"stream {ns}/{self._stream} was marked ended")
        max_txid, max_version = await ctx.md.streams.get_max_txid(ns, self._stream)
        if prev is not None:
            max_txid = max(max_txid, prev.last_txid)
        ledger = await self._next_ledger
        self._next_ledger = None
        now = ctx.clock_ms()
        meta = SegmentMetadata(
            seqno=1 if prev is None else prev.seqno + 1,
            ledger_id=ledger.ledger_id,
            start_sequence_id=0 if prev is None else prev.start_sequence_id + prev.record_count,
            ctime_ms=now,
        )

        async def commit(meta: SegmentMetadata) -> None:
            if sealed is not None:
                await ctx.md.segments.seal_and_open(
                    ns, self._stream, sealed[0], sealed[1], meta,
                    max_txid=max_txid, max_txid_version=max_version,
                )  # fmt: skip
            else:
                await ctx.md.segments.open_segment(
                    ns, self._stream, meta, max_txid=max_txid, max_txid_version=max_version
                )

        meta, ledger = await self._open_on(meta, ledger, commit)
        _seg, version = await ctx.md.segments.get_segment(ns, self._stream, meta.seqno)
        self.current = SegmentState(meta, version, ledger, opened_ms=now)
        self._next_ledger = self._spare()
        log.info(
            "writer %s on %s/%s: segment %d (ledger %d), txid floor %d",
            self._lock.identity, ns, self._stream, meta.seqno, ledger.ledger_id, max_txid,
        )  # fmt: skip
        return max_txid

    async def abort_open(self) -> None:
        """Opening failed: delete the ledger created in advance."""
        if self._next_ledger is not None:
            self._next_ledger.cancel()
            with contextlib.suppress(asyncio.CancelledError, BooklineError):
                ledger = await self._next_ledger
                await self._discard_ledger(ledger)

    async def _recover(self, segment: SegmentMetadata) -> tuple[SegmentMetadata, bool]:
        """Fence and close the previous writer's ledger; return the segment sealed at the
        recovered end, with counters read back from its last entry, and whether that
        entry is an end-of-stream marker."""
        ctx = self._ctx
        reader = await ctx.ledgers.open_ledger(
            segment.ledger_id, self._cfg.password_bytes, recover=True
        )
        last_entry = reader.last_add_confirmed
        counters = dict(record_count=0, size_bytes=0, last_txid=-1, last_slot_id=-1)
        first_txid = -1
        ended = False
        if last_entry >= 0:
            data = await reader.read_entry(last_entry)
            header, records, ended = decode_read_records(
                data, self._stream, segment.seqno, last_entry, segment.start_sequence_id
            )
            counters = dict(
                record_count=header.first_index + header.user_count,
                size_bytes=header.bytes_before + sum(len(r.payload or b"") for r in records),
                last_txid=header.last_txid,
                last_slot_id=header.count - 1,
            )
            first = decode_header(await reader.read_entry(0))
            first_txid = first.first_txid if first.first_txid >= 0 else header.first_txid
            if first_txid < 0:
                first_txid = await self._first_txid(reader, last_entry)
        log.info(
            "recovered segment %d of %s (ledger %d): last entry %d, %d records",
            segment.seqno, self._stream, segment.ledger_id, last_entry, counters["record_count"],
        )  # fmt: skip
        sealed = dataclasses.replace(
            segment.sealed(last_entry_id=last_entry, sealed_ms=ctx.clock_ms(), **counters),
            first_txid=first_txid,
        )
        return sealed, ended

    async def _first_txid(self, reader: LedgerReader, last_entry: int) -> int:
        """First user txid of a recovered segment whose first entry is a control set."""
        for entry_id in range(1, last_entry + 1):
            header = decode_header(await reader.read_entry(entry_id))
            if header.first_txid >= 0:
                return header.first_txid
        return -1

    async def _ended_in(self, segment: SegmentMetadata) -> bool:
        if segment.last_entry_id < 0:
            return False
        if segment.truncation is TruncationState.TRUNCATED:
            return False  # its ledger is gone; an end-of-stream marker is never truncated
        # Any failure to read the last entry propagates: guessing "not ended" here would
        # let a writer append after an end-of-stream marker (e.g. on a read timeout).
        reader = await self._ctx.open_segment_reader(segment)
        data = await reader.read_entry(segment.last_entry_id)
        return decode_read_records(data, self._stream, segment.seqno, segment.last_entry_id,
                                   segment.start_sequence_id)[2]  # fmt: skip

    def _spare(self) -> asyncio.Task[LedgerWriter]:
        """Start creating the next segment's ledger in advance. Whoever opens or rolls
        a segment awaits it and gets its failure; a writer that ends without doing
        either (it failed, or its ZooKeeper client closed) leaves the task behind, so
        its failure is also logged here, never left to asyncio's "exception was never
        retrieved" at garbage collection (a spare it did create is an orphan ledger,
        which the collector deletes)."""
        task = asyncio.ensure_future(self._create_ledger())
        task.add_done_callback(self._spare_ended)
        return task

    def _spare_ended(self, task: asyncio.Task[LedgerWriter]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.info("ledger created in advance for %s failed: %r", self._stream, exc)

    async def _create_ledger(self) -> LedgerWriter:
        """A ledger for a segment to come, tagged with the stream and this writer's lock
        node (the metadata is written before any entry: no ledger is ever untagged)."""
        cfg = self._cfg
        ensemble, write, ack = self._quorums
        custom = {TAG_STREAM: f"{self._ctx.namespace}/{self._stream}".encode()}
        node = self._lock.node
        if node is not None:
            custom[TAG_WRITER_LOCK] = node.rsplit("/", 1)[1].encode()
        return await self._ctx.ledgers.create_ledger(
            ensemble_size=ensemble,
            write_quorum=write,
            ack_quorum=ack,
            digest_type=cfg.ledger_digest,
            custom=custom,
        )

    async def _open_on(
        self,
        meta: SegmentMetadata,
        ledger: LedgerWriter,
        commit: Callable[[SegmentMetadata], Awaitable[None]],
    ) -> tuple[SegmentMetadata, LedgerWriter]:
        """Run the transition ``commit`` opening segment ``meta`` on ``ledger``. If the
        ledger vanished (the transition checks it exists), try once more on a fresh
        one; a failure otherwise deletes the ledger. Returns what was opened."""
        try:
            await commit(meta)
            return meta, ledger
        except NotFoundError:
            if await self._ctx.md.ledgers.exists(ledger.ledger_id):
                await self._discard_ledger(ledger)
                raise  # something else is missing: not ours to repair
        except BaseException:
            await self._discard_ledger(ledger)
            raise
        log.warning(
            "spare ledger %d of %s vanished; opening segment %d on a new ledger",
            ledger.ledger_id, self._stream, meta.seqno,
        )  # fmt: skip
        ledger = await self._create_ledger()  # the vanished one holds no entry, no task
        meta = dataclasses.replace(meta, ledger_id=ledger.ledger_id)
        try:
            await commit(meta)
        except BaseException:
            await self._discard_ledger(ledger)
            raise
        return meta, ledger

    async def _discard_ledger(self, ledger: LedgerWriter) -> None:
        """An allocated ledger that never became a segment: delete it, not leak it."""
        try:
            await ledger.close()
            await self._ctx.ledgers.delete_ledger(ledger.ledger_id)
        except BooklineError as exc:
            log.warning("could not delete unused ledger %d: %s", ledger.ledger_id, exc)

    # -- rolling and sealing -----------------------------------------------------------

    def roll_due(self, seg: SegmentState) -> bool:
        return seg.bytes >= self._rollover_bytes or (
            seg.records > 0 and self._ctx.clock_ms() - seg.opened_ms >= self._rollover_ms
        )

    async def seal(self, next_meta: SegmentMetadata | None) -> None:
        """Close the current ledger (waits for its adds) and seal the segment, opening
        ``next_meta`` in the same transaction when given."""
        seg = self.current
        assert seg is not None
        ctx, ns = self._ctx, self._ctx.namespace
        seg.sealing = True
        await seg.ledger.close()
        error = self._failed()
        if error is not None:
            raise fresh(error)
        last_entry = seg.ledger.last_add_confirmed
        invariant(last_entry == seg.ledger.last_add_pushed, "closed with entries unconfirmed")
        sealed = dataclasses.replace(
            seg.meta.sealed(
                last_txid=seg.last_txid, last_entry_id=last_entry, last_slot_id=seg.last_slot,
                record_count=seg.records, size_bytes=seg.bytes, sealed_ms=ctx.clock_ms(),
            ),
            first_txid=seg.first_txid,
        )  # fmt: skip
        async with self.meta_lock:
            for attempt in range(SEAL_ATTEMPTS_MAX):
                seg_now, version = await ctx.md.segments.get_segment(
                    ns, self._stream, seg.meta.seqno
                )
                sealed = dataclasses.replace(
                    sealed, truncation=seg_now.truncation, min_active_dlsn=seg_now.min_active_dlsn
                )
                max_txid, max_version = await ctx.md.streams.get_max_txid(ns, self._stream)
                self._lock.check_owner()
                try:
                    await ctx.md.segments.seal_and_open(
                        ns, self._stream, sealed, version, next_meta,
                        max_txid=max(max_txid, sealed.last_txid), max_txid_version=max_version,
                    )  # fmt: skip
                    break
                except BadVersionError:
                    # A compaction's swap bumps the max-txid version (streams.compaction);
                    # read again, unless the segment itself is no longer ours to seal.
                    now, _v = await ctx.md.segments.get_segment(ns, self._stream, seg.meta.seqno)
                    if now.is_sealed or now.ledger_id != seg.meta.ledger_id:
                        raise
                    if attempt + 1 == SEAL_ATTEMPTS_MAX:
                        raise
                    log.info("%s: segment %d seal raced a metadata change; again",
                             self._stream, seg.meta.seqno)  # fmt: skip
        seg.meta = sealed

    async def roll(self) -> None:
        """Seal the current segment and open the next on the ledger created in advance."""
        seg = self.current
        assert seg is not None
        assert self._next_ledger is not None
        ledger = await self._next_ledger
        self._next_ledger = None
        now = self._ctx.clock_ms()
        meta = SegmentMetadata(
            seqno=seg.meta.seqno + 1,
            ledger_id=ledger.ledger_id,
            start_sequence_id=seg.meta.start_sequence_id + seg.records,
            ctime_ms=now,
        )
        meta, ledger = await self._open_on(meta, ledger, self.seal)
        _m, version = await self._ctx.md.segments.get_segment(
            self._ctx.namespace, self._stream, meta.seqno
        )
        self.current = SegmentState(meta, version, ledger, opened_ms=now)
        self._next_ledger = self._spare()
        log.info("%s rolled to segment %d (ledger %d)", self._stream, meta.seqno, ledger.ledger_id)

    async def release(self) -> None:
        """The writer closes: delete the ledger created in advance."""
        if self._next_ledger is not None:
            task_ledger, self._next_ledger = self._next_ledger, None
            try:
                await self._discard_ledger(await task_ledger)
            except BooklineError as exc:
                log.warning("pre-allocated ledger of %s failed: %s", self._stream, exc)
