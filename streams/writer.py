"""The single writer of a log stream.

Opening (:meth:`LogWriter.open`):

1. take the stream's exclusive ZooKeeper lock (or fail with ``LockOwnedError(owner=)``);
2. if the last segment is still in progress, *recover* its ledger: recovery fences the
   bookies, so an old writer -- even one whose ZooKeeper session is still alive because
   it is paused -- can never get another entry acknowledged; then read the recovered
   last entry to learn the segment's counters;
3. seal that segment and open a new one (a fresh ledger) in **one** ZooKeeper
   transaction that also bumps the stream's max txid. A new owner always starts a new
   segment: the segment is the writer's epoch.

Writing: records go into a buffer that becomes one ledger entry (a record set, see
:mod:`streams.records`) when it reaches ``buffer_bytes_max``, on :meth:`flush`, or --
adaptively -- at the next loop iteration while fewer than ``_IDLE_PIPE_ENTRIES`` entries
are in flight, else ``flush_interval_ms`` after its first record or as soon as the pipe
drains (so an idle writer sends at once and a busy one batches). One sender task encodes and submits
entries in order; futures resolve to DLSNs once the entry is acknowledged by the ack
quorum. The first failed entry fails the writer: every pending and later call raises
``WriterFailedError`` (cause chained) -- nothing is retried behind the caller's back,
so nothing can be reordered or silently dropped. Losing the lock fails the writer with
``OwnershipLostError``; a suspended ZooKeeper session pauses transmits until the lock
is confirmed again.

Segments roll when they pass the size or age limit: the sender waits for the old
ledger's adds, closes it, and seals + opens the next segment in one transaction on a
ledger that was created in advance, so a roll costs one ZooKeeper round trip.
Every entry carries the LAC to its bookies. When the pipe empties -- an entry was
acknowledged and nothing else is in flight or waiting -- the ledger's *explicit LAC*
(``LedgerWriter.push_lac``, the bookies' WRITE_LAC op) tells them the new LAC at once,
so a tailing reader never waits for a later entry that may not come; while entries
keep flowing, the next one tells them instead and no WRITE_LAC is spent. For bookies
without that op, a control record is still written when idle ``control_interval_ms``
after an acknowledged entry that no entry or explicit LAC has told them about.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ClosedError,
    EndOfStreamError,
    OutOfRangeError,
    OwnershipLostError,
    TooLargeError,
    TooManyRequestsError,
    WriterFailedError,
)
from foundation.invariants import invariant
from foundation.limits import RECORD_BYTES_MAX, record_bytes
from ledger.reader import LedgerReader
from ledger.writer import LedgerWriter
from metadata.ownership import LockState, StreamLock
from metadata.segments import SegmentMetadata, TruncationState
from metadata.streams import StreamOptions
from streams.context import CoreContext
from streams.dlsn import DLSN
from streams.records import (
    RECORD_OVERHEAD_BYTES,
    Compression,
    LogRecord,
    decode_header,
    decode_read_records,
    encode_control,
    encode_record_set,
)
from streams.retention import apply_retention, truncate_before

log = logging.getLogger(__name__)

__all__ = ["LogWriter"]

_NEW_DLSN = tuple.__new__
# Entries in flight (or queued for the sender) below which the pipe counts as idle:
# a write is transmitted at the next loop iteration instead of after the flush timer.
_IDLE_PIPE_ENTRIES = 2


def default_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _Batch:
    """The caller's side of one write_many: resolves once all its records are durable."""

    __slots__ = ("dlsns", "future", "remaining")

    def __init__(self, future: asyncio.Future[list[DLSN]], count: int) -> None:
        self.future = future
        self.remaining = count
        self.dlsns: list[DLSN] = []


# What waits on a slice of an entry: a single write's future (one record) or a
# write_many's (batch, record count). The slices cover the entry's records in order, so
# their slots follow from the counts. A bare future rather than a tuple per record: a
# writer with tens of thousands of records in flight keeps one object fewer alive per
# record for the cyclic GC to walk.
_Waiter = asyncio.Future[DLSN] | tuple[_Batch, int]


