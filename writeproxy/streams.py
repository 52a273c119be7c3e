"""Stream ownership and the write path of one write proxy.

Owning a stream takes two things, in this order:

1. the **owner record** ``owners/<ns>/<stream>`` (ephemeral, this proxy's session):
   what other proxies read to redirect clients here;
2. the stream's **writer lock**, by opening the core library's writer, which also
   recovers and seals the previous owner's last segment (fencing it) and starts a new
   segment.

Then the de-duplication table is rebuilt from the stream's tail (:mod:`writeproxy.dedup`).
A stream whose writer fails (lost lock, bookies gone) is dropped: the writer is
closed, the record released, and the next request acquires it again from scratch, so
the table is always rebuilt from what the log really holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BooklineError,
    LockOwnedError,
    NotFoundError,
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    OwnerMovedError,
    OwnershipLostError,
    TooLargeError,
    TooManyRequestsError,
    UnavailableError,
)
from httpapi.wire import WriteRequest
from streams.dlsn import DLSN
from streams.records import LogRecord
from writeproxy import dedup
from writeproxy.config import WriteProxyConfig

if TYPE_CHECKING:
    from metadata.client import MetadataClient
    from streams.namespace import Namespace
    from streams.writer import LogWriter

log = logging.getLogger(__name__)

# Entries read per request while scanning a stream's tail on takeover.
SCAN_ENTRIES_PER_READ = 64
# Streams being acquired at once (each costs ZooKeeper round trips and a recovery).
ACQUIRES_CONCURRENT_MAX = 32


# A producer's position: (epoch, sequence). Every sequence of a later epoch comes after
# every sequence of an earlier one (the later epoch fences the earlier).
Pos = tuple[int, int]


@dataclass
class _Pending:
    epoch: int
    first_seq: int
    end_seq: int  # exclusive
    done: asyncio.Event = field(default_factory=asyncio.Event)


class OwnedStream:
    """A stream this proxy owns: its writer and its producers' table."""

    def __init__(
        self,
        name: str,
        writer: LogWriter,
        table: dedup.DedupTable,
        reorder_wait_s: float = 1.0,
    ) -> None:
        self.name = name
        self.writer = writer
        self.table = table
        self.failed: BaseException | None = None
        self._pending: dict[str, list[_Pending]] = {}
        # Per producer: the position after the last batch handed to the writer (also
        # while it is in flight), so the next request may follow at once (pipelining).
        self._next_pos: dict[str, Pos] = {}
        self._seq_moved = asyncio.Event()
        self._reorder_wait_s = reorder_wait_s
        # Set by abort(): requests stop waiting for the writer's answer.
        self._aborted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acquired_at = time.monotonic()

    def abort(self, error: BooklineError) -> None:
        """Stop serving now (shutdown): waiting requests are refused with ``error`` (or
        OUTCOME_UNKNOWN for what was handed over), writes in flight are answered
        OUTCOME_UNKNOWN at once instead of whenever the writer answers -- with its
        bookies down, that may be never."""
        if self.failed is None:
            self.failed = error  # not a writer failure: the caller logs the shutdown once
        if not self._aborted.done():
            self._aborted.set_result(None)
        self._seq_moved.set()

    async def write(self, req: WriteRequest) -> tuple[list[DLSN], int]:
        """Write ``req``'s new records; answer every record's DLSN and the count of
        records that were retries (not written again)."""
        if req.producer is None or req.seq is None:
            return await self._append(_log_records(req, 0), None, 0, 0), 0
        producer, epoch, seq, count = req.producer, req.epoch, req.seq, req.count
        fenced_by = await self._wait_turn(producer, epoch, seq, seq + count)
        if fenced_by is None:
            plan = self.table.plan(producer, epoch, seq, count)
        else:
            plan = self.table.plan_fenced(producer, epoch, seq, count, fenced_by)
        new = _log_records(req, plan.write_from)
        if not new:
            return [DLSN(*d) for d in plan.duplicates], len(plan.duplicates)
        pending = _Pending(epoch, plan.first_new_seq, seq + count)
        self._pending.setdefault(producer, []).append(pending)
        # From here to the writer's append nothing suspends, so a request woken by this
        # runs after the batch is in the writer: the stream keeps the producer's order.
        self._next_pos[producer] = max(self._next_pos.get(producer, (0, 0)), (epoch, seq + count))
        self._seq_moved.set()
        self._seq_moved = asyncio.Event()
        try:
            dlsns = await self._append(new, producer, epoch, plan.first_new_seq)
            self.table.record(producer, epoch, plan.first_new_seq, dlsns)
        finally:
            pending.done.set()
            waiting = self._pending[producer]
            waiting.remove(pending)
            if not waiting:
                del self._pending[producer]
                state = self.table.state(producer)
                if state is not None and self._next_pos.get(producer) == (
                    state.epoch,
                    state.last_seq + 1,
                ):
                    # Nothing in flight and the table says the same: forget it here, so
                    # this map stays as small as the producers in flight. (A range of a
                    # refused batch is kept: later requests must not wait for it.)
                    del self._next_pos[producer]
        return [DLSN(*d) for d in plan.duplicates] + dlsns, len(plan.duplicates)

    def _expected(self, producer: str) -> Pos | None:
        """The producer's next position, or None for a producer not seen yet."""
        state = self.table.state(producer)
        known = self._next_pos.get(producer)
        if state is None:
            return known
        written = (state.epoch, state.last_seq + 1)
        return written if known is None else max(written, known)

    def _refuse_failed(self, producer: str, pos: Pos, expected: Pos | None) -> None:
        """The writer failed: the table may miss batches it was handed, so nothing is
        answered from it any more. A request at or below what was handed over may be
        in the log (outcome unknown); one above it was never written. Both retriable:
        the retry re-acquires the stream and reads the truth back from the log."""
        if expected is not None and pos < expected:
            raise OutcomeUnknownError(
                f"producer {producer} epoch {pos[0]} sequence {pos[1]}: the writer of "
                f"{self.name} failed after it was handed over; retry to learn its position"
            ) from self.failed
        raise self._not_written()

    def _not_written(self) -> BooklineError:
        """The error for a request refused by a failed stream before reaching its writer."""
        if isinstance(self.failed, UnavailableError):
            return UnavailableError(f"{self.failed.message}; {self.name} was not written")
        error = OwnershipLostError(f"writer of {self.name} failed; retry")
        error.__cause__ = self.failed
        return error

    def _reorder_timeout(self, producer: str, pos: Pos, expected: Pos | None) -> None:
        """The gap before ``pos`` did not fill in time."""
        if expected is None:
            # Not seen since this proxy took the stream over and not in the log's
            # recent tail: its history was forgotten; go on from here.
            log.info(
                "%s: producer %s starts at epoch %d sequence %d here", self.name, producer, *pos
            )
            return
        raise OutOfOrderSequenceError(
            f"producer {producer} sent epoch {pos[0]} sequence {pos[1]} to {self.name} but "
            f"epoch {expected[0]} sequence {expected[1]} has not arrived; resend in order"
        )

    async def _wait_turn(self, producer: str, epoch: int, seq: int, end: int) -> int | None:
        """Wait until the request may be planned; returns the producer's newer epoch
        when the request's epoch is fenced by it (then it is only answered from the
        table), else None. A retry racing its original waits until the original is
        answered. Pipelined requests of one producer travel over several connections
        and may arrive out of order: a request ahead of the next expected position
        waits (a bounded time) for the ones before it, so the stream keeps the
        producer's order. A producer not seen yet, and a new epoch, start at sequence
        0. Everything is checked again after every wait."""
        deadline = time.monotonic() + self._reorder_wait_s
        pos = (epoch, seq)
        while True:
            busy = [p for p in self._pending.get(producer, ()) if p.epoch == epoch
                    and p.first_seq < end and seq < p.end_seq]  # fmt: skip
            if busy:
                await busy[0].done.wait()
                continue
            expected = self._expected(producer)
            if self.failed is not None:
                self._refuse_failed(producer, pos, expected)
            if expected is None:
                if seq == 0:
                    return None
            elif epoch < expected[0]:
                return expected[0]
            elif pos == expected or (epoch > expected[0] and seq == 0):
                return None  # next in order, or the first of a new epoch (fencing older)
            elif pos < expected:
                state = self.table.state(producer)
                if state is not None and state.epoch == epoch and seq <= state.last_seq:
                    return None  # a retry of something written: planned as a duplicate
                # Below the handed-over frontier, above what was written, and not in
                # flight: a batch that reached the writer either completed (recorded
                # above) or failed it (then ``failed`` is set, handled above), so this
                # sequence was never handed to the writer -- definitely not written.
                raise BadRequestError(
                    f"producer {producer} sent sequence {seq} to {self.name} after later "
                    f"sequences (up to {expected[1] - 1}) were handed to the writer: it "
                    "was not written, and arrived too late for the producer's order to "
                    "be kept"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._reorder_timeout(producer, pos, expected)
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._seq_moved.wait(), remaining)

    async def _append(
        self, batch: list[LogRecord], producer: str | None, epoch: int, first_seq: int
    ) -> list[DLSN]:
        if self.failed is not None:
            raise self._not_written()
        if producer is not None:
            marker = dedup.marker_headers(producer, epoch, first_seq, len(batch))
            first = batch[0]
            first.headers = {**first.headers, **marker} if first.headers else marker
        # The admission limits keep this stream's pending bytes under the writer's
        # bound, so write_many appends the whole batch in its first step, before it
        # suspends: the batch is contiguous in the stream, which the dedup markers rely
        # on. It runs as a task so that abort() can answer this request without the
        # writer; tasks take their first step in the order they are created, and a
        # producer's next request creates its task only after passing _wait_turn,
        # which is after this one: the stream keeps the producer's order.
        write = asyncio.ensure_future(self.writer.write_many(batch))
        try:
            await asyncio.wait((write, self._aborted), return_when=asyncio.FIRST_COMPLETED)
        except BaseException as exc:  # cancelled: the batch's outcome is not learned
            write.add_done_callback(_retrieve)
            self._fail(exc)
            raise
        if not write.done():
            write.add_done_callback(_retrieve)
            raise OutcomeUnknownError(
                f"{self.name} stopped before its writer answered: the records may or may "
                "not be in the log; retry with the same producer sequence"
            ) from self.failed
        try:
            return write.result()
        except (BadRequestError, TooLargeError):
            raise  # refused before anything was appended: the request's fault
        except BooklineError as exc:
            # Handed to the writer and not answered: some of the batch may be durable.
            # The table no longer matches the log, so the stream is dropped; the retry
            # re-acquires it and learns the outcome from the log.
            self._fail(exc)
            raise OutcomeUnknownError(
                f"writer of {self.name} failed before answering: the records may or "
                "may not be in the log; retry with the same producer sequence"
            ) from exc

    def _fail(self, exc: BaseException) -> None:
        if self.failed is None:
            log.warning("stream %s: writer failed (%s); dropping ownership", self.name, exc)
            self.failed = exc


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Done callback of a write nobody awaits any more (the stream was aborted or the
    request cancelled): its outcome is read back from the log by the next owner."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned write ended with %s", task.exception())


