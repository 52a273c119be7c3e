"""The single writer of a ledger: pipelined quorum adds, in-order acknowledgement,
ensemble changes, close.

Life of an add (entry ``e``)::

    submit(payload) --(room? backpressure)--> package(e, LAC, length) --> send to the
    write set (e + k) mod E, k < Qw --> each bookie ack sets a bit --> Qa bits AND every
    earlier entry completed --> LAC = e, the caller's future resolves.

The entries in flight, their order and the backpressure on sends are
:mod:`ledger.inflight`'s. TOO_MANY_REQUESTS from a bookie is retried (within the add
timeout) rather than treated as a failure, and so is a timeout on a bookie that
acknowledged adds sent after the one that timed out (:mod:`ledger.add_retry`) -- a
bookie silent since the send is replaced.

A bookie that fails or times out is replaced by an *ensemble change*: completions
pause, a new segment starting at LAC + 1 is compare-and-set into the ledger metadata
(:mod:`ledger.ensemble_change`), and only then is every unacknowledged entry re-sent to
the new bookie and its old ack bit cleared -- so the metadata always names the bookies
an entry really lives on. A FENCED (or UNAUTHORIZED) answer means another client
recovered the ledger: the writer fails stop, every pending and later add raises.

How a failed bookie is replaced -- at once, or *delayed* while the others still make
the ack quorum (``delay_ensemble_change``) -- is :mod:`ledger.writer_changes`'s.

Close waits for the pending adds, then -- bounded by ``close_replication_timeout_ms`` --
for the replicas of confirmed entries that have not answered yet, so a ledger closed on
healthy bookies has every entry on all Qw bookies of its write set (BookKeeper only
promises Qa). A replica that fails or is still silent at the deadline is logged once
and left to autorecovery; acknowledgements never wait for this. CLOSED is recorded by
:mod:`ledger.close`; explicit LAC pushes are :mod:`ledger.lac_push`'s.

Cost per entry (the hot path): one digest, one future for the caller (with
``submit_nowait`` no coroutine either), and per replica one frame queued on the bookie
connection with a callback (the bookie's :class:`~ledger.interfaces.EntryAdder`
``add_callback``: no task, coroutine, timer or future per replica add; the connection
sweeps deadlines).
"""

from __future__ import annotations

import asyncio
import logging

from foundation.errors import (
    BooklineError,
    FencedError,
    LedgerClosedError,
    TimeoutError_,
    TooLargeError,
    TooManyRequestsError,
    UnauthorizedError,
    WriterFailedError,
    fresh,
)
from foundation.invariants import invariant
from foundation.quorum import write_set
from ledger.add_retry import AddRetry
from ledger.close import record_closed
from ledger.env import LedgerEnv
from ledger.inflight import InFlight, PendingAdd
from ledger.interfaces import EntryAdder
from ledger.keys import ledger_access
from ledger.lac_push import LacPusher
from ledger.writer_changes import EnsembleChanges
from metadata.ledger_metadata import NO_ENTRY, LedgerMetadata, LedgerState

log = logging.getLogger(__name__)

__all__ = ["LedgerWriter"]


class _Send:
    """One send of an entry to a bookie, and its answer's callback (``writer._answered``
    with this context). One object per replica add (a partial costs three: itself, its
    arguments, the bound method), which the garbage collector sees about 50k times a
    second."""

    __slots__ = ("bookie", "first_sent", "pa", "pos", "started", "writer")

    def __init__(
        self,
        writer: LedgerWriter,
        pa: PendingAdd,
        pos: int,
        bookie: str,
        *,
        started: float,
        first_sent: float,
    ) -> None:
        self.writer = writer
        self.pa = pa
        self.pos = pos  # the bookie's position in the ensemble
        self.bookie = bookie
        self.started = started  # clock time of this send
        self.first_sent = first_sent  # clock time of the entry's first send to this bookie

    def __call__(self, exc: BaseException | None) -> None:
        self.writer._answered(self, exc)