@dataclasses.dataclass(slots=True)
class _Outgoing:
    """One entry to be: user records (parallel lists) or a control/end-of-stream set."""

    payloads: list[bytes]
    txids: list[int]
    timestamps: list[int]
    keys: list[bytes | None] | None
    headers: list[dict[str, bytes] | None] | None
    waiters: list[_Waiter]  # in slot order, covering every record
    nbytes: int
    done: asyncio.Future[None]
    control: str = ""  # "", "control" or "eos"


@dataclasses.dataclass(slots=True)
class _SegmentState:
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


class LogWriter:
    """Use from one event loop. Open with :meth:`Namespace.open_writer`."""

    def __init__(
        self,
        ctx: CoreContext,
        stream: str,
        lock: StreamLock,
        options: StreamOptions,
    ) -> None:
        self._ctx = ctx
        self._cfg = ctx.config
        self.stream = stream
        self._lock = lock
        self._rollover_bytes = options.segment_rollover_bytes or self._cfg.segment_rollover_bytes
        self._rollover_ms = options.segment_rollover_ms or self._cfg.segment_rollover_ms
        self._options = options
        self._compression = Compression.parse(self._cfg.compression)
        self._loop = asyncio.get_running_loop()
        self._seg: _SegmentState | None = None
        self._next_ledger: asyncio.Task[LedgerWriter] | None = None
        self._meta_lock = asyncio.Lock()
        # buffer (parallel lists) ---------------------------------------------------
        self._b_payloads: list[bytes] = []
        self._b_txids: list[int] = []
        self._b_ts: list[int] = []
        self._b_keys: list[bytes | None] | None = None
        self._b_headers: list[dict[str, bytes] | None] | None = None
        self._b_waiters: list[_Waiter] = []
        self._b_bytes = 0
        self._timer: asyncio.Handle | None = None
        # sending -------------------------------------------------------------------
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._inflight: collections.deque[_Outgoing] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self._last_out: _Outgoing | None = None
        self._pending_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._owned = asyncio.Event()
        self._control_timer: asyncio.TimerHandle | None = None
        self._carried_lac = -1  # LAC the newest submitted entry carries
        self._retention_task: asyncio.Task[None] | None = None
        # state ---------------------------------------------------------------------
        self._error: BooklineError | None = None
        self._ended = False
        self._ending = False  # the end-of-stream marker is queued: nothing may follow it
        self._closed = False
        self._last_txid = -1
        self._last_ts = 0
        self.last_dlsn: DLSN | None = None

    # -- opening -----------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        ctx: CoreContext,
        stream: str,
        identity: str | None = None,
        *,
        lock_timeout_s: float | None = None,
    ) -> LogWriter:
        record, _version = await ctx.md.streams.get_stream(ctx.namespace, stream)
        lock = ctx.md.stream_lock(ctx.namespace, stream, identity or default_identity())
        if lock_timeout_s is None:
            await lock.try_acquire()
        else:
            await lock.acquire(lock_timeout_s)
        writer = cls(ctx, stream, lock, record.options)
        try:
            await writer._start()
        except BaseException:
            await writer._abort_open()
            raise
        return writer

    async def _abort_open(self) -> None:
        if self._next_ledger is not None:
            self._next_ledger.cancel()
            with contextlib.suppress(asyncio.CancelledError, BooklineError):
                ledger = await self._next_ledger
                await self._discard_ledger(ledger)
        await self._lock.release()

    async def _start(self) -> None:
        ctx, ns = self._ctx, self._ctx.namespace
        self._lock.add_listener(self._on_lock_state)
        self._owned.set()
        segments = await ctx.segments(self.stream)
        self._next_ledger = asyncio.ensure_future(self._create_ledger())
        last = segments[-1] if segments else None
        sealed: tuple[SegmentMetadata, int] | None = None
        if last is not None and not last[0].is_sealed:
            recovered, ended = await self._recover(last[0])
            sealed = (recovered, last[1])
            prev: SegmentMetadata | None = recovered
            if ended:
                # The previous writer queued its end-of-stream marker but did not seal
                # (it crashed or lost the lock): seal for it, and refuse to go on.
                max_txid, max_version = await ctx.md.streams.get_max_txid(ns, self.stream)
                await ctx.md.segments.seal_and_open(
                    ns, self.stream, recovered, last[1], None,
                    max_txid=max(max_txid, recovered.last_txid), max_txid_version=max_version,
                )  # fmt: skip
                raise EndOfStreamError(f"stream {ns}/{self.stream} was marked ended")
        else:
            prev = last[0] if last is not None else None
            if prev is not None and await self._ended_in(prev):
                raise EndOfStreamError(f"stream {ns}/{self.stream} was marked ended")
        max_txid, max_version = await ctx.md.streams.get_max_txid(ns, self.stream)
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
        try:
            if sealed is not None:
                await ctx.md.segments.seal_and_open(
                    ns, self.stream, sealed[0], sealed[1], meta,
                    max_txid=max_txid, max_txid_version=max_version,
                )  # fmt: skip
            else:
                await ctx.md.segments.open_segment(
                    ns, self.stream, meta, max_txid=max_txid, max_txid_version=max_version
                )
        except BaseException:
            await self._discard_ledger(ledger)
            raise
        _seg, version = await ctx.md.segments.get_segment(ns, self.stream, meta.seqno)
        self._seg = _SegmentState(meta, version, ledger, opened_ms=now)
        self._last_txid = max_txid
        self._last_ts = now
        self._next_ledger = asyncio.ensure_future(self._create_ledger())
        self._retention_task = asyncio.ensure_future(self._retention_loop())
        log.info(
            "writer %s on %s/%s: segment %d (ledger %d), txid floor %d",
            self._lock.identity, ns, self.stream, meta.seqno, ledger.ledger_id, max_txid,
        )  # fmt: skip

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
                data, self.stream, segment.seqno, last_entry, segment.start_sequence_id
            )
            counters = dict(
                record_count=header.first_index + header.user_count,
                size_bytes=header.bytes_before + sum(len(r.payload) for r in records),
                last_txid=header.last_txid,
                last_slot_id=header.count - 1,
            )
            first = decode_header(await reader.read_entry(0))
            first_txid = first.first_txid if first.first_txid >= 0 else header.first_txid
            if first_txid < 0:
                first_txid = await self._first_txid(reader, last_entry)
        log.info(
            "recovered segment %d of %s (ledger %d): last entry %d, %d records",
            segment.seqno, self.stream, segment.ledger_id, last_entry, counters["record_count"],
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
        return decode_read_records(data, self.stream, segment.seqno, segment.last_entry_id,
                                   segment.start_sequence_id)[2]  # fmt: skip

    async def _create_ledger(self) -> LedgerWriter:
        cfg = self._cfg
        return await self._ctx.ledgers.create_ledger(
            ensemble_size=cfg.ensemble_size,
            write_quorum=cfg.write_quorum,
            ack_quorum=cfg.ack_quorum,
            password=cfg.password_bytes,
            digest_type=cfg.ledger_digest,
            custom={"stream": f"{self._ctx.namespace}/{self.stream}".encode()},
        )

    async def _discard_ledger(self, ledger: LedgerWriter) -> None:
        """An allocated ledger that never became a segment: delete it, not leak it."""
        try:
            await ledger.close()
            await self._ctx.ledgers.delete_ledger(ledger.ledger_id)
        except BooklineError as exc:
            log.warning("could not delete unused ledger %d: %s", ledger.ledger_id, exc)

    # -- properties ------------------------------------------------------------------

    @property
    def last_txid(self) -> int:
        return self._last_txid

    @property
    def identity(self) -> str:
        return self._lock.identity

    @property
    def segment_seqno(self) -> int:
        return self._seg.meta.seqno if self._seg is not None else 0

    @property
    def failed(self) -> BooklineError | None:
        return self._error

    # -- writing ---------------------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise _chained(self._error)
        if self._closed:
            raise ClosedError(f"writer of {self.stream} was closed")
        if self._ended or self._ending:
            raise EndOfStreamError(f"stream {self.stream} was marked ended")

    def _txid_for(self, txid: int | None, now_ms: int) -> int:
        if txid is None:
            return max(now_ms, self._last_txid)
        if txid < self._last_txid:
            raise BadRequestError(
                f"txid {txid} is below the stream's last txid {self._last_txid} "
                "(txids must not decrease)"
            )
        return txid

    def write_nowait(self, record: LogRecord) -> asyncio.Future[DLSN]:
        """Buffer ``record``; the future resolves to its DLSN once durable. Order is
        kept across write_nowait/write/write_many calls."""
        self._check()
        if record.key is None and record.headers is None:
            user = len(record.payload)
        else:
            user = record_bytes(record.payload, record.key, record.headers)
        if user > RECORD_BYTES_MAX:
            raise TooLargeError(f"record of {user} bytes; at most {RECORD_BYTES_MAX}")
        size = user + RECORD_OVERHEAD_BYTES
        if self._pending_bytes + size > self._cfg.pending_bytes_max:
            raise TooManyRequestsError(f"writer of {self.stream}: too many bytes pending")
        now = self._now()
        txid = self._txid_for(record.txid, now)
        fut: asyncio.Future[DLSN] = self._loop.create_future()
        if self._b_bytes + size > self._cfg.buffer_bytes_max:
            self._cut()
        self._append_one(record, txid, now, fut, size)
        if self._b_bytes >= self._cfg.buffer_bytes_max:
            self._cut()
        else:
            self._arm_timer()
        return fut

    async def write(self, record: LogRecord) -> DLSN:
        await self._wait_room(len(record.payload) + RECORD_OVERHEAD_BYTES)
        return await self.write_nowait(record)

    def _append_one(
        self, record: LogRecord, txid: int, now: int, fut: asyncio.Future[DLSN], size: int
    ) -> None:
        index = len(self._b_payloads)
        if (record.key is not None or record.headers is not None) and self._b_keys is None:
            self._b_keys = [None] * index
            self._b_headers = [None] * index
        self._b_payloads.append(record.payload)
        self._b_txids.append(txid)
        self._b_ts.append(now)
        if self._b_keys is not None and self._b_headers is not None:
            self._b_keys.append(record.key)
            self._b_headers.append(record.headers)
        self._b_waiters.append(fut)
        self._b_bytes += size
        self._pending_bytes += size
        self._last_txid = txid

    async def write_many(self, records: Sequence[LogRecord]) -> list[DLSN]:
        """Append many records in order; resolves to their DLSNs once all are durable."""
        self._check()
        n = len(records)
        if n == 0:
            return []
        now = self._now()
        payloads = [r.payload for r in records]
        extras = any(r.key is not None or r.headers is not None for r in records)
        if extras:
            user = [record_bytes(r.payload, r.key, r.headers) for r in records]
        else:
            user = list(map(len, payloads))
        largest = max(user)
        if largest > RECORD_BYTES_MAX:
            raise TooLargeError(f"record of {largest} bytes; at most {RECORD_BYTES_MAX}")
        sizes = [u + RECORD_OVERHEAD_BYTES for u in user]
        txids = self._txids_many(records, now)
        self._last_txid = txids[-1]
        fut: asyncio.Future[list[DLSN]] = self._loop.create_future()
        batch = _Batch(fut, n)
        limit = self._cfg.buffer_bytes_max
        i = 0
        while i < n:
            await self._wait_room(sizes[i])
            self._check()
            j, used = i, self._b_bytes
            while j < n and used + sizes[j] <= limit:
                used += sizes[j]
                j += 1
            if j == i:
                if self._b_bytes:
                    self._cut()
                    continue
                # A record bigger than a whole buffer is an entry of its own.
                j, used = i + 1, sizes[i]
            self._append_many(records, payloads, txids, now, batch, i, j, extras)
            self._pending_bytes += used - self._b_bytes
            self._b_bytes = used
            if j < n or self._b_bytes >= limit:
                self._cut()
            i = j
        self._arm_timer()
        return await fut

    def _append_many(  # noqa: PLR0917
        self,
        records: Sequence[LogRecord],
        payloads: list[bytes],
        txids: list[int],
        now: int,
        batch: _Batch,
        i: int,
        j: int,
        extras: bool,
    ) -> None:
        index = len(self._b_payloads)
        if extras and self._b_keys is None:
            self._b_keys = [None] * index
            self._b_headers = [None] * index
        self._b_payloads.extend(payloads[i:j])
        self._b_txids.extend(txids[i:j])
        self._b_ts.extend([now] * (j - i))
        if self._b_keys is not None and self._b_headers is not None:
            self._b_keys.extend(r.key for r in records[i:j])
            self._b_headers.extend(r.headers for r in records[i:j])
        self._b_waiters.append((batch, j - i))

    def _txids_many(self, records: Sequence[LogRecord], now: int) -> list[int]:
        default = max(now, self._last_txid)
        txids = [default if r.txid is None else r.txid for r in records]
        if any(r.txid is not None for r in records):
            last = self._last_txid
            for t in txids:
                if t < last:
                    raise BadRequestError(f"txid {t} is below {last} (txids must not decrease)")
                last = t
            # records without a txid after ones with a larger txid take that txid
            running = self._last_txid
            for k, t in enumerate(txids):
                running = max(running, t)
                txids[k] = running
        return txids

    def _now(self) -> int:
        now = max(self._ctx.clock_ms(), self._last_ts)  # timestamps never go back
        self._last_ts = now
        return now

    async def _wait_room(self, size: int) -> None:
        while self._pending_bytes + size > self._cfg.pending_bytes_max and self._pending_bytes:
            self._check()
            self._room.clear()
            await self._room.wait()
        self._check()

    def _arm_timer(self) -> None:
        """Adaptive flush: while the pipe is nearly idle, transmit at the next loop
        iteration (records written in this one still join the entry); while entries
        are in flight, let the buffer grow for up to ``flush_interval_ms`` -- or until
        the pipe drains (:meth:`_on_entry_done` cuts then)."""
        if self._timer is None and self._b_payloads:
            if len(self._inflight) + len(self._outbox) < _IDLE_PIPE_ENTRIES:
                self._timer = self._loop.call_soon(self._on_timer)
            else:
                delay = self._cfg.flush_interval_ms / 1000.0
                self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._error is None and self._b_payloads:
            self._cut()

    def _cut(self) -> None:
        """Move the buffer into the outbox as one entry-to-be and wake the sender."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._b_payloads:
            return
        out = _Outgoing(
            self._b_payloads, self._b_txids, self._b_ts, self._b_keys, self._b_headers,
            self._b_waiters, self._b_bytes, self._loop.create_future(),
        )  # fmt: skip
        self._b_payloads, self._b_txids, self._b_ts, self._b_waiters = [], [], [], []
        self._b_keys = self._b_headers = None
        self._b_bytes = 0
        self._enqueue(out)

    def _enqueue(self, out: _Outgoing) -> None:
        self._outbox.append(out)
        self._last_out = out
        if self._sender is None:
            self._sender = self._loop.create_task(self._send_loop())

    # -- the sender ----------------------------------------------------------------------

    async def _send_loop(self) -> None:
        try:
            while self._outbox and self._error is None:
                if not self._owned.is_set():
                    await self._owned.wait()
                    continue
                seg = self._seg
                invariant(seg is not None, "sender without a segment")
                assert seg is not None
                out = self._outbox[0]
                if out.control == "control" and seg.sealing:
                    self._outbox.popleft()  # the seal tells readers the end anyway
                    if not out.done.done():
                        out.done.set_result(None)
                    continue
                if out.control == "" and self._roll_due(seg):
                    await self._roll()
                    continue
                self._outbox.popleft()
                await self._submit(seg, out)
        except BooklineError as exc:
            self._fail(exc)
        except Exception as exc:
            self._fail(WriterFailedError(f"writer of {self.stream} crashed: {exc!r}"), exc)
            raise
        finally:
            self._sender = None

    async def _submit(self, seg: _SegmentState, out: _Outgoing) -> None:
        if out.control:
            payload = encode_control(
                first_index=seg.records,
                bytes_before=seg.bytes,
                last_txid=seg.last_txid,
                timestamp_ms=self._now(),
                end_of_stream=out.control == "eos",
            )
            count, nbytes, first_txid = 1, 0, -1
        else:
            count = len(out.payloads)
            nbytes = out.nbytes - count * RECORD_OVERHEAD_BYTES
            seg_last_txid = out.txids[-1]
            payload = encode_record_set(
                out.payloads, out.txids, out.timestamps,
                first_index=seg.records, bytes_before=seg.bytes, last_txid=seg_last_txid,
                keys=out.keys, headers=out.headers, compression=self._compression,
            )  # fmt: skip
            first_txid = out.txids[0]
        ledger = seg.ledger
        self._carried_lac = ledger.last_add_confirmed
        fut = ledger.submit_nowait(payload)  # the common case: no coroutine
        if fut is None:
            fut = await ledger.submit(payload)  # at the ledger's in-flight bound: wait
        if not out.control:
            seg.records += count
            seg.bytes += nbytes
            seg.last_txid = out.txids[-1]
            if seg.first_txid < 0:
                seg.first_txid = first_txid
        seg.last_slot = count - 1
        self._inflight.append(out)
        fut.add_done_callback(functools.partial(self._on_entry_done, out, seg.meta.seqno, ledger))

    def _on_entry_done(
        self, out: _Outgoing, seqno: int, ledger: LedgerWriter, fut: asyncio.Future[int]
    ) -> None:
        head = self._inflight.popleft() if self._inflight else None
        invariant(head is out, "entries of %s completed out of order", self.stream)
        self._pending_bytes -= out.nbytes
        self._room.set()
        exc = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or exc is not None or self._error is not None:
            cause = exc if isinstance(exc, BaseException) else self._error
            err = self._error or WriterFailedError(
                f"writer of {self.stream}: entry failed: {cause!r}"
            )
            err.__cause__ = err.__cause__ or cause
            self._fail(err)
            _fail_out(out, err)
            return
        entry_id = fut.result()
        slot = 0
        for waiter in out.waiters:
            if type(waiter) is tuple:
                batch, n = waiter
                batch.dlsns.extend(
                    [_NEW_DLSN(DLSN, (seqno, entry_id, s)) for s in range(slot, slot + n)]
                )
                batch.remaining -= n
                if batch.remaining == 0 and not batch.future.done():
                    batch.future.set_result(batch.dlsns)
                slot += n
            else:
                assert isinstance(waiter, asyncio.Future)
                if not waiter.done():
                    waiter.set_result(_NEW_DLSN(DLSN, (seqno, entry_id, slot)))
                slot += 1
        invariant(slot == len(out.payloads), "waiters of an entry of %s miss records", self.stream)
        if slot:
            self.last_dlsn = DLSN(seqno, entry_id, slot - 1)
        if not out.done.done():
            out.done.set_result(None)
        if (
            self._b_payloads
            and len(self._inflight) + len(self._outbox) < _IDLE_PIPE_ENTRIES
            and self._error is None
        ):
            self._cut()  # the pipe drained: send what waited for it now
        if not out.control:
            # Tailing readers learn this LAC from the next entry, which carries it --
            # or, once nothing else is in flight or waiting to be sent, from an explicit
            # LAC. Pushed after the sender had its turn: bookies an entry reached in
            # the meantime need no WRITE_LAC (ledger.push_lac skips them). Under load
            # this saves a request and an answer per bookie and entry.
            if not (self._inflight or self._outbox or self._b_payloads):
                self._loop.call_soon(ledger.push_lac)
            self._schedule_control()

    def _schedule_control(self) -> None:
        """Fallback for bookies without explicit LAC: a control record once idle.
        One timer at a time; it re-checks when it fires, and any later completion arms
        it again, so the last completion is always followed by a check."""
        if self._control_timer is None:
            self._control_timer = self._loop.call_later(
                self._cfg.control_interval_ms / 1000.0, self._maybe_control
            )

    def _maybe_control(self) -> None:
        self._control_timer = None
        seg = self._seg
        if self._error or self._closed or self._ending or seg is None or seg.sealing:
            return
        if self._outbox or self._b_payloads or self._inflight:
            return  # a coming entry carries the LAC anyway
        ledger = seg.ledger
        lac = ledger.last_add_confirmed
        if max(self._carried_lac, ledger.lac_told) >= lac:
            return  # the newest entry or an explicit LAC already told the bookies
        if ledger.lac_sent >= lac:
            # Explicit LACs are on their way (on a busy machine their answers can take
            # longer than this timer): look again once they answered. A control record
            # now would be a whole replicated add -- a journal fsync on every bookie --
            # to say what they are about to know; at 200 records/s that was one entry
            # in seven. A push that fails leaves lac_told behind, and the next look
            # sends the control record.
            self._schedule_control()
            return
        out = _Outgoing([], [], [], None, None, [], 0, self._loop.create_future(), "control")
        out.done.add_done_callback(_consume)
        self._enqueue(out)

    def _roll_due(self, seg: _SegmentState) -> bool:
        return seg.bytes >= self._rollover_bytes or (
            seg.records > 0 and self._ctx.clock_ms() - seg.opened_ms >= self._rollover_ms
        )

    async def _seal_current(self, next_meta: SegmentMetadata | None) -> None:
        """Close the current ledger (waits for its adds) and seal the segment, opening
        ``next_meta`` in the same transaction when given."""
        seg = self._seg
        assert seg is not None
        ctx, ns = self._ctx, self._ctx.namespace
        seg.sealing = True
        if self._control_timer is not None:
            self._control_timer.cancel()
            self._control_timer = None
        await seg.ledger.close()
        if self._error is not None:
            raise _chained(self._error)
        last_entry = seg.ledger.last_add_confirmed
        invariant(last_entry == seg.ledger.last_add_pushed, "closed with entries unconfirmed")
        sealed = dataclasses.replace(
            seg.meta.sealed(
                last_txid=seg.last_txid, last_entry_id=last_entry, last_slot_id=seg.last_slot,
                record_count=seg.records, size_bytes=seg.bytes, sealed_ms=ctx.clock_ms(),
            ),
            first_txid=seg.first_txid,
        )  # fmt: skip
        async with self._meta_lock:
            _seg_now, version = await ctx.md.segments.get_segment(ns, self.stream, seg.meta.seqno)
            sealed = dataclasses.replace(
                sealed, truncation=_seg_now.truncation, min_active_dlsn=_seg_now.min_active_dlsn
            )
            max_txid, max_version = await ctx.md.streams.get_max_txid(ns, self.stream)
            self._lock.check_owner()
            await ctx.md.segments.seal_and_open(
                ns, self.stream, sealed, version, next_meta,
                max_txid=max(max_txid, sealed.last_txid), max_txid_version=max_version,
            )  # fmt: skip
        seg.meta = sealed

    async def _roll(self) -> None:
        seg = self._seg
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
        try:
            await self._seal_current(meta)
        except BaseException:
            await self._discard_ledger(ledger)
            raise
        _m, version = await self._ctx.md.segments.get_segment(
            self._ctx.namespace, self.stream, meta.seqno
        )
        self._seg = _SegmentState(meta, version, ledger, opened_ms=now)
        self._carried_lac = -1
        self._next_ledger = asyncio.ensure_future(self._create_ledger())
        log.info("%s rolled to segment %d (ledger %d)", self.stream, meta.seqno, ledger.ledger_id)

    # -- failing -----------------------------------------------------------------------

    def _on_lock_state(self, state: LockState) -> None:
        if state is LockState.OWNED:
            self._owned.set()
        elif state is LockState.SUSPENDED:
            self._owned.clear()  # hold transmits until the lock is confirmed ours
        elif state is LockState.LOST and not self._closed:
            self._fail(OwnershipLostError(f"writer of {self.stream} lost the stream's lock"))

    def _fail(self, error: BooklineError, cause: BaseException | None = None) -> None:
        if self._error is not None:
            return
        if cause is not None and error.__cause__ is None:
            error.__cause__ = cause
        self._error = error
        log.warning("writer of %s failed: %s", self.stream, error)
        for handle in (self._timer, self._control_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._control_timer = None
        self._owned.set()
        self._room.set()
        for out in list(self._inflight) + list(self._outbox):
            _fail_out(out, error)
        self._outbox.clear()
        for waiter in self._b_waiters:
            _fail_waiter(waiter, error)
        self._b_payloads, self._b_txids, self._b_ts, self._b_waiters = [], [], [], []

    # -- flush, truncate, end, close -------------------------------------------------

    async def flush(self) -> None:
        """Transmit what is buffered and wait until everything written so far is durable."""
        self._check()
        self._cut()
        out = self._last_out
        if out is not None:
            await asyncio.shield(out.done)
        self._check()

    async def truncate(self, dlsn: DLSN) -> bool:
        """Mark everything before ``dlsn`` truncated and delete the segments (and their
        ledgers) that lie wholly before it. Returns whether anything changed.

        Everything written before the call is made durable first; a point past its end
        (:meth:`durable_end`) raises OutOfRangeError and changes nothing, since such a
        point would hide records written later."""
        await self.flush()
        point = DLSN(*dlsn)
        async with self._meta_lock:
            self._lock.check_owner()
            end = self.durable_end()
            if point > end:
                raise OutOfRangeError(
                    f"truncation point {point} of {self.stream} is beyond the durable end "
                    f"{end} (the position after the last acknowledged record)"
                )
            changed = await truncate_before(self._ctx, self.stream, point, end)
        return changed

    def durable_end(self) -> DLSN:
        """The position just after the last acknowledged record: the next record goes
        at or after it. Before this writer acknowledged anything, the start of its own
        segment (every segment before it is sealed)."""
        last = self.last_dlsn
        if last is None:
            return DLSN(self.segment_seqno, 0, 0)
        return DLSN(last.segment_seqno, last.entry_id + 1, 0)

    async def mark_end_of_stream(self) -> None:
        """Write the end-of-stream marker and seal the segment; later writes raise
        EndOfStreamError and readers end with it."""
        await self.flush()
        self._check()
        # From here no write and no control record may be queued behind the marker:
        # readers and the next writer look for it in the segment's last entry.
        self._ending = True
        out = _Outgoing([], [], [], None, None, [], 0, self._loop.create_future(), "eos")
        self._enqueue(out)
        await asyncio.shield(out.done)
        self._ended = True
        await self._seal_current(None)

    async def close(self) -> None:
        """Flush, seal the segment, release the lock. Idempotent; after a failure it
        only releases what it holds (the next writer recovers the segment)."""
        if self._closed:
            return
        try:
            if self._error is None and not (self._ended or self._ending):
                try:
                    await self.flush()
                    self._closed = True
                    if self._sender is not None:
                        await self._sender
                    await self._seal_current(None)
                except BooklineError as exc:
                    log.warning("closing writer of %s: %s; next writer recovers", self.stream, exc)
        finally:
            self._closed = True
            await self._release()

    async def _release(self) -> None:
        for task in (self._retention_task, self._sender):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, BooklineError):
                    await task
        if self._next_ledger is not None:
            task_ledger, self._next_ledger = self._next_ledger, None
            try:
                await self._discard_ledger(await task_ledger)
            except BooklineError as exc:
                log.warning("pre-allocated ledger of %s failed: %s", self.stream, exc)
        for handle in (self._timer, self._control_timer):
            if handle is not None:
                handle.cancel()
        await self._lock.release()

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- retention ---------------------------------------------------------------------

    async def _retention_loop(self) -> None:
        if self._options.retention_ms is None and self._options.retention_bytes is None:
            return
        interval_s = self._cfg.retention_check_interval_ms / 1000.0
        while not self._closed and self._error is None:
            await asyncio.sleep(interval_s)
            try:
                async with self._meta_lock:
                    await apply_retention(self._ctx, self.stream, self._options, self.durable_end())
            except BooklineError as exc:
                log.warning("retention of %s failed (will retry): %s", self.stream, exc)


def _chained(error: BooklineError) -> BooklineError:
    err = type(error).__new__(type(error))
    BooklineError.__init__(err, error.message)
    err.__cause__ = error
    return err


def _fail_waiter(waiter: _Waiter, error: BooklineError) -> None:
    fut = waiter[0].future if isinstance(waiter, tuple) else waiter
    if not fut.done():
        fut.set_exception(_chained(error))
        fut.add_done_callback(_consume)


def _fail_out(out: _Outgoing, error: BooklineError) -> None:
    for waiter in out.waiters:
        _fail_waiter(waiter, error)
    if not out.done.done():
        out.done.set_exception(_chained(error))
        out.done.add_done_callback(_consume)


def _consume(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception retrieved (the caller may have stopped waiting)."""
    if not fut.cancelled():
        fut.exception()