def _log_records(req: WriteRequest, start: int) -> list[LogRecord]:
    """The request's records from ``start`` on, as the writer takes them (straight from
    the payload list for a plain ``payloads`` body)."""
    if req.payloads is not None:
        return list(map(LogRecord, req.payloads[start:]))
    return [LogRecord(r.payload, r.txid, r.key, r.headers) for r in req.records[start:]]


class Ownership:
    """The streams this proxy owns, acquiring and dropping them."""

    def __init__(
        self,
        config: WriteProxyConfig,
        ns: Namespace,
        md: MetadataClient,
        address: str,
        *,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.ns = ns
        self.md = md
        self.address = address
        self.owned: dict[str, OwnedStream] = {}
        self._acquiring: dict[str, asyncio.Future[OwnedStream]] = {}
        self._acquire_slots = asyncio.Semaphore(ACQUIRES_CONCURRENT_MAX)
        self._on_change = on_change or (lambda: None)
        self._closing = False
        self._drops: set[asyncio.Task[None]] = set()
        self.acquisitions = 0
        self.takeover_scan_records = 0

    @property
    def identity(self) -> str:
        return f"{self.config.proxy_id}@{self.address}"

    async def get(self, name: str) -> OwnedStream:
        """The owned stream, acquiring it when nobody owns it; OwnerMovedError if
        another proxy does."""
        stream = self.owned.get(name)
        if stream is not None and stream.failed is None:
            return stream
        if stream is not None:
            await self.drop(name)
        pending = self._acquiring.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        if self._closing:
            # Retriable: the client retries, and reaches the stream's next owner.
            raise UnavailableError("write proxy is shutting down; retry")
        if len(self.owned) >= self.config.streams_owned_max:
            raise TooManyRequestsError(
                f"this proxy owns {len(self.owned)} streams, its limit; try another proxy"
            )
        fut: asyncio.Future[OwnedStream] = asyncio.get_running_loop().create_future()
        self._acquiring[name] = fut
        try:
            async with self._acquire_slots:
                owned = await asyncio.wait_for(
                    self._acquire(name), self.config.acquire_timeout_ms / 1000
                )
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: concurrent waiters re-raise it themselves
            raise
        else:
            fut.set_result(owned)
            return owned
        finally:
            del self._acquiring[name]

    async def owner_of(self, name: str) -> str | None:
        """Address of the proxy owning ``name`` (ours included), or None."""
        if name in self.owned:
            return self.address
        record = await self.md.proxies.get_owner(self.config.namespace, name)
        return None if record is None else record.address

    async def _acquire(self, name: str) -> OwnedStream:
        ns_name = self.config.namespace
        record = await self.md.proxies.get_owner(ns_name, name)
        if record is not None and record.session_id != self.md.zk.session_id:
            if record.address == self.address:
                # An earlier process of this proxy (restarted within its session's
                # timeout) still holds it: not a redirect to ourselves; retry shortly.
                raise OwnershipLostError(
                    f"{name} is held by a previous session of this proxy until it expires"
                )
            raise OwnerMovedError(f"{name} is owned by {record.address}", owner=record.address)
        if not await self.ns.exists(name):
            if not self.config.auto_create_streams:
                raise NotFoundError(f"stream {name} does not exist")
            with contextlib.suppress(AlreadyExistsError):  # created concurrently: fine
                await self.ns.create_stream(name)
        try:
            await self.md.proxies.claim_owner(ns_name, name, self.config.proxy_id, self.address)
        except LockOwnedError as exc:
            raise OwnerMovedError(f"{name} is owned by {exc.owner}", owner=exc.owner) from exc
        try:
            writer = await self.ns.open_writer(name, identity=self.identity)
        except LockOwnedError as exc:
            await self._release_record(name)
            # Someone holds the lock without an owner record: a crashed proxy whose
            # session has not expired yet, or a direct core writer. Retriable.
            raise OwnershipLostError(
                f"{name}: writer lock held by {exc.owner}; retry shortly"
            ) from exc
        except BaseException:
            await self._release_record(name)
            raise
        try:
            table = await self._rebuild_table(name)
        except BaseException:
            await _close_writer(writer, name)
            await self._release_record(name)
            raise
        owned = OwnedStream(name, writer, table, self.config.reorder_wait_ms / 1000.0)
        self.owned[name] = owned
        self.acquisitions += 1
        self._on_change()
        log.info("acquired stream %s (%d producers remembered)", name, len(table))
        return owned

    async def _rebuild_table(self, name: str) -> dedup.DedupTable:
        cfg = self.config
        table = dedup.DedupTable(cfg.dedup_batches_per_producer, cfg.dedup_producers_max)
        records = await self._scan_tail(name)
        self.takeover_scan_records += len(records)
        dedup.rebuild(table, records)
        return table

    async def _scan_tail(self, name: str) -> list[Any]:
        """The stream's most recent records (oldest first) within the dedup window."""
        cfg = self.config
        horizon_ms = int(time.time() * 1000) - cfg.dedup_window_ms
        chunks: list[list[Any]] = []
        total = 0
        for seg in reversed(await self.ns.segments(name)):
            if seg.truncated or seg.last_entry_id is None or seg.last_entry_id < 0:
                continue
            last = seg.last_entry_id
            while last >= 0:
                first = max(0, last - SCAN_ENTRIES_PER_READ + 1)
                recs = await self.ns.read_entries(name, seg.seqno, first, last)
                chunks.append(list(recs))
                total += len(recs)
                if total >= cfg.dedup_scan_records_max or (
                    recs and recs[0].timestamp_ms < horizon_ms
                ):
                    return [r for chunk in reversed(chunks) for r in chunk]
                last = first - 1
        return [r for chunk in reversed(chunks) for r in chunk]

    async def _release_record(self, name: str) -> None:
        try:
            await self.md.proxies.release_owner(self.config.namespace, name)
        except BooklineError as exc:  # the session may be gone; then so is the record
            log.warning("stream %s: could not release owner record: %s", name, exc)

    async def drop(self, name: str) -> None:
        """Stop owning ``name``: close its writer, release the record."""
        owned = self.owned.pop(name, None)
        if owned is None:
            return
        await _close_writer(owned.writer, name)
        await self._release_record(name)
        self._on_change()
        log.info("released stream %s", name)

    def drop_soon(self, name: str) -> None:
        task = asyncio.get_running_loop().create_task(self.drop(name))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    def drop_all_soon(self) -> None:
        """The session that held our records is gone: so is every stream."""
        for name in list(self.owned):
            self.owned[name].failed = self.owned[name].failed or OwnershipLostError("session lost")
            self.drop_soon(name)

    def abort_all(self) -> None:
        """Shutting down: new acquisitions are refused, and every owned stream answers
        its waiting and in-flight requests now (:meth:`OwnedStream.abort`)."""
        self._closing = True
        if self.owned:
            log.info("shutting down: answering the requests of %d streams", len(self.owned))
        for stream in self.owned.values():
            stream.abort(UnavailableError("write proxy is shutting down"))

    async def close(self, writers_timeout_s: float) -> None:
        """Stop owning everything (shutdown): owner records are released first (quick),
        then the writers are closed concurrently for at most ``writers_timeout_s`` -- a
        writer whose bookies are down never finishes; the caller then closes the
        ZooKeeper session, which releases its lock, and the next owner recovers."""
        self.abort_all()
        streams = list(self.owned.items())
        self.owned.clear()
        await asyncio.gather(*(self._release_record(name) for name, _s in streams))
        closes = [asyncio.ensure_future(_close_writer(s.writer, name)) for name, s in streams]
        closes.extend(self._drops)
        if not closes:
            return
        done, pending = await asyncio.wait(closes, timeout=writers_timeout_s)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("closing a writer failed", exc_info=task.exception())
        if pending:
            log.warning(
                "%d writers not closed within %.1f s (bookies down?); their locks "
                "go with the ZooKeeper session",
                len(pending),
                writers_timeout_s,
            )
            for task in pending:
                task.cancel()


async def _close_writer(writer: LogWriter, name: str) -> None:
    try:
        await writer.close()
    except BooklineError as exc:  # a failed writer may fail to close; the lock still goes
        log.warning("stream %s: closing its writer: %s", name, exc)
