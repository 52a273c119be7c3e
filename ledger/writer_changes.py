"""The ledger writer's ensemble changes: replacing the bookies of its current ensemble
that failed or timed out (a mixin of :class:`~ledger.writer.LedgerWriter`, whose state
it shares; the change itself is :mod:`ledger.ensemble_change`'s).

*At once*, when the bookies that did not fail cannot make the ack quorum of some write
set: completions pause while a new segment from LAC + 1 is compare-and-set, then the
unacknowledged entries are re-sent to the replacements. A missing spare is retried
(``_CHANGE_BACKOFF_S``) ``ensemble_change_retries_max`` times, then the writer fails.

*Delayed* (``delay_ensemble_change``, on by default; BookKeeper's
``delayEnsembleChange``), while the others still make the ack quorum of every write set:
entries keep completing on Qa acknowledgements -- always from bookies the last segment
names, each a fsynced copy -- and completions pause only while a change is being
recorded (a spare exists). A missing spare only backs off (``_DELAYED_BACKOFF``) and is
asked for again, never failing the writer. Durability does not change: an entry is
acknowledged with Qa copies, always.

*Probes*: after an attempt that found no spare (delayed or not), each failed bookie is
sent the oldest unacknowledged entry it lacks (none: the next entry), and the first add
a failed bookie acknowledges takes it back (``_bookie_back``): it gets the pending
entries it was not sent and every later one. So a bookie that was only slow rejoins,
and one that answers again can restore a lost ack quorum before the retries run out.

What a failed bookie missed stays under-replicated on Qa (or more) bookies of each
entry's write set, which metadata still names it in: readers and recovery read around
such holes ("no such entry" from one bookie is not the end: :mod:`ledger.speculative`,
:mod:`ledger.recovery`), and autorecovery's replica check (:mod:`ledger.scrub`, every
``replica_check_interval_ms``) marks the entries a live bookie lacks once the ledger is
closed -- a stream's ledgers close as it rolls them. A bookie replaced later keeps its
old segment, which records where its entries end; one that never returns is the
auditor's lost-bookie path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from foundation.backoff import Backoff, BackoffPolicy
from foundation.errors import (
    BooklineError,
    MetadataError,
    NotEnoughBookiesError,
    SessionSuspendedError,
    WriterFailedError,
)
from foundation.invariants import invariant
from foundation.quorum import write_set
from ledger.config import LedgerConfig
from ledger.ensemble_change import ack_quorum_holds, change_ensemble, plan_ensemble
from ledger.env import LedgerEnv
from ledger.inflight import InFlight, PendingAdd
from ledger.interfaces import EntryAdder
from metadata.ledger_metadata import LedgerMetadata

log = logging.getLogger("ledger.writer")  # one logger for the writer's messages

__all__ = ["EnsembleChanges"]

# Pause between ensemble-change attempts that found no replacement (bookies may return).
_CHANGE_BACKOFF_S = 0.2
# A delayed change (the ack quorum holds) asks for a spare again after this backoff:
# soon at first (a bookie restarting, a spare registering), then every few seconds --
# each attempt reads the writable bookies, which many writers may do at once.
_DELAYED_BACKOFF = BackoffPolicy(delay_s=0.2, max_delay_s=5.0, factor=2.0, jitter=0.5)


class EnsembleChanges:
    """The ensemble-change half of a :class:`~ledger.writer.LedgerWriter`."""

    # The writer's state this half reads and changes (set by LedgerWriter.__init__).
    _meta: LedgerMetadata
    _version: int
    _env: LedgerEnv
    _config: LedgerConfig
    _clock: Callable[[], float]
    _entries: InFlight
    _adders: dict[str, EntryAdder]
    _write_sets: list[list[int]]
    _failed_bookies: set[str]  # of the current ensemble, not replaced (nor back)
    _probe_due: set[str]  # failed bookies the next entry is also sent to
    _changing: bool  # a change is being recorded: completions wait
    _change_wakeup: asyncio.Event  # wakes a loop backing off: a new failure, or close()
    _change_task: asyncio.Task[None] | None
    _error: BooklineError | None
    _closed: bool
    ensemble_changes: int

    @property
    def ledger_id(self) -> int:
        return self._meta.ledger_id

    if TYPE_CHECKING:  # the writer's methods this half calls

        def _send(
            self,
            pa: PendingAdd,
            pos: int,
            bookie: str,
            started: float | None = None,
            first_sent: float | None = None,
        ) -> None: ...

        def _is_current(self, bookie: str) -> bool: ...

        def _complete_in_order(self) -> None: ...

        def _fail(self, exc: BooklineError) -> None: ...

    def _bookie_failed(self, bookie: str) -> None:
        if self._error is not None or bookie not in self._meta.last_segment.bookies:
            return  # already replaced (a late answer from the old ensemble)
        if bookie in self._failed_bookies:
            return  # a late answer, or a failed probe: the change loop already runs
        self._failed_bookies.add(bookie)
        if self._closed and not self._entries.pending:
            # Only the close drain waits on this bookie: every entry is confirmed, so
            # there is nothing to re-send and the segment needs no change.
            return
        self._change_wakeup.set()  # a loop backing off looks again: the quorum may be lost
        if self._change_task is None or self._change_task.done():
            self._change_task = asyncio.ensure_future(self._ensemble_change_loop())
            self._change_task.add_done_callback(self._on_change_done)

    def _bookie_back(self, bookie: str) -> None:
        """A failed bookie of the current ensemble acknowledged an add: it writes
        again, so it gets every later entry, and the unacknowledged ones it was not
        sent (a pending entry may need its ack: another bookie can fail next), and
        needs no replacement. (Without delay_ensemble_change it is replaced anyway.)"""
        if not self._config.delay_ensemble_change or not self._is_current(bookie):
            return
        self._failed_bookies.discard(bookie)
        self._probe_due.discard(bookie)
        meta = self._meta
        pos = meta.last_segment.bookies.index(bookie)
        for pa in self._entries.pending:
            if pa.future.done() or bookie in pa.waiting or pos in pa.acked:
                continue
            if pos in self._write_sets[pa.entry_id % meta.ensemble_size]:
                self._send(pa, pos, bookie)
        log.warning(
            "ledger %d: bookie %s answers again; writing to it (entries it missed are "
            "on the others until autorecovery copies them)",
            self.ledger_id,
            bookie,
        )

    def _forget_failed_replicas(self) -> None:
        """Close does not wait for a failed bookie's answers (a probe to a hung bookie
        would hold it for the close deadline): those entries are on Qa others."""
        entries, failed = self._entries, self._failed_bookies
        for pa in list(entries.lagging.values()):
            for bookie in pa.waiting & failed:
                entries.answered(pa, bookie)

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

    def _change_needed(self) -> bool:
        return (
            self._error is None
            and bool(self._failed_bookies)
            and not (self._closed and not self._entries.pending)
        )

    def _delayable(self, failed: set[str]) -> bool:
        """Whether the change may wait: the others make the ack quorum of every write set."""
        meta = self._meta
        return self._config.delay_ensemble_change and ack_quorum_holds(
            meta.last_segment.bookies, failed, meta.write_quorum, meta.ack_quorum
        )

    async def _ensemble_change_loop(self) -> None:
        """Replace the failed bookies until none is left (or the writer fails)."""
        lost_attempts = 0  # attempts without a replacement while the ack quorum is lost
        backoff = Backoff(_DELAYED_BACKOFF, rng=self._env.rng, clock=self._clock)
        while self._change_needed():
            self._change_wakeup.clear()
            failed = set(self._failed_bookies)
            delayed = self._delayable(failed)
            try:
                if delayed:  # no pause while no spare exists
                    await plan_ensemble(self._env, self._meta, failed)
                new, version = await self._record_change(failed)
            except (NotEnoughBookiesError, MetadataError, SessionSuspendedError) as exc:
                if self._config.delay_ensemble_change:
                    self._probe(failed)
                if delayed:
                    lost_attempts = 0
                    delay_s = backoff.next_s()
                    self._log_delayed(exc, first=backoff.tries == 1)
                else:
                    lost_attempts += 1
                    if lost_attempts > self._config.ensemble_change_retries_max:
                        self._fail(exc)
                        return
                    delay_s = _CHANGE_BACKOFF_S * lost_attempts
                    log.warning(
                        "ledger %d: ensemble change attempt %d failed: %s",
                        self.ledger_id,
                        lost_attempts,
                        exc,
                    )
                self._complete_in_order()  # entries acknowledged while the attempt ran
                await self._wait_change(delay_s)
                continue
            except BooklineError as exc:
                self._fail(exc)
                return
            self._apply_new_ensemble(new, version)
            self._failed_bookies -= failed
            self.ensemble_changes += 1
            backoff.reset()
            self._complete_in_order()

    async def _record_change(self, failed: set[str]) -> tuple[LedgerMetadata, int]:
        """Compare-and-set a new segment from LAC + 1 without ``failed``; completions
        wait meanwhile, so every entry before the segment is acknowledged."""
        self._changing = True
        try:
            return await change_ensemble(
                self._env, self._meta, self._version, failed, self._entries.lac + 1
            )
        finally:
            self._changing = False

    def _probe(self, failed: set[str]) -> None:
        """Ask each failed bookie whether it writes again: the oldest unacknowledged entry
        it lacks is sent to it now (none: the next entry is) -- unless one still is."""
        meta = self._meta
        ensemble = meta.last_segment.bookies
        probing = {b for pa in self._entries.lagging.values() for b in pa.waiting}
        for bookie in (failed & self._failed_bookies) - probing:
            pos = ensemble.index(bookie)
            lacking = None
            for pa in self._entries.pending:
                if bookie in pa.waiting:
                    break  # a probe is on its way
                in_write_set = pos in self._write_sets[pa.entry_id % meta.ensemble_size]
                if in_write_set and pos not in pa.acked and not pa.future.done():
                    lacking = pa
                    break
            else:
                self._probe_due.add(bookie)
                continue
            if lacking is not None:
                self._send(lacking, pos, bookie)

    def _log_delayed(self, exc: BooklineError, *, first: bool) -> None:
        """Logged at WARNING once per run of failures (the next attempts at DEBUG)."""
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "ledger %d: ensemble change delayed (%s); failed bookies %s, the others make "
            "the ack quorum: writing on, asking again later",
            self.ledger_id,
            exc,
            sorted(self._failed_bookies),
        )

    async def _wait_change(self, delay_s: float) -> None:
        """Back off ``delay_s``, or less when a bookie fails or the writer closes."""
        with contextlib.suppress(TimeoutError):  # the backoff ran out: try again
            await asyncio.wait_for(self._change_wakeup.wait(), delay_s)

    def _apply_new_ensemble(self, new: LedgerMetadata, version: int) -> None:
        entries = self._entries
        invariant(
            not entries.pending or entries.pending[0].entry_id >= new.last_segment.first_entry_id,
            "ledger %d: unacknowledged entry before the new segment",
            self.ledger_id,
        )
        old = self._meta.last_segment.bookies
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
        self._probe_due -= replaced
        for bookie in replaced:
            self._adders.pop(bookie, None)
        for lagging in list(entries.lagging.values()):
            for bookie in replaced & lagging.waiting:
                entries.answered(lagging, bookie)  # its answer no longer matters
        for pa in entries.pending:
            pa.waiting -= replaced
            for pos in write_set(pa.entry_id, new.ensemble_size, new.write_quorum):
                if now[pos] != old[pos]:
                    pa.acked.discard(pos)
                    self._send(pa, pos, now[pos])
