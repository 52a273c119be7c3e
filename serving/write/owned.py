"""The write path of one stream this process owns (:class:`OwnedStream`).

A batch's records go to the stream's core writer (:class:`streams.writer.LogWriter`)
in its producer's order: pipelined requests of one producer may arrive out of order
and wait (``reorder_wait_ms``) for the ones before them; retries are answered from the
de-duplication table (:mod:`serving.write.dedup`) and only what is missing is written; the
first record of each producer batch carries the producer marker (in the record set's
framing, not a header) a new owner rebuilds the table from. A writer failure fails the
stream (:mod:`serving.write.ownership` drops it): what was handed to the writer is
answered OUTCOME_UNKNOWN, never a definite failure, and the retry learns the truth
from the log through the next owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from foundation.errors import (
    BadRequestError,
    BooklineError,
    OutcomeUnknownError,
    OwnershipLostError,
    TooLargeError,
    UnavailableError,
)
from serving.write import dedup
from serving.write.batch import WriteBatch, WriteResult
from streams.dlsn import DLSN
from streams.records import RecordColumns

if TYPE_CHECKING:
    from streams.writer import LogWriter

log = logging.getLogger(__name__)

__all__ = ["OwnedStream"]


Pos = dedup.Pos


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

    async def write(self, batch: WriteBatch) -> WriteResult:
        """Write ``batch``'s new records; answer every record's DLSN and offset (sequence
        id in the stream) and the count of records that were retries (not written
        again: answered with their original positions)."""
        if batch.producer is None:
            _handed(batch)  # _append hands it over before it first suspends
            dlsns, offsets = await self._append(batch.columns(0), None, 0, 0)
            return WriteResult(dlsns, offsets, 0)
        producer, epoch, seq = batch.producer.producer, batch.producer.epoch, batch.producer.seq
        count = batch.count
        strict = batch.producer.strict
        fenced_by = await self._wait_turn(producer, epoch, seq, seq + count, strict)
        if fenced_by is None:
            plan = self.table.plan(producer, epoch, seq, count)
        else:
            plan = self.table.plan_fenced(producer, epoch, seq, count, fenced_by)
        new = batch.columns(plan.write_from)
        if not new:
            answered = [DLSN(*d) for d in plan.duplicates]
            return WriteResult(answered, plan.offsets, len(answered))
        pending = _Pending(epoch, plan.first_new_seq, seq + count)
        self._pending.setdefault(producer, []).append(pending)
        # From here to the writer's append nothing suspends, so a request woken by this
        # runs after the batch is in the writer: the stream keeps the producer's order.
        self._next_pos[producer] = max(self._next_pos.get(producer, (0, 0)), (epoch, seq + count))
        self._seq_moved.set()
        self._seq_moved = asyncio.Event()
        _handed(batch)
        try:
            dlsns, offsets = await self._append(new, producer, epoch, plan.first_new_seq)
            self.table.record(producer, epoch, plan.first_new_seq, dlsns, offsets)
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
        dups = plan.duplicates
        if not dups:  # the writer's answer as it is (a DLSNSequence: no DLSN per record)
            return WriteResult(dlsns, offsets, 0)
        return WriteResult([*(DLSN(*d) for d in dups), *dlsns], plan.offsets + offsets, len(dups))

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

    def _reorder_timeout(self, producer: str, pos: Pos, expected: Pos | None, strict: bool) -> None:
        """The gap before ``pos`` did not fill in time: refused, or (a thin-client
        producer not seen since this proxy took the stream over and not in the log's
        recent tail: its history was forgotten) go on from here."""
        refusal = dedup.ahead_refusal(
            producer, self.name, pos, expected, strict=strict, complete=self.table.complete
        )
        if refusal is not None:
            raise refusal
        log.info("%s: producer %s starts at epoch %d sequence %d here", self.name, producer, *pos)

    async def _wait_turn(
        self, producer: str, epoch: int, seq: int, end: int, strict: bool
    ) -> int | None:
        """Wait until the request may be planned; returns the producer's newer epoch
        when the request's epoch is fenced by it (then it is only answered from the
        table), else None. A retry racing its original waits until the original is
        answered. Pipelined requests of one producer travel over several connections
        and may arrive out of order: a request ahead of the next expected position
        waits (a bounded time) for the ones before it, so the stream keeps the
        producer's order. A producer not seen yet, and a new epoch, start at sequence
        0; what else does not fill its gap in time is refused (:func:`dedup.ahead_refusal`).
        Everything is checked again after every wait."""
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
                self._reorder_timeout(producer, pos, expected, strict)
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._seq_moved.wait(), remaining)

    async def _append(
        self, batch: RecordColumns, producer: str | None, epoch: int, first_seq: int
    ) -> tuple[Sequence[DLSN], list[int]]:
        if self.failed is not None:
            raise self._not_written()
        if producer is not None:
            batch = dedup.marked(batch, producer, epoch, first_seq)
        # The admission limits keep this stream's pending bytes under the writer's
        # bound, so append_many_offsets buffers the whole batch at once, before it
        # suspends: the batch is contiguous in the stream, which the dedup markers rely
        # on, and a producer's next request, woken by the hand-over, runs after it (the
        # stream keeps the producer's order). Called in this task, not a task of its
        # own: that took a loop turn to start and two more to answer (issue 25).
        written: asyncio.Future[tuple[Sequence[DLSN], list[int]]] | None = None
        try:
            written = await self.writer.append_many_offsets(batch)
            if not written.done():
                # abort() answers this request without the writer (shutdown).
                await asyncio.wait((written, self._aborted), return_when=asyncio.FIRST_COMPLETED)
        except (BadRequestError, TooLargeError):
            raise  # refused before anything was appended: the request's fault
        except BooklineError as exc:
            raise self._failed_write(exc) from exc
        except BaseException as exc:  # cancelled: the batch's outcome is not learned
            if written is not None:
                written.add_done_callback(_retrieve)
            self._fail(exc)
            raise
        if not written.done():
            written.add_done_callback(_retrieve)
            raise OutcomeUnknownError(
                f"{self.name} stopped before its writer answered: the records may or may "
                "not be in the log; retry with the same producer sequence"
            ) from self.failed
        try:
            return written.result()
        except BooklineError as exc:
            raise self._failed_write(exc) from exc

    def _failed_write(self, exc: BooklineError) -> OutcomeUnknownError:
        """Handed to the writer and not answered: some of the batch may be durable.
        The table no longer matches the log, so the stream is dropped; the retry
        re-acquires it and learns the outcome from the log."""
        self._fail(exc)
        return OutcomeUnknownError(
            f"writer of {self.name} failed before answering: the records may or "
            "may not be in the log; retry with the same producer sequence"
        )

    def _fail(self, exc: BaseException) -> None:
        if self.failed is None:
            log.warning("stream %s: writer failed (%s); dropping ownership", self.name, exc)
            self.failed = exc


def _handed(batch: WriteBatch) -> None:
    """Tell the front end the batch took its place in the stream (what runs on that
    call runs after this request's append started: the stream keeps the order)."""
    if batch.on_handed is not None:
        batch.on_handed()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Done callback of a write nobody awaits any more (the stream was aborted or the
    request cancelled): its outcome is read back from the log by the next owner."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned write ended with %s", task.exception())
