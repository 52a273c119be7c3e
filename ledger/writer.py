"""The single writer of a ledger: pipelined quorum adds, in-order acknowledgement,
ensemble changes, close.

Life of an add (entry ``e``)::

    submit(payload) --(room? backpressure)--> package(e, LAC, length) --> send to the
    write set (e + k) mod E, k < Qw --> each bookie ack sets a bit --> Qa bits AND every
    earlier entry completed --> LAC = e, the caller's future resolves.

Backpressure counts *sends*, not just unconfirmed entries: an entry confirmed by Qa
bookies still holds its room until its last Qw - Qa replicas answered (or their bookie
was replaced). Without that, a bookie a little slower than the other two -- typically a
replacement catching up after an ensemble change -- collects an unbounded queue in the
client, every add to it waits there longer than the add timeout, and the writer replaces
a healthy bookie. TOO_MANY_REQUESTS from a bookie is retried (within the add timeout)
rather than treated as a failure, and so is a timeout on a bookie that acknowledged
adds sent after the one that timed out (it is alive; that one request or answer was
lost) -- a bookie silent since the send is replaced.

A bookie that fails or times out is replaced by an *ensemble change*: completions
pause, a new segment starting at LAC + 1 (every entry before it completed, so it is
where metadata already says) is compare-and-set into the ledger metadata, and only then
is every unacknowledged entry re-sent to the new bookie and its old ack bit cleared --
so the metadata always names the bookies an entry really lives on. A FENCED (or
UNAUTHORIZED) answer means another client recovered the ledger: the writer fails stop,
every pending and later add raises.

Close waits for the pending adds, then -- bounded by ``close_replication_timeout_ms`` --
for the replicas of confirmed entries that have not answered yet, so a ledger closed on
healthy bookies has every entry on all Qw bookies of its write set (BookKeeper only
promises Qa). A replica that fails or is still silent at the deadline is logged once
and left to autorecovery; acknowledgements never wait for this.

Cost per entry (the hot path): one digest, one future for the caller (with
``submit_nowait`` no coroutine either), and per replica one frame queued on the bookie
connection with a callback (``add_callback``: no task, coroutine, timer or future per
replica add; the connection sweeps deadlines).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable

from foundation.errors import (
    BadVersionError,
    BooklineError,
    FencedError,
    LedgerClosedError,
    MetadataError,
    NotEnoughBookiesError,
    SessionSuspendedError,
    TimeoutError_,
    TooLargeError,
    TooManyRequestsError,
    UnauthorizedError,
    WriterFailedError,
)
from foundation.invariants import invariant
from ledger.config import LedgerConfig
from ledger.digest import DigestManager, master_key
from ledger.interfaces import BookieTransport, MetadataStore
from ledger.placement import BookieHealth, choose_replacement, write_set
from metadata.ledger_metadata import NO_ENTRY, LedgerMetadata, LedgerState

log = logging.getLogger(__name__)

__all__ = ["LedgerWriter"]

# Pause between ensemble-change attempts that found no replacement (bookies may return).
_CHANGE_BACKOFF_S = 0.2
# First pause before re-sending an add a bookie refused with TOO_MANY_REQUESTS (grows
# with the time spent refused, capped below); the add timeout bounds the retries.
_BUSY_BACKOFF_FIRST_S = 0.005
_BUSY_BACKOFF_MAX_S = 0.2
# An add that timed out on a bookie which acknowledged other adds sent after it is
# re-sent rather than replacing a live bookie -- for at most this many add timeouts in
# total; a bookie silent since the send is replaced at once.
_TIMEOUT_RETRY_BUDGET = 3


class _PendingAdd:
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


class _AddDone:
    """The callback of one send: ``writer._on_add_done`` with the send's context. One
    object per replica add (a partial costs three: itself, its arguments, the bound
    method), which the garbage collector sees about 50k times a second."""

    __slots__ = ("bookie", "first_sent", "pa", "pos", "started", "writer")

    def __init__(  # noqa: PLR0917 - one send's whole context
        self,
        writer: LedgerWriter,
        pa: _PendingAdd,
        pos: int,
        bookie: str,
        started: float,
        first_sent: float,
    ) -> None:
        self.writer = writer
        self.pa = pa
        self.pos = pos
        self.bookie = bookie
        self.started = started
        self.first_sent = first_sent

    def __call__(self, exc: BaseException | None) -> None:
        self.writer._on_add_done(self.pa, self.pos, self.bookie, self.started, self.first_sent, exc)


def _copy_error(exc: BooklineError) -> BooklineError:
    """A fresh instance per waiter, chained to the original (tracebacks stay short)."""
    err = type(exc).__new__(type(exc))
    BooklineError.__init__(err, exc.message)
    for attr in ("owner", "original_code"):
        if hasattr(exc, attr):
            setattr(err, attr, getattr(exc, attr))
    err.__cause__ = exc
    return err


class LedgerWriter:
    """Handle of a ledger this client created and writes. Use from one event loop."""

    def __init__(
        self,
        meta: LedgerMetadata,
        version: int,
        *,
        store: MetadataStore,
        transport: BookieTransport,
        config: LedgerConfig,
        health: BookieHealth,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        invariant(meta.state is LedgerState.OPEN, "writer on a %s ledger", meta.state.value)
        self._meta = meta
        self._version = version
        self._store = store
        self._transport = transport
        self._config = config
        self._health = health
        self._rng = rng
        self._clock = clock
        # The loop of the first add, cached: asyncio.get_running_loop() costs a getpid()
        # system call per entry on Python 3.11.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._digest = DigestManager(meta.ledger_id, meta.digest_type, meta.password)
        self._master_key = master_key(meta.password)
        self._add_timeout_s = config.add_timeout_ms / 1000.0
        # Write set of entry e is _write_sets[e % E] (quorums never change).
        self._write_sets = [
            write_set(i, meta.ensemble_size, meta.write_quorum) for i in range(meta.ensemble_size)
        ]
        self._last_pushed = NO_ENTRY
        self._pushed_length = 0
        self._lac = NO_ENTRY
        self._length = 0
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._pending_bytes = 0
        # Confirmed entries with sends still unanswered: they keep their room (see top).
        self._lagging: dict[int, _PendingAdd] = {}
        self._lagging_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._failed_bookies: set[str] = set()
        # Clock time each bookie last acknowledged an add of this writer, and when that
        # add was sent: tells a stalled bookie from one that lost a single request.
        self._last_ack_sent: dict[str, float] = {}
        self._retry_warned: set[str] = set()
        self.timeout_retries = 0
        self._changing = False
        self._change_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self._error: BooklineError | None = None
        self._closed = False
        # close() stopped waiting for replicas: later failures are only debug-logged.
        self._drain_over = False
        self.ensemble_changes = 0
        # Explicit LAC (push_lac): per bookie, the LAC it acknowledged, the LAC of the
        # push in flight, and bookies too old to serve the op.
        self._lac_told: dict[str, int] = {}
        self._lac_pushing: dict[str, int] = {}
        self._no_explicit_lac: set[str] = set()

    # -- public --------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._meta.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._meta

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def last_add_pushed(self) -> int:
        return self._last_pushed

    @property
    def length(self) -> int:
        """Payload bytes of the confirmed entries."""
        return self._length

    @property
    def error(self) -> BooklineError | None:
        return self._error

    @property
    def lac_told(self) -> int:
        """The LAC every bookie of the current ensemble acknowledged by explicit LAC
        (NO_ENTRY when one of them has not, or cannot)."""
        told = self._lac_told
        return min(told.get(b, NO_ENTRY) for b in self._meta.last_segment.bookies)

    @property
    def lac_sent(self) -> int:
        """:attr:`lac_told`, counting pushes still in flight as told: what every bookie
        of the current ensemble will know once they answer (NO_ENTRY when one of them
        was not sent one, or cannot take it)."""
        told, pushing = self._lac_told, self._lac_pushing
        return min(
            max(told.get(b, NO_ENTRY), pushing.get(b, NO_ENTRY))
            for b in self._meta.last_segment.bookies
        )

    def push_lac(self) -> None:
        """Explicit LAC: send the current LAC to every bookie of the current ensemble
        now, instead of waiting for a later entry to carry it, so tailing readers see
        an entry about one add round trip after it was confirmed. At most one push per
        bookie is in flight; a push that returns to a LAC that moved on sends again, so
        under load the pushes coalesce. Bookies without the op are skipped (their LAC
        still rides on entries). Failures are only logged: a LAC is a hint, and the
        adds report fencing and dead bookies."""
        if self._error is not None or self._lac == NO_ENTRY:
            return
        lac = self._lac
        for bookie in self._meta.last_segment.bookies:
            if (
                bookie in self._lac_pushing
                or bookie in self._no_explicit_lac
                or bookie in self._failed_bookies
                or self._lac_told.get(bookie, NO_ENTRY) >= lac
            ):
                continue
            self._lac_pushing[bookie] = lac
            task = asyncio.ensure_future(self._push_lac_to(bookie, lac))
            self._tasks.add(task)
            task.add_done_callback(self._lac_push_done)

    def _lac_push_done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _push_lac_to handles operating errors: this is a bug, but a LAC is a hint.
            log.error("ledger %d: explicit LAC push raised %r", self.ledger_id, exc)

    async def _push_lac_to(self, bookie: str, lac: int) -> None:
        try:
            served = await self._transport.write_lac(
                bookie, self.ledger_id, lac, self._master_key, timeout_s=self._add_timeout_s
            )
        except BooklineError as exc:
            log.debug(
                "ledger %d: explicit LAC %d to %s failed: %s", self.ledger_id, lac, bookie, exc
            )
            return
        finally:
            self._lac_pushing.pop(bookie, None)
        if not served:
            self._no_explicit_lac.add(bookie)
            return
        if lac > self._lac_told.get(bookie, NO_ENTRY):
            self._lac_told[bookie] = lac
        if self._lac > lac:
            self.push_lac()

    async def add_entry(self, payload: bytes) -> int:
        """Append ``payload``; return its entry id once it is durably replicated."""
        return await (await self.submit(payload))

    async def submit(self, payload: bytes) -> asyncio.Future[int]:
        """Send ``payload`` now (waiting only for room) and return a future of its entry id.

        Futures resolve in entry-id order. Awaiting ``submit`` for many entries and then
        the futures pipelines the adds.
        """
        self._check_size(payload)
        while True:
            self._check_writable()
            if self._has_room():
                return self._push(payload)
            self._room.clear()
            await self._room.wait()

    def submit_nowait(self, payload: bytes) -> asyncio.Future[int] | None:
        """:meth:`submit` without the coroutine, for hot loops: send ``payload`` now and
        return a future of its entry id, or None -- nothing sent -- when the in-flight
        limits are reached (then await :meth:`wait_for_room` or :meth:`submit`). None
        rather than an exception: in a saturated pipeline that is the common answer.
        Raises like :meth:`submit` when the writer failed or was closed."""
        self._check_size(payload)
        self._check_writable()
        if not self._has_room():
            return None
        return self._push(payload)

    async def wait_for_room(self) -> None:
        """Return once :meth:`submit_nowait` would accept an entry (or raise when the
        writer failed or was closed)."""
        while True:
            self._check_writable()
            if self._has_room():
                return
            self._room.clear()
            await self._room.wait()

    def _check_size(self, payload: bytes) -> None:
        if len(payload) > self._config.entry_bytes_max:
            raise TooLargeError(
                f"entry of {len(payload)} bytes exceeds {self._config.entry_bytes_max}"
            )

    def _has_room(self) -> bool:
        return (
            len(self._pending) + len(self._lagging) < self._config.adds_in_flight_max
            and self._pending_bytes + self._lagging_bytes < self._config.add_bytes_in_flight_max
        )

    def _push(self, payload: bytes) -> asyncio.Future[int]:
        """Package and send one entry (room was checked)."""
        entry_id = self._last_pushed + 1
        self._last_pushed = entry_id
        self._pushed_length += len(payload)
        data = self._digest.package(entry_id, self._lac, self._pushed_length, payload)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        pa = _PendingAdd(entry_id, data, self._pushed_length, len(payload), fut)
        self._pending.append(pa)
        self._pending_bytes += len(payload)
        meta = self._meta
        ensemble = meta.last_segment.bookies
        started = self._clock()
        failed = self._failed_bookies
        for pos in self._write_sets[entry_id % meta.ensemble_size]:
            bookie = ensemble[pos]
            if not failed or bookie not in failed:
                self._send(pa, pos, bookie, started, started)
            # else: the ensemble change re-sends to the replacement
        return fut

    async def close(self) -> None:
        """Wait for pending adds and (bounded by ``close_replication_timeout_ms``) for
        their remaining replicas, then record CLOSED with the last entry id and length.

        A writer that was fenced or failed closes locally only (the recoverer owns the
        ledger's final state)."""
        if self._closed:
            return
        self._closed = True
        self._room.set()
        if self._pending:
            await asyncio.gather(*(pa.future for pa in list(self._pending)), return_exceptions=True)
        if self._change_task is not None and not self._change_task.done():
            await asyncio.gather(self._change_task, return_exceptions=True)
        if self._error is None:
            await self._drain_replicas()
        if self._error is not None:
            self._cancel_tasks()
            return
        await self._write_closed()
        self._cancel_tasks()

    async def _drain_replicas(self) -> None:
        """Wait until every confirmed entry was answered by all Qw bookies of its write
        set, at most ``close_replication_timeout_ms``: a closed ledger is then fully
        replicated when the bookies are healthy, without autorecovery. Past the deadline
        the stragglers are logged once and abandoned -- the entries are durable on Qa
        bookies (BookKeeper's guarantee) and the auditor finds the gaps."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.close_replication_timeout_ms / 1000.0
        while self._lagging and self._error is None:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                break
            self._room.clear()  # _send_done sets it when a lagging entry completes
            try:
                async with asyncio.timeout(remaining_s):
                    await self._room.wait()
            except TimeoutError:
                break
        self._drain_over = True
        if self._lagging and self._error is None:
            bookies = sorted({b for pa in self._lagging.values() for b in pa.waiting})
            log.warning(
                "ledger %d: closing with %d entries (first %d) not yet answered by %s after "
                "%d ms; they are on at least Qa=%d bookies, autorecovery re-replicates them",
                self.ledger_id,
                len(self._lagging),
                min(self._lagging),
                bookies,
                self._config.close_replication_timeout_ms,
                self._meta.ack_quorum,
            )

    # -- sending and acks ----------------------------------------------------------

    def _check_writable(self) -> None:
        if self._error is not None:
            raise _copy_error(self._error)
        if self._closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} was closed by this writer")

    def _send(
        self,
        pa: _PendingAdd,
        pos: int,
        bookie: str,
        started: float | None = None,
        first_sent: float | None = None,
    ) -> None:
        """One add of ``pa`` to ``bookie``: a future with a callback, no task or timer
        of its own (the connection sweeps deadlines)."""
        if started is None:
            started = self._clock()
        if first_sent is None:
            first_sent = started
        pa.waiting.add(bookie)
        lac = self._lac
        if lac > self._lac_told.get(bookie, NO_ENTRY):
            # Bookies take the LAC an add carries as an explicit LAC on receipt: no
            # WRITE_LAC needed for it (push_lac skips bookies already told).
            self._lac_told[bookie] = lac
        task = self._transport.add_callback(
            bookie,
            self.ledger_id,
            pa.entry_id,
            lac,
            self._master_key,
            pa.data,
            _AddDone(self, pa, pos, bookie, started, first_sent),
            recovery=False,
            timeout_s=self._add_timeout_s,
        )
        if task is not None:  # the slow path (connecting, no room): cancel on fail
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _on_add_done(  # noqa: PLR0917 - one send's whole context
        self,
        pa: _PendingAdd,
        pos: int,
        bookie: str,
        started: float,
        first_sent: float,
        exc: BaseException | None,
    ) -> None:
        if exc is None:
            self._health.record_success(bookie, self._clock() - started)
            if started > self._last_ack_sent.get(bookie, -1.0):
                self._last_ack_sent[bookie] = started
            self._send_done(pa, bookie)
            self._on_ack(pa, pos, bookie)
            return
        if isinstance(exc, TooManyRequestsError) and self._retry_busy(pa, pos, bookie, first_sent):
            return
        if isinstance(exc, TimeoutError_) and self._retry_lost(
            pa, pos, bookie, started, first_sent
        ):
            return
        self._send_done(pa, bookie)
        if isinstance(exc, FencedError | UnauthorizedError):
            log.warning(
                "ledger %d: bookie %s answered %s; writer stops", self.ledger_id, bookie, exc.name
            )
            self._fail(exc)
        elif isinstance(exc, BooklineError):
            if (
                self._is_current(bookie)
                and bookie not in self._failed_bookies
                and not self._drain_over
            ):
                # Once per failure: later answers find it failed or already replaced.
                log.warning(
                    "ledger %d entry %d: bookie %s failed: %s",
                    self.ledger_id,
                    pa.entry_id,
                    bookie,
                    exc,
                )
            else:
                log.debug(
                    "ledger %d entry %d: late failure of replaced bookie %s: %s",
                    self.ledger_id,
                    pa.entry_id,
                    bookie,
                    exc,
                )
            self._health.record_failure(bookie)
            self._bookie_failed(bookie)
        else:
            # Not an operating error: a bug. Fail stop instead of guessing.
            err = WriterFailedError(f"ledger {self.ledger_id}: add to {bookie} raised {exc!r}")
            err.__cause__ = exc
            self._fail(err)

    def _is_current(self, bookie: str) -> bool:
        return self._error is None and bookie in self._meta.last_segment.bookies

    def _retry_busy(self, pa: _PendingAdd, pos: int, bookie: str, first_sent: float) -> bool:
        """Re-send an add the bookie refused as busy, after a backoff; False once the add
        timeout since the first send is spent (then it counts as a failure)."""
        elapsed_s = self._clock() - first_sent
        if elapsed_s >= self._config.add_timeout_ms / 1000.0:
            return False
        if not self._is_current(bookie):
            self._send_done(pa, bookie)
            return True  # replaced meanwhile, or the writer failed: nothing to retry
        # Grows with the time already spent refused, so a busy bookie is polled gently.
        delay_s = min(_BUSY_BACKOFF_FIRST_S + elapsed_s / 4, _BUSY_BACKOFF_MAX_S)
        log.debug(
            "ledger %d entry %d: %s busy, retry in %.3fs", self.ledger_id, pa.entry_id, bookie,
            delay_s,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        loop.call_later(delay_s, self._resend_busy, pa, pos, bookie, first_sent)
        return True

    def _retry_lost(
        self, pa: _PendingAdd, pos: int, bookie: str, started: float, first_sent: float
    ) -> bool:
        """Re-send an add that timed out on a bookie that since acknowledged a later add;
        False when the bookie was silent since or the retry budget is spent."""
        if not self._is_current(bookie) or bookie in self._failed_bookies:
            return False
        if self._last_ack_sent.get(bookie, -1.0) <= started:
            return False  # nothing sent after this one was answered: stalled
        budget_s = _TIMEOUT_RETRY_BUDGET * self._config.add_timeout_ms / 1000.0
        if self._clock() - first_sent >= budget_s:
            return False
        self.timeout_retries += 1
        level = logging.DEBUG if bookie in self._retry_warned else logging.WARNING
        self._retry_warned.add(bookie)
        log.log(
            level,
            "ledger %d entry %d: bookie %s did not answer in time but acknowledged later "
            "adds; re-sending instead of replacing it (logged once per bookie)",
            self.ledger_id,
            pa.entry_id,
            bookie,
        )
        self._send(pa, pos, bookie, None, first_sent)
        return True

    def _resend_busy(self, pa: _PendingAdd, pos: int, bookie: str, first_sent: float) -> None:
        if self._is_current(bookie) and self._meta.last_segment.bookies[pos] == bookie:
            self._send(pa, pos, bookie, None, first_sent)
        else:
            self._send_done(pa, bookie)

    def _send_done(self, pa: _PendingAdd, bookie: str) -> None:
        """One send of ``pa`` answered (or no longer awaited): release its room when it
        was the last one of a confirmed entry."""
        pa.waiting.discard(bookie)
        if not pa.waiting and self._lagging.pop(pa.entry_id, None) is not None:
            self._lagging_bytes -= pa.payload_bytes
            self._room.set()

    def _on_ack(self, pa: _PendingAdd, pos: int, bookie: str) -> None:
        if pa.future.done() or self._error is not None:
            return
        # Only an ack from the bookie metadata names for this position counts.
        if self._meta.last_segment.bookies[pos] != bookie or bookie in self._failed_bookies:
            return
        pa.acked.add(pos)
        if len(pa.acked) >= self._meta.ack_quorum:
            self._complete_in_order()

    def _complete_in_order(self) -> None:
        if self._changing or self._error is not None:
            return  # completions wait while an ensemble change is in flight
        qa = self._meta.ack_quorum
        completed = False
        while self._pending and len(self._pending[0].acked) >= qa:
            pa = self._pending.popleft()
            invariant(
                pa.entry_id == self._lac + 1,
                "ledger %d: completing entry %d after LAC %d",
                self.ledger_id,
                pa.entry_id,
                self._lac,
            )
            self._lac = pa.entry_id
            self._length = pa.length
            self._pending_bytes -= pa.payload_bytes
            if pa.waiting:
                self._lagging[pa.entry_id] = pa
                self._lagging_bytes += pa.payload_bytes
            invariant(
                self._lac <= self._last_pushed,
                "LAC %d beyond last pushed %d",
                self._lac,
                self._last_pushed,
            )
            if not pa.future.done():
                pa.future.set_result(pa.entry_id)
            completed = True
        if completed:
            self._room.set()

    def _fail(self, exc: BooklineError) -> None:
        if self._error is not None:
            return
        self._error = exc
        pending, self._pending = self._pending, collections.deque()
        self._pending_bytes = 0
        self._lagging.clear()
        self._lagging_bytes = 0
        for pa in pending:
            if not pa.future.done():
                pa.future.set_exception(_copy_error(exc))
        self._room.set()
        self._cancel_tasks()

    def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()

    # -- ensemble change -----------------------------------------------------------

    def _bookie_failed(self, bookie: str) -> None:
        if self._error is not None or bookie not in self._meta.last_segment.bookies:
            return  # already replaced (a late answer from the old ensemble)
        self._failed_bookies.add(bookie)
        if self._closed and not self._pending:
            # Only the close drain waits on this bookie: every entry is confirmed, so
            # there is nothing to re-send and the segment needs no change.
            return
        if not self._changing:
            self._changing = True
            self._change_task = asyncio.ensure_future(self._ensemble_change_loop())
            self._change_task.add_done_callback(self._on_change_done)

    def _on_change_done(self, task: asyncio.Future[None]) -> None:
        """Operating errors end the loop through _fail; anything else is a bug: fail
        stop with it (which also retrieves it)."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            err = WriterFailedError(f"ledger {self.ledger_id}: ensemble change raised {exc!r}")
            err.__cause__ = exc
            self._fail(err)

    async def _ensemble_change_loop(self) -> None:
        attempts = 0
        try:
            while self._failed_bookies and self._error is None:
                failed = set(self._failed_bookies)
                try:
                    await self._change_ensemble(failed)
                except (NotEnoughBookiesError, MetadataError, SessionSuspendedError) as exc:
                    attempts += 1
                    if attempts > self._config.ensemble_change_retries_max:
                        self._fail(exc)
                        return
                    log.warning(
                        "ledger %d: ensemble change attempt %d failed: %s",
                        self.ledger_id,
                        attempts,
                        exc,
                    )
                    await asyncio.sleep(_CHANGE_BACKOFF_S * attempts)
                    continue
                except BooklineError as exc:
                    self._fail(exc)
                    return
                self._failed_bookies -= failed
                self.ensemble_changes += 1
        finally:
            self._changing = False
        self._complete_in_order()

    async def _change_ensemble(self, failed: set[str]) -> None:
        meta, version = self._meta, self._version
        old = meta.last_segment.bookies
        for _attempt in range(self._config.metadata_cas_retries_max):
            if meta.state is not LedgerState.OPEN:
                raise FencedError(
                    f"ledger {self.ledger_id} is {meta.state.value}: recovered by another client"
                )
            candidates = await self._store.writable_bookies()
            racks = {c.bookie_id: c.rack for c in candidates}
            avoid = self._health.avoided() | failed
            ensemble = list(meta.last_segment.bookies)
            for pos, bookie in enumerate(ensemble):
                if bookie in failed:
                    ensemble[pos] = choose_replacement(
                        [c for c in candidates if c.bookie_id not in failed],
                        ensemble,
                        pos,
                        meta.write_quorum,
                        avoid=avoid,
                        racks=racks,
                        rng=self._rng,
                    )
            start = self._lac + 1
            new = meta.with_segment(start, ensemble)
            try:
                new_version = await self._store.write(new, version)
            except BadVersionError:
                meta, version = await self._store.read(self.ledger_id)
                if meta.state is LedgerState.OPEN and meta.segments != self._meta.segments:
                    raise WriterFailedError(
                        f"ledger {self.ledger_id}: ensembles changed under the writer"
                    ) from None
                continue
            self._apply_new_ensemble(new, new_version, old)
            return
        raise MetadataError(
            f"ledger {self.ledger_id}: ensemble change lost the CAS "
            f"{self._config.metadata_cas_retries_max} times"
        )

    def _apply_new_ensemble(self, new: LedgerMetadata, version: int, old: tuple[str, ...]) -> None:
        invariant(
            not self._pending or self._pending[0].entry_id >= new.last_segment.first_entry_id,
            "ledger %d: unacknowledged entry before the new segment",
            self.ledger_id,
        )
        self._meta, self._version = new, version
        now = new.last_segment.bookies
        log.info(
            "ledger %d: ensemble from entry %d is now %s (was %s)",
            self.ledger_id,
            new.last_segment.first_entry_id,
            list(now),
            list(old),
        )
        replaced = {old[pos] for pos in range(len(old)) if now[pos] != old[pos]}
        for lagging in list(self._lagging.values()):
            for bookie in replaced & lagging.waiting:
                self._send_done(lagging, bookie)  # its answer no longer matters
        for pa in self._pending:
            pa.waiting -= replaced
            for pos in write_set(pa.entry_id, new.ensemble_size, new.write_quorum):
                if now[pos] != old[pos]:
                    pa.acked.discard(pos)
                    self._send(pa, pos, now[pos])

    # -- close ---------------------------------------------------------------------

    async def _write_closed(self) -> None:
        meta, version = self._meta, self._version
        for _attempt in range(self._config.metadata_cas_retries_max):
            closed = meta.closed(self._lac, self._length)
            try:
                self._version = await self._store.write(closed, version)
                self._meta = closed
                return
            except BadVersionError:
                meta, version = await self._store.read(self.ledger_id)
            if meta.state is LedgerState.CLOSED:
                if meta.last_entry_id == self._lac:
                    self._meta, self._version = meta, version
                    return  # a recoverer closed it where we would have
                raise FencedError(
                    f"ledger {self.ledger_id} was closed by another client at "
                    f"entry {meta.last_entry_id}, writer had {self._lac}"
                )
            if meta.state is LedgerState.IN_RECOVERY:
                raise FencedError(f"ledger {self.ledger_id} is being recovered by another client")
        raise MetadataError(f"ledger {self.ledger_id}: close lost the CAS repeatedly")

    async def __aenter__(self) -> LedgerWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
