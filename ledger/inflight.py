"""A writer's entries from push to their last replica's answer: ids, in-order
completion and backpressure (no I/O: the writer sends and feeds the answers in).

An entry is *pushed* (id = last pushed + 1, packaged with the current LAC and the
cumulative length), *confirmed* once Qa bookies acknowledged it and every earlier entry
is confirmed (LAC = its id, its future resolves), and *done* once every bookie it was
sent to answered.

Backpressure counts *sends*, not just unconfirmed entries: a confirmed entry still
holds its room until its last Qw - Qa replicas answered (or their bookie was replaced).
Without that, a bookie a little slower than the other two -- typically a replacement
catching up after an ensemble change -- collects an unbounded queue in the client,
every add to it waits there longer than the add timeout, and the writer replaces a
healthy bookie.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from foundation.errors import BooklineError, fresh
from foundation.invariants import invariant
from ledger.digest import DigestManager
from metadata.ledger_metadata import NO_ENTRY

__all__ = ["InFlight", "PendingAdd"]


class PendingAdd:
    """One pushed entry until every send of it was answered."""

    __slots__ = ("acked", "data", "entry_id", "future", "length", "payload_bytes", "waiting")

    def __init__(
        self,
        entry_id: int,
        data: bytes,
        length: int,
        payload_bytes: int,
        future: asyncio.Future[int],
    ) -> None:
        self.entry_id = entry_id
        self.data = data  # packaged bytes: resent as is after an ensemble change
        self.length = length
        self.payload_bytes = payload_bytes
        self.future = future
        self.acked: set[int] = set()  # ensemble positions that acknowledged
        self.waiting: set[str] = set()  # bookies with a send of this entry unanswered


class InFlight:
    """The entries of one writer that are pushed and not done."""

    def __init__(
        self, ledger_id: int, digest: DigestManager, *, adds_max: int, bytes_max: int
    ) -> None:
        self._ledger_id = ledger_id
        self._digest = digest
        self._adds_max = adds_max
        self._bytes_max = bytes_max
        self.last_pushed = NO_ENTRY
        self._pushed_length = 0
        self.lac = NO_ENTRY  # the last confirmed entry
        self.length = 0  # payload bytes of the confirmed entries
        self.pending: collections.deque[PendingAdd] = collections.deque()  # unconfirmed
        self._pending_bytes = 0
        # Confirmed entries with sends still unanswered: they keep their room (see top).
        self.lagging: dict[int, PendingAdd] = {}
        self._lagging_bytes = 0
        # Set when room may have freed up (or the writer failed or closed).
        self.room = asyncio.Event()
        self.room.set()

    def has_room(self) -> bool:
        return (
            len(self.pending) + len(self.lagging) < self._adds_max
            and self._pending_bytes + self._lagging_bytes < self._bytes_max
        )

    def push(self, payload: bytes, future: asyncio.Future[int]) -> PendingAdd:
        """The next entry, packaged (room was checked)."""
        entry_id = self.last_pushed + 1
        self.last_pushed = entry_id
        self._pushed_length += len(payload)
        data = self._digest.package(entry_id, self.lac, self._pushed_length, payload)
        pa = PendingAdd(entry_id, data, self._pushed_length, len(payload), future)
        self.pending.append(pa)
        self._pending_bytes += len(payload)
        return pa

    def answered(self, pa: PendingAdd, bookie: str) -> None:
        """One send of ``pa`` answered (or no longer awaited): release its room when it
        was the last one of a confirmed entry."""
        pa.waiting.discard(bookie)
        if not pa.waiting and self.lagging.pop(pa.entry_id, None) is not None:
            self._lagging_bytes -= pa.payload_bytes
            self.room.set()

    def confirm(self, ack_quorum: int) -> None:
        """Confirm, in order, the first entries with ``ack_quorum`` acks."""
        completed = False
        pending = self.pending
        while pending and len(pending[0].acked) >= ack_quorum:
            pa = pending.popleft()
            invariant(
                pa.entry_id == self.lac + 1,
                "ledger %d: completing entry %d after LAC %d",
                self._ledger_id,
                pa.entry_id,
                self.lac,
            )
            self.lac = pa.entry_id
            self.length = pa.length
            self._pending_bytes -= pa.payload_bytes
            if pa.waiting:
                self.lagging[pa.entry_id] = pa
                self._lagging_bytes += pa.payload_bytes
            invariant(
                self.lac <= self.last_pushed,
                "LAC %d beyond last pushed %d",
                self.lac,
                self.last_pushed,
            )
            if not pa.future.done():
                pa.future.set_result(pa.entry_id)
            completed = True
        if completed:
            self.room.set()

    def fail(self, exc: BooklineError) -> None:
        """Every unconfirmed entry fails with (a copy of) ``exc``; nothing waits any more."""
        pending, self.pending = self.pending, collections.deque()
        self._pending_bytes = 0
        self.lagging.clear()
        self._lagging_bytes = 0
        for pa in pending:
            if not pa.future.done():
                pa.future.set_exception(fresh(exc))
        self.room.set()

    async def drain(self, timeout_s: float, stopped: Callable[[], bool]) -> None:
        """Wait until every confirmed entry was answered by all the bookies it was sent
        to, at most ``timeout_s`` (or until ``stopped()``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.lagging and not stopped():
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                break
            self.room.clear()  # answered() sets it when a lagging entry is done
            try:
                async with asyncio.timeout(remaining_s):
                    await self.room.wait()
            except TimeoutError:
                break
