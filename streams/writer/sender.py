"""A writer's pipe: the record buffer, cut into entries and transmitted in order.

Cutting (adaptive flush): the buffer becomes one entry when it reaches
``buffer_bytes_max``, on flush, or -- while fewer than ``idle_pipe_entries`` (default
2) entries are in flight or queued -- at the next loop iteration; else
``flush_interval_ms`` after its first record or as soon as the pipe drains. An idle
writer sends at once, a busy one batches. A writer whose records arrive fast enough
that a hold of about one acknowledgement latency (2-4 ms) gathers at least
:data:`~streams.writer.pace.BUSY_RECORDS_PER_HOLD` of them (the
:class:`~streams.writer.pace.Pace`; 10,000 records/s does, 1,000 does not) is *busy*:
while any entry is in flight its buffer is cut by that hold alone -- fewer, fuller
entries, so fewer wake-ups per record on every bookie.

Sending: one task encodes the queued entries as record sets and submits them in order
on the current segment's ledger, rolling the segment first when it is due. Entries
complete in order and resolve their waiters to DLSNs once the ack quorum has them. The
first failed entry fails the pipe: every waiting, queued and later call raises
``WriterFailedError`` (cause chained) -- nothing is retried behind the caller's back,
so nothing can be reordered or silently dropped. While the stream's lock is in doubt
(``owned`` cleared: a suspended ZooKeeper session) nothing is transmitted.

Readers' LAC: every entry carries the LAC to its bookies, and every acknowledgement that
moves it is told to them at once: by an entry sent in the same loop turn, else by the
ledger's *explicit LAC* (``LedgerWriter.push_lac``, the bookies' WRITE_LAC op) -- also
while other entries are in flight, which were sent before it and carry an older LAC.
So a tailing reader sees a record one writer-to-bookie hop after its acknowledgement,
never waiting for a later entry or a timer. For bookies without that op, a control
record is still written when idle ``control_interval_ms`` after an acknowledged entry
that no entry or explicit LAC has told them about.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import Callable

from foundation.errors import BooklineError, WriterFailedError
from foundation.invariants import invariant
from ledger.writer import LedgerWriter
from streams.config import NamespaceConfig
from streams.dlsn import DLSN
from streams.records import CREATE_TIME, RECORD_OVERHEAD_BYTES, Compression, LogRecord
from streams.recordset import encode_control, encode_record_set
from streams.writer.buffer import RecordBuffer, consume
from streams.writer.pace import Pace
from streams.writer.segments import Segments, SegmentState

log = logging.getLogger(__name__)

__all__ = ["Sender"]


class Sender:
    """The buffer, the queue of cut entries and the entries in flight of one writer.
    ``now_ms`` is the writer's clock (record timestamps never go back)."""

    def __init__(
        self,
        stream: str,
        cfg: NamespaceConfig,
        segments: Segments,
        now_ms: Callable[[], int],
        timestamp_type: int = CREATE_TIME,
    ) -> None:
        self._stream = stream
        self._timestamp_type = timestamp_type  # the sets' (Kafka's numbering)
        self._cfg = cfg
        self._buffer_bytes_max = cfg.buffer_bytes_max
        self._compression = Compression.parse(cfg.compression)
        self._segments = segments
        self._now_ms = now_ms
        self._loop = asyncio.get_running_loop()
        self.buffer = RecordBuffer(self._loop.create_future())  # records not yet cut
        self._timer: asyncio.Handle | None = None  # the adaptive flush
        self._pace = Pace(self._loop.time())  # arrival rate vs ack latency: hold or not
        self._outbox: collections.deque[RecordBuffer] = collections.deque()  # cut, not sent
        self._inflight: collections.deque[RecordBuffer] = collections.deque()  # submitted
        self._task: asyncio.Task[None] | None = None  # the send loop, while it has work
        self.last_out: RecordBuffer | None = None  # the newest cut entry (flush waits on it)
        # Bytes accepted (buffered, queued or in flight) and not yet acknowledged; ``room``
        # is set whenever an acknowledgement lowered them.
        self.pending_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        self.owned = asyncio.Event()  # cleared while the stream's lock is in doubt
        self._control_timer: asyncio.TimerHandle | None = None
        self._control_stopped = False  # closing or ending: no control record any more
        self._carried_lac = -1  # LAC the newest submitted entry carries
        self.error: BooklineError | None = None  # the first failure, for good
        self.last_dlsn: DLSN | None = None  # of the last acknowledged user record

    # -- buffering and cutting ---------------------------------------------------------

    def add(  # noqa: PLR0917 - the hot path is called positionally
        self,
        record: LogRecord,
        txid: int,
        now: int,
        fut: asyncio.Future[DLSN],
        size: int,
        stamp: int | None = None,
    ) -> None:
        """Buffer one record of a single write (the writer validated it); ``stamp`` is
        the producer's timestamp, if it keeps one."""
        limit = self._buffer_bytes_max
        if self.buffer.nbytes + size > limit:
            self.cut()
        buf = self.buffer
        buf.append_one(record, txid, now, fut, size, stamp)
        self.pending_bytes += size
        if buf.nbytes >= limit:
            self.cut()
        elif self._timer is None:
            self.arm_timer()

    def arm_timer(self) -> None:
        """Adaptive flush: while the pipe is nearly idle, transmit at the next loop
        iteration (records written in this one still join the entry); while entries
        are in flight, let the buffer grow for up to ``flush_interval_ms`` -- or until
        the pipe drains (:meth:`_on_entry_done` cuts then)."""
        if self._timer is None and self.buffer.payloads:
            pipe = len(self._inflight) + len(self._outbox)
            floor_s = self._cfg.flush_interval_ms / 1000.0
            if pipe and self._pace.busy(floor_s):
                self._timer = self._loop.call_later(self._pace.hold_s(floor_s), self._on_timer)
            elif pipe < self._cfg.idle_pipe_entries:
                self._timer = self._loop.call_soon(self._on_timer)
            else:
                self._timer = self._loop.call_later(floor_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.error is None and self.buffer.payloads:
            self.cut()

    def cut(self) -> None:
        """Move the buffer into the outbox as one entry-to-be and wake the sender."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.buffer.payloads:
            return
        out = self.buffer
        self.buffer = RecordBuffer(self._loop.create_future())
        self._pace.on_cut(len(out.payloads), self._loop.time())
        self._enqueue(out)

    def enqueue_marker(self, kind: str) -> RecordBuffer:
        """Queue a control record (``"control"``) or the end-of-stream marker (``"eos"``)."""
        out = RecordBuffer(self._loop.create_future(), kind)
        self._enqueue(out)
        return out

    def _enqueue(self, out: RecordBuffer) -> None:
        self._outbox.append(out)
        self.last_out = out
        if self._task is None and not self._submit_now():
            self._task = self._loop.create_task(self._send_loop())

    # -- sending -----------------------------------------------------------------------

    async def _send_loop(self) -> None:
        try:
            while self._outbox and self.error is None:
                if not self.owned.is_set():
                    await self.owned.wait()
                    continue
                seg = self._segments.current
                invariant(seg is not None, "sender without a segment")
                assert seg is not None
                out = self._outbox[0]
                if out.control == "control" and seg.sealing:
                    self._outbox.popleft()  # the seal tells readers the end anyway
                    if not out.done.done():
                        out.done.set_result(None)
                    continue
                if out.control == "" and self._segments.roll_due(seg):
                    self._cancel_control_timer()
                    await self._segments.roll()
                    self._carried_lac = -1
                    continue
                self._outbox.popleft()
                await self._submit(seg, out)
        except BooklineError as exc:
            self.fail(exc)
        except Exception as exc:
            self._crashed(exc)
            raise
        finally:
            self._task = None

    def _crashed(self, exc: Exception) -> None:
        """A bug in a send step fails the writer (every waiter learns it), as a
        Bookline error would; the caller re-raises it."""
        self.fail(WriterFailedError(f"writer of {self._stream} crashed: {exc!r}"), exc)

    def _submit_now(self) -> bool:
        """The send loop's step for its common case -- one entry of records queued, the
        segment open and not due to roll, the ledger with room -- taken at once,
        without starting the loop's task (a loop turn before every entry: issue 25).
        False when the loop is needed."""
        if len(self._outbox) != 1 or self.error is not None or not self.owned.is_set():
            return False
        seg = self._segments.current
        out = self._outbox[0]
        if seg is None or out.control or self._segments.roll_due(seg):
            return False
        ledger = seg.ledger
        if not ledger.has_room():
            return False
        try:
            fut = ledger.submit_nowait(self._encode(seg, out))
            invariant(fut is not None, "ledger of %s refused an entry with room", self._stream)
            assert fut is not None
        except BooklineError as exc:
            self.fail(exc)
            return True
        except Exception as exc:  # as in the send loop: the writer fails, not just this call
            self._crashed(exc)
            raise
        self._outbox.popleft()
        self._sent(seg, out, fut)
        return True

    async def _submit(self, seg: SegmentState, out: RecordBuffer) -> None:
        payload = self._encode(seg, out)
        fut = seg.ledger.submit_nowait(payload)  # the common case: no coroutine
        if fut is None:
            fut = await seg.ledger.submit(payload)  # at the ledger's in-flight bound: wait
        self._sent(seg, out, fut)

    def _encode(self, seg: SegmentState, out: RecordBuffer) -> bytes:
        """The entry's payload (its records as a record set, or a control record)."""
        if out.control:
            payload = encode_control(
                first_index=seg.records,
                bytes_before=seg.bytes,
                last_txid=seg.last_txid,
                timestamp_ms=self._now_ms(),
                end_of_stream=out.control == "eos",
            )
        else:
            payload = encode_record_set(
                out.payloads, out.txids, out.timestamps,
                first_index=seg.records, bytes_before=seg.bytes, last_txid=out.txids[-1],
                appended_ms=out.appended_ms,
                keys=out.keys, headers=out.headers, markers=out.markers, tags=out.tags,
                compression=self._compression, timestamp_type=self._timestamp_type,
            )  # fmt: skip
            out.first_offset = seg.meta.start_sequence_id + seg.records
        self._carried_lac = seg.ledger.last_add_confirmed
        return payload

    def _sent(self, seg: SegmentState, out: RecordBuffer, fut: asyncio.Future[int]) -> None:
        """The entry was submitted as ``fut``: count it in the segment, await its ack."""
        if not out.control:
            count = len(out.payloads)
            seg.records += count
            seg.bytes += out.nbytes - count * RECORD_OVERHEAD_BYTES
            seg.last_txid = out.txids[-1]
            if seg.first_txid < 0:
                seg.first_txid = out.txids[0]
            seg.last_slot = count - 1
        else:
            seg.last_slot = 0
        out.sent_at = self._loop.time()
        self._inflight.append(out)
        done = functools.partial(self._on_entry_done, out, seg.meta.seqno, seg.ledger)
        fut.add_done_callback(done)

    def _on_entry_done(
        self, out: RecordBuffer, seqno: int, ledger: LedgerWriter, fut: asyncio.Future[int]
    ) -> None:
        head = self._inflight.popleft() if self._inflight else None
        invariant(head is out, "entries of %s completed out of order", self._stream)
        self.pending_bytes -= out.nbytes
        self.room.set()
        exc = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or exc is not None or self.error is not None:
            cause = exc if isinstance(exc, BaseException) else self.error
            err = self.error or WriterFailedError(
                f"writer of {self._stream}: entry failed: {cause!r}"
            )
            err.__cause__ = err.__cause__ or cause
            self.fail(err)
            out.fail(err)
            return
        entry_id = fut.result()
        self._pace.on_ack(self._loop.time() - out.sent_at)
        if not out.control:
            # Tailing readers learn this LAC now: from an entry sent in this loop turn
            # (the sender goes first; ledger.push_lac skips the bookies it reached), else
            # from an explicit LAC. Entries already in flight carry an older LAC, and
            # waiting for the next entry cost a tail up to an arrival gap or a busy
            # writer's hold (issue 26). At most one push per bookie is in flight, so
            # under load they coalesce to about one per acknowledgement round. Scheduled
            # before the writers' waiters are resolved, so the push leaves before their
            # answers (issue 25: an answer first woke the producer, which took the core
            # from the proxy before the readers were told).
            self._loop.call_soon(ledger.push_lac)
            self._schedule_control()
        slots = out.resolve(seqno, entry_id)
        invariant(
            slots == len(out.payloads), "waiters of an entry of %s miss records", self._stream
        )
        if slots:
            self.last_dlsn = DLSN(seqno, entry_id, slots - 1)
        if not out.done.done():
            out.done.set_result(None)
        if self.buffer.payloads and self.error is None and self._drained():
            self.cut()  # the pipe drained: send what waited for it now

    def _drained(self) -> bool:
        """Few enough entries in flight or queued to send the buffer now: fewer than
        ``idle_pipe_entries`` -- unless the writer is busy, whose hold timer cuts it
        (an entry per drained pipe would be as small as before)."""
        pipe = len(self._inflight) + len(self._outbox)
        floor_s = self._cfg.flush_interval_ms / 1000.0
        return not self._pace.busy(floor_s) and pipe < self._cfg.idle_pipe_entries

    # -- control records ---------------------------------------------------------------

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
        seg = self._segments.current
        if self.error or self._control_stopped or seg is None or seg.sealing:
            return
        if self._outbox or self.buffer.payloads or self._inflight:
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
        self.enqueue_marker("control").done.add_done_callback(consume)

    def stop_control(self) -> None:
        """The writer is closing or ending: no control record may follow (readers and
        the next writer look for the end-of-stream marker in the last entry)."""
        self._control_stopped = True
        self._cancel_control_timer()

    def _cancel_control_timer(self) -> None:
        if self._control_timer is not None:
            self._control_timer.cancel()
            self._control_timer = None

    # -- failing and stopping ----------------------------------------------------------

    def fail(self, error: BooklineError, cause: BaseException | None = None) -> None:
        """Fail the pipe for good: every buffered, queued and in-flight record raises."""
        if self.error is not None:
            return
        if cause is not None and error.__cause__ is None:
            error.__cause__ = cause
        self.error = error
        log.warning("writer of %s failed: %s", self._stream, error)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._cancel_control_timer()
        self.owned.set()
        self.room.set()
        for out in list(self._inflight) + list(self._outbox):
            out.fail(error)
        self._outbox.clear()
        self.buffer.fail(error)
        self.buffer = RecordBuffer(self._loop.create_future())

    async def drain(self) -> None:
        """Wait until the send loop has submitted everything queued."""
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        """Cancel the send loop and the timers (the writer is released)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, BooklineError):
                await self._task
        if self._timer is not None:
            self._timer.cancel()
        self._cancel_control_timer()