class LedgerWriter(EnsembleChanges):
    """Handle of a ledger this client created and writes. Use from one event loop."""

    def __init__(self, meta: LedgerMetadata, version: int, env: LedgerEnv) -> None:
        invariant(meta.state is LedgerState.OPEN, "writer on a %s ledger", meta.state.value)
        self._meta = meta
        self._version = version
        self._env = env
        self._config = env.config
        self._health = env.health
        self._clock = env.clock  # cached: read per replica add
        # The loop of the first add, cached: asyncio.get_running_loop() costs a getpid()
        # system call per entry on Python 3.11.
        self._loop: asyncio.AbstractEventLoop | None = None
        access = ledger_access(meta, env.secret)
        self._master_key = access.master_key
        self._add_timeout_s = env.add_timeout_s
        self._entries = InFlight(
            meta.ledger_id,
            access.digest,
            adds_max=env.config.adds_in_flight_max,
            bytes_max=env.config.add_bytes_in_flight_max,
        )
        # Per bookie, its handle for this ledger's adds (made on the first send).
        self._adders: dict[str, EntryAdder] = {}
        # Write set of entry e is _write_sets[e % E] (quorums never change).
        self._write_sets = [
            write_set(i, meta.ensemble_size, meta.write_quorum) for i in range(meta.ensemble_size)
        ]
        self._failed_bookies: set[str] = set()
        # Failed bookies the next entry is also sent to: an ack takes them back.
        self._probe_due: set[str] = set()
        self._retry = AddRetry(self._add_timeout_s, env.clock)
        self._changing = False  # a change is being recorded: completions wait
        # Wakes a change loop backing off: a new failure, or close().
        self._change_wakeup = asyncio.Event()
        self._change_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self._error: BooklineError | None = None
        self._closed = False
        # close() stopped waiting for replicas: later failures are only debug-logged.
        self._drain_over = False
        self.ensemble_changes = 0
        self._add_timer = env.metrics.add_timer()  # add-to-ack latency (ledger/metrics.py)
        self._lac_pusher = LacPusher(
            env.transport,
            meta.ledger_id,
            self._master_key,
            timeout_s=self._add_timeout_s,
            current_lac=lambda: self._entries.lac,
            repush=self.push_lac,
            tasks=self._tasks,
        )

    # -- public --------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._meta.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._meta

    @property
    def last_add_confirmed(self) -> int:
        return self._entries.lac

    @property
    def last_add_pushed(self) -> int:
        return self._entries.last_pushed

    @property
    def length(self) -> int:
        """Payload bytes of the confirmed entries."""
        return self._entries.length

    @property
    def error(self) -> BooklineError | None:
        return self._error

    @property
    def failed_bookies(self) -> frozenset[str]:
        """Bookies of the current ensemble that failed and are not replaced (or back)."""
        return frozenset(self._failed_bookies)

    @property
    def timeout_retries(self) -> int:
        """Adds re-sent to a bookie that lost one request (see :mod:`ledger.add_retry`)."""
        return self._retry.timeout_retries

    @property
    def lac_told(self) -> int:
        """The LAC every bookie of the current ensemble (but failed ones, see the top)
        acknowledged by explicit LAC (NO_ENTRY when one of them has not, or cannot)."""
        return self._lac_pusher.told(self._writing_to())

    @property
    def lac_sent(self) -> int:
        """:attr:`lac_told`, counting pushes still in flight as told: what every bookie
        of the current ensemble will know once they answer (NO_ENTRY when one of them
        was not sent one, or cannot take it)."""
        return self._lac_pusher.sent(self._writing_to())

    def _writing_to(self) -> list[str]:
        """The current ensemble but its failed bookies (told nothing until back)."""
        failed = self._failed_bookies
        return [b for b in self._meta.last_segment.bookies if b not in failed]

    def push_lac(self) -> None:
        """Explicit LAC: send the current LAC to every bookie of the current ensemble
        now, instead of waiting for a later entry to carry it, so tailing readers see
        an entry about one add round trip after it was confirmed (see
        :mod:`ledger.lac_push`)."""
        lac = self._entries.lac
        if self._error is not None or lac == NO_ENTRY:
            return
        self._lac_pusher.push(lac, self._meta.last_segment.bookies, self._failed_bookies)

    async def add_entry(self, payload: bytes) -> int:
        """Append ``payload``; return its entry id once it is durably replicated."""
        return await (await self.submit(payload))

    async def submit(self, payload: bytes) -> asyncio.Future[int]:
        """Send ``payload`` now (waiting only for room) and return a future of its entry id.

        Futures resolve in entry-id order. Awaiting ``submit`` for many entries and then
        the futures pipelines the adds.
        """
        self._check_size(payload)
        await self.wait_for_room()
        return self._push(payload)

    def submit_nowait(self, payload: bytes) -> asyncio.Future[int] | None:
        """:meth:`submit` without the coroutine, for hot loops: send ``payload`` now and
        return a future of its entry id, or None -- nothing sent -- when the in-flight
        limits are reached (then await :meth:`wait_for_room` or :meth:`submit`). None
        rather than an exception: in a saturated pipeline that is the common answer.
        Raises like :meth:`submit` when the writer failed or was closed."""
        self._check_size(payload)
        self._check_writable()
        if not self._entries.has_room():
            return None
        return self._push(payload)

    def has_room(self) -> bool:
        """Whether :meth:`submit_nowait` would accept an entry now (writable or not)."""
        return self._entries.has_room()

    async def wait_for_room(self) -> None:
        """Return once :meth:`submit_nowait` would accept an entry (or raise when the
        writer failed or was closed)."""
        entries = self._entries
        while True:
            self._check_writable()
            if entries.has_room():
                return
            entries.room.clear()
            await entries.room.wait()

    def _check_size(self, payload: bytes) -> None:
        if len(payload) > self._config.entry_bytes_max:
            raise TooLargeError(
                f"entry of {len(payload)} bytes exceeds {self._config.entry_bytes_max}"
            )

    def _check_writable(self) -> None:
        if self._error is not None:
            raise fresh(self._error)
        if self._closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} was closed by this writer")

    def _push(self, payload: bytes) -> asyncio.Future[int]:
        """Package and send one entry (room was checked)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        pa = self._entries.push(payload, fut)
        meta = self._meta
        ensemble = meta.last_segment.bookies
        started = self._clock()
        self._add_timer.pushed(pa.entry_id, started)
        failed = self._failed_bookies
        for pos in self._write_sets[pa.entry_id % meta.ensemble_size]:
            bookie = ensemble[pos]
            if not failed or bookie not in failed:
                self._send(pa, pos, bookie, started, started)
            elif bookie in self._probe_due:
                self._probe_due.discard(bookie)
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
        entries = self._entries
        entries.room.set()
        if entries.pending:
            futures = [pa.future for pa in entries.pending]
            await asyncio.gather(*futures, return_exceptions=True)
        if self._change_task is not None and not self._change_task.done():
            self._change_wakeup.set()  # a delayed change stops: nothing is pending
            await asyncio.gather(self._change_task, return_exceptions=True)
        if self._error is None:
            self._forget_failed_replicas()
            await self._drain_replicas()
        if self._error is not None:
            self._cancel_tasks()
            return
        self._meta, self._version = await record_closed(
            self._env.store,
            self._meta,
            self._version,
            last_entry_id=entries.lac,
            length=entries.length,
            retries=self._config.metadata_cas_retries_max,
        )
        self._cancel_tasks()

    async def _drain_replicas(self) -> None:
        """Wait until every confirmed entry was answered by all Qw bookies of its write
        set, at most ``close_replication_timeout_ms``: a closed ledger is then fully
        replicated when the bookies are healthy, without autorecovery. Past the deadline
        the stragglers are logged once and abandoned -- the entries are durable on Qa
        bookies (BookKeeper's guarantee) and the auditor finds the gaps."""
        timeout_ms = self._config.close_replication_timeout_ms
        lagging = self._entries.lagging
        await self._entries.drain(timeout_ms / 1000.0, lambda: self._error is not None)
        self._drain_over = True
        if lagging and self._error is None:
            bookies = sorted({b for pa in lagging.values() for b in pa.waiting})
            log.warning(
                "ledger %d: closing with %d entries (first %d) not yet answered by %s after "
                "%d ms; they are on at least Qa=%d bookies, autorecovery re-replicates them",
                self.ledger_id,
                len(lagging),
                min(lagging),
                bookies,
                timeout_ms,
                self._meta.ack_quorum,
            )

    # -- sending and answers -------------------------------------------------------

    def _send(
        self,
        pa: PendingAdd,
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
        lac = self._entries.lac
        self._lac_pusher.carried(bookie, lac)
        adder = self._adders.get(bookie)
        if adder is None:
            adder = self._adders[bookie] = self._env.transport.adder(
                bookie, self.ledger_id, self._master_key, timeout_s=self._add_timeout_s
            )
        done = _Send(self, pa, pos, bookie, started=started, first_sent=first_sent)
        task = adder.add_callback(pa.entry_id, lac, pa.data, done)
        if task is not None:  # the slow path (connecting, no room): cancel on fail
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _answered(self, send: _Send, exc: BaseException | None) -> None:
        pa, bookie = send.pa, send.bookie
        if exc is None:
            self._health.record_success(bookie, self._clock() - send.started)
            self._retry.acked(bookie, send.started)
            self._entries.answered(pa, bookie)
            self._on_ack(pa, send.pos, bookie)
            if self._failed_bookies and bookie in self._failed_bookies:
                self._bookie_back(bookie)  # after the ack: pa is not sent to it again
            return
        if isinstance(exc, TooManyRequestsError) and self._retry_busy(send):
            return
        if isinstance(exc, TimeoutError_) and self._retry_lost(send):
            return
        self._entries.answered(pa, bookie)
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

    def _retry_busy(self, send: _Send) -> bool:
        """Re-send an add the bookie refused as busy, after a backoff; False once the add
        timeout since the first send is spent (then it counts as a failure)."""
        delay_s = self._retry.busy_delay_s(send.first_sent)
        if delay_s is None:
            return False
        if not self._is_current(send.bookie):
            self._entries.answered(send.pa, send.bookie)
            return True  # replaced meanwhile, or the writer failed: nothing to retry
        log.debug(
            "ledger %d entry %d: %s busy, retry in %.3fs", self.ledger_id, send.pa.entry_id,
            send.bookie, delay_s,
        )  # fmt: skip
        asyncio.get_running_loop().call_later(delay_s, self._resend_busy, send)
        return True

    def _retry_lost(self, send: _Send) -> bool:
        """Re-send an add that timed out on a bookie that since acknowledged a later add;
        False when the bookie was silent since or the retry budget is spent."""
        bookie = send.bookie
        if not self._is_current(bookie) or bookie in self._failed_bookies:
            return False
        if not self._retry.resend_lost(bookie, send.started, send.first_sent):
            return False
        log.log(
            logging.WARNING if self._retry.first_warning(bookie) else logging.DEBUG,
            "ledger %d entry %d: bookie %s did not answer in time but acknowledged later "
            "adds; re-sending instead of replacing it (logged once per bookie)",
            self.ledger_id,
            send.pa.entry_id,
            bookie,
        )
        self._send(send.pa, send.pos, bookie, None, send.first_sent)
        return True

    def _resend_busy(self, send: _Send) -> None:
        bookie = send.bookie
        if self._is_current(bookie) and self._meta.last_segment.bookies[send.pos] == bookie:
            self._send(send.pa, send.pos, bookie, None, send.first_sent)
        else:
            self._entries.answered(send.pa, bookie)

    def _on_ack(self, pa: PendingAdd, pos: int, bookie: str) -> None:
        if pa.future.done() or self._error is not None:
            return
        # Only an ack from the bookie metadata names for this position counts.
        if self._meta.last_segment.bookies[pos] != bookie:
            return
        pa.acked.add(pos)
        if len(pa.acked) >= self._meta.ack_quorum:
            self._complete_in_order()

    def _complete_in_order(self) -> None:
        if self._changing or self._error is not None:
            return  # completions wait while an ensemble change is in flight
        self._entries.confirm(self._meta.ack_quorum)
        self._add_timer.confirmed(self._entries.lac, self._clock())

    def _fail(self, exc: BooklineError) -> None:
        if self._error is not None:
            return
        self._error = exc
        self._entries.fail(exc)
        self._cancel_tasks()

    def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()

    async def __aenter__(self) -> LedgerWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
