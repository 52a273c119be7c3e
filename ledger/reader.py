"""Reading a ledger: verified speculative entry reads, LAC reads, long-poll tailing.

A reader never trusts one bookie: every entry is verified against its digest (and its
ledger and entry id) and a failed verification counts as that replica failing, so the
next replica is asked. Reads stop at what is known to be confirmed: the last entry of a
closed ledger, or the LastAddConfirmed of one still being written (entries past the LAC
may never be acknowledged and could vanish in recovery).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Sequence

from foundation.errors import (
    BooklineError,
    ChecksumError,
    ConnectionLostError,
    LedgerClosedError,
    NoEntryError,
    NoLedgerError,
    TimeoutError_,
)
from foundation.invariants import invariant
from ledger.digest import UnpackedEntry
from ledger.env import LedgerEnv
from ledger.interfaces import LacAnswer
from ledger.keys import ledger_access
from ledger.tasks import abandon
from metadata.ledger_metadata import NO_ENTRY, LedgerMetadata

log = logging.getLogger(__name__)

__all__ = ["LedgerReader"]

# Piggybacked entries kept for the tailing reader (bounded; the bytes of one answer are
# bounded by LedgerConfig.long_poll_piggyback_bytes_max).
_PIGGYBACK_CACHE_MAX = 4096
# A busy tail asks the other replicas once the first has been silent for 4x its recent
# answers, but never sooner than this (and never later than long_poll_speculative_ms).
_LAC_SPECULATE_MIN_S = 0.002


class LedgerReader:
    """A read handle. Closed ledgers read up to their last entry; open ones up to the
    LAC learnt from bookies (:meth:`read_lac`, :meth:`wait_lac`, :meth:`tail`)."""

    def __init__(self, meta: LedgerMetadata, version: int, env: LedgerEnv) -> None:
        self._meta = meta
        self._version = version
        self._env = env
        access = ledger_access(meta, env.secret)
        self._digest = access.digest
        self._key = access.master_key
        self._lac = meta.last_entry_id if meta.is_closed else NO_ENTRY
        self._piggyback: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        # The bookie whose long poll answered last: asked first next time; and how long
        # answers that brought a newer LAC took (EWMA), which sets how soon the other
        # replicas are asked too.
        self._lac_source: str | None = None
        self._lac_wait_s: float | None = None

    @property
    def ledger_id(self) -> int:
        return self._meta.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._meta

    @property
    def is_closed(self) -> bool:
        return self._meta.is_closed

    @property
    def last_add_confirmed(self) -> int:
        """Last entry known readable: the last entry if closed, else the LAC seen so far."""
        return self._lac

    @property
    def length(self) -> int:
        return self._meta.length

    def _advance_lac(self, lac: int) -> None:
        if self._meta.is_closed:
            invariant(
                lac <= self._meta.last_entry_id,
                "ledger %d: LAC %d past closed end %d",
                self.ledger_id,
                lac,
                self._meta.last_entry_id,
            )
            return
        self._lac = max(self._lac, lac)

    def assume_confirmed(self, entry_id: int) -> None:
        """Read entries up to ``entry_id`` although the ledger is not closed and the
        bookies' LAC lags: for a caller whose own metadata names them as acknowledged
        (a sealed stream segment's last entry). A closed ledger keeps its end."""
        if not self._meta.is_closed:
            self._lac = max(self._lac, entry_id)

    # -- entries -------------------------------------------------------------------

    async def read_entry(self, entry_id: int) -> bytes:
        """The payload of a confirmed entry (NoEntryError past the readable end)."""
        return (await self.read_unpacked(entry_id)).payload

    async def read_unpacked(
        self,
        entry_id: int,
        *,
        unconfirmed: bool = False,
        needed: asyncio.Future[None] | None = None,
    ) -> UnpackedEntry:
        limit = self._readable_end()
        if entry_id < 0 or (entry_id > limit and not unconfirmed):
            raise NoEntryError(
                f"ledger {self.ledger_id}: entry {entry_id} is beyond the readable end {limit}"
            )
        if self._meta.is_closed and entry_id > self._meta.last_entry_id:
            raise NoEntryError(f"ledger {self.ledger_id} closed at {self._meta.last_entry_id}")
        cached = self._take_piggybacked(entry_id)
        if cached is not None:
            return cached

        async def attempt(bookie: str) -> UnpackedEntry:
            ans = await self._env.transport.read(
                bookie,
                self.ledger_id,
                entry_id,
                fence=False,
                master_key=self._key,
                timeout_s=self._env.read_timeout_s,
            )
            entry = self._digest.verify(ans.data, entry_id)
            self._advance_lac(ans.lac)
            return entry

        started = self._env.clock()
        entry = await self._env.speculative(
            self._meta.replicas(entry_id),
            attempt,
            what=f"read of ledger {self.ledger_id} entry {entry_id}",
            needed=needed,
        )
        self._env.metrics.entry_read_seconds.observe(self._env.clock() - started)
        self._advance_lac(entry.lac)
        return entry

    def _take_piggybacked(self, entry_id: int) -> UnpackedEntry | None:
        """The entry from the long polls' piggyback cache, verified; None when it is
        not there or fails its digest (then it is read from a bookie)."""
        cached = self._piggyback.pop(entry_id, None)
        if cached is None:
            return None
        try:
            return self._digest.verify(cached, entry_id)
        except ChecksumError as exc:
            log.warning(
                "ledger %d: piggybacked entry %d corrupt: %s; reading it",
                self.ledger_id,
                entry_id,
                exc,
            )
            return None

    async def read(self, first: int, last: int) -> list[bytes]:
        """Payloads of entries ``first..last`` inclusive, in order (bounded concurrency)."""
        return [e.payload async for e in self.iter_entries(first, last)]

    async def iter_entries(self, first: int, last: int) -> AsyncIterator[UnpackedEntry]:
        """Entries ``first..last`` in order, with up to ``reads_in_flight_max`` reads ahead."""
        if first > last:
            return
        # Reads ahead and, for each, the future that says the caller now waits for it
        # (only then may it be asked of a second replica; see ledger.speculative).
        window: collections.deque[tuple[asyncio.Task[UnpackedEntry], asyncio.Future[None]]]
        window = collections.deque()
        loop = asyncio.get_running_loop()
        nxt = first
        try:
            while nxt <= last or window:
                if not window and nxt in self._piggyback and nxt <= self._readable_end():
                    # A tail: entries that came with the long poll are handed over at
                    # once -- a task per entry cost a loop iteration each, and the
                    # next poll waited behind them.
                    entry = self._take_piggybacked(nxt)
                    if entry is not None:
                        self._advance_lac(entry.lac)
                        nxt += 1
                        yield entry
                        continue
                while nxt <= last and len(window) < self._env.config.reads_in_flight_max:
                    needed: asyncio.Future[None] = loop.create_future()
                    task = asyncio.ensure_future(self.read_unpacked(nxt, needed=needed))
                    window.append((task, needed))
                    nxt += 1
                task, needed = window.popleft()
                needed.set_result(None)
                yield await task
        finally:
            abandon([t for t, _n in window])  # reads ahead of a failure or an early stop

    def _readable_end(self) -> int:
        return self._meta.last_entry_id if self._meta.is_closed else self._lac

    # -- LAC -----------------------------------------------------------------------

    async def read_lac(self) -> int:
        """Ask the last ensemble (speculatively) for the LAC; return the best known."""
        if self._meta.is_closed:
            return self._meta.last_entry_id

        async def attempt(bookie: str) -> LacAnswer:
            return await self._env.transport.read_lac(
                bookie,
                self.ledger_id,
                NO_ENTRY,
                0,
                timeout_s=self._env.read_timeout_s,
                master_key=self._key,
            )

        ans = await self._env.speculative(
            self._meta.last_segment.bookies, attempt, what=f"LAC read of ledger {self.ledger_id}"
        )
        self._advance_lac(ans.lac)
        return self._lac

    async def read_end(self) -> int:
        """An entry id at or after every entry acknowledged before the call (where a
        reader "at the end" starts after): the last entry of a closed ledger; of an open
        one the highest of the LAC, the entry before the last ensemble's first (all
        acknowledged when it was formed) and the last entry held by E - Qa + 1 bookies
        of the last ensemble -- at least one of them is in the ack quorum of any entry
        the writer acknowledged, so holds it durably.

        :meth:`read_lac` lags an acknowledgement (a bookie learns the LAC from the next
        entry or the writer's explicit push, a moment later); this does not, but may
        name an entry not (yet) acknowledged: a place to start after, never to read up
        to -- the LAC does not move past what bookies confirm (READ of entry -1 answers
        each bookie's last entry, verified like any entry)."""
        if self._meta.is_closed:
            return self._meta.last_entry_id
        segment = self._meta.last_segment
        need = max(1, len(segment.bookies) - self._meta.ack_quorum + 1)
        held = await self._gather_last_held(segment.bookies, need)
        return max(self._lac, segment.first_entry_id - 1, *held)

    async def read_confirmed_end(self) -> int:
        """The LAC once it covers every entry acknowledged before the call (where
        :meth:`read_end` says they end): bookies learn an acknowledgement's LAC a moment
        after it, and this waits for that moment -- for at most the read timeout, after
        which (a writer that stopped between an acknowledgement and telling the
        bookies, or an end never acknowledged) it answers the LAC as known."""
        end = await self.read_end()
        deadline = self._env.clock() + self._env.read_timeout_s
        while self._lac < end and not self._meta.is_closed:
            left_ms = int((deadline - self._env.clock()) * 1000)
            if left_ms <= 0:
                break
            await self.wait_lac(self._lac, left_ms)
        return self._lac

    async def _gather_last_held(self, bookies: Sequence[str], need: int) -> list[int]:
        """The last entry held by the first ``need`` of ``bookies`` to answer (all are
        asked at once: a hung one costs nothing while enough others answer); raises the
        first error when fewer than ``need`` can."""

        async def last_held(bookie: str) -> int:
            try:
                ans = await self._env.transport.read(
                    bookie, self.ledger_id, NO_ENTRY, fence=False, master_key=self._key,
                    timeout_s=self._env.read_timeout_s,
                )  # fmt: skip
            except (NoEntryError, NoLedgerError):
                return NO_ENTRY  # holds nothing of this ledger (yet)
            entry = self._digest.verify(ans.data, ans.entry_id)
            self._advance_lac(max(ans.lac, entry.lac))
            return ans.entry_id

        pending = {asyncio.ensure_future(last_held(b)) for b in bookies}
        held: list[int] = []
        errors: list[BooklineError] = []
        try:
            while pending and len(held) < need:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if isinstance(exc, BooklineError):
                        errors.append(exc)
                    elif exc is not None:
                        raise exc
                    else:
                        held.append(task.result())
        finally:
            abandon(list(pending))
        if len(held) < need:
            raise errors[0]
        return held

    async def wait_lac(self, previous_lac: int, timeout_ms: int | None = None) -> int:
        """Long poll: the LAC once it exceeds ``previous_lac``, or the current one after
        ``timeout_ms``. The next entry rides along -- from bookies with LAC_ENTRIES, with
        the entries after it up to ``long_poll_piggyback_bytes_max`` -- and is cached for
        the reads that follow.

        One replica of entry ``previous_lac + 1`` is asked, the one that answered last
        time first: a bookie answers with the writer's LAC as soon as it arrives, for
        the entries it has received even before its own fsync of them (the writer's LAC
        says they are durable on its ack quorum; ``LedgerState.visible_lac``), so any
        replica knows as soon as any other, and the slowest fsync never holds the tail
        back. One poll per round, not Qw - Qa + 1: at 1,000 records/s the second poll
        and its answer were 10-15 % of the reader's CPU and more of its waits for a core
        (issue 26, docs/benchmarks.md). Only if it fails, or stays silent for 4x the
        recent answers' wait (at least 2 ms, at most ``long_poll_speculative_ms``: the
        writer went idle, or the bookie is hung or older), are the other replicas of the
        write set asked too, and the first answer with a newer LAC wins -- and is asked
        first next time."""
        if self._meta.is_closed or self._lac > previous_lac:
            return self._lac
        wait_ms = self._env.config.long_poll_timeout_ms if timeout_ms is None else timeout_ms
        replicas = list(self._meta.replicas(previous_lac + 1))
        if self._lac_source in replicas:
            replicas.remove(self._lac_source)
            replicas.insert(0, self._lac_source)
        timeout_s = self._env.read_timeout_s + wait_ms / 1000.0
        piggyback = self._env.config.long_poll_piggyback_bytes_max

        def ask(bookie: str) -> asyncio.Future[LacAnswer]:
            return asyncio.ensure_future(self._env.transport.read_lac(
                bookie, self.ledger_id, previous_lac, wait_ms,
                timeout_s=timeout_s, piggyback_bytes_max=piggyback, master_key=self._key,
            ))  # fmt: skip

        asked = {ask(replicas[0]): replicas[0]}
        later = replicas[1:]
        speculate_s = self._env.config.long_poll_speculative_ms / 1000.0
        if self._lac_wait_s is not None:
            speculate_s = min(speculate_s, max(_LAC_SPECULATE_MIN_S, 4 * self._lac_wait_s))
        started = self._env.clock()
        errors: list[BooklineError] = []
        try:
            pending: set[asyncio.Future[LacAnswer]] = set(asked)
            while pending:
                done, pending = await asyncio.wait(
                    pending,
                    timeout=speculate_s if later else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    exc = task.exception()
                    if isinstance(exc, BooklineError):
                        errors.append(exc)
                        continue
                    if exc is not None:
                        raise exc
                    ans = task.result()
                    self._remember_piggyback(ans)
                    self._advance_lac(ans.lac)
                    if self._lac > previous_lac:
                        self._lac_source = asked[task]
                        waited = self._env.clock() - started
                        last = self._lac_wait_s
                        self._lac_wait_s = waited if last is None else 0.8 * last + 0.2 * waited
                        return self._lac
                if later and (not done or errors):  # silent or failed: ask the others
                    for bookie in later:
                        task = ask(bookie)
                        asked[task] = bookie
                        pending.add(task)
                    later = []
        finally:
            abandon(list(asked))  # the first answer wins; retrieve the others' outcomes
        if len(errors) == len(asked):
            raise errors[0]
        return self._lac

    def _remember_piggyback(self, ans: LacAnswer) -> None:
        if ans.next_entry_id is None or ans.next_entry is None:
            return
        cache = self._piggyback
        cache[ans.next_entry_id] = ans.next_entry
        for offset, entry in enumerate(ans.more_entries, 1):
            cache[ans.next_entry_id + offset] = entry
        while len(self._piggyback) > _PIGGYBACK_CACHE_MAX:
            self._piggyback.popitem(last=False)

    async def refresh_metadata(self) -> LedgerMetadata:
        """Re-read metadata (a writer may have changed the ensemble or closed it)."""
        meta, version = await self._env.store.read(self.ledger_id)
        self._meta, self._version = meta, version
        if meta.is_closed:
            self._lac = meta.last_entry_id
        return meta

    async def tail(self, start: int = 0) -> AsyncIterator[tuple[int, bytes]]:
        """Follow the ledger from ``start``: confirmed entries as they appear, until the
        ledger is closed and fully read. Long polls between entries."""
        nxt = start
        while True:
            if nxt <= self._lac:
                async for entry in self.iter_entries(nxt, self._lac):
                    yield entry.entry_id, entry.payload
                    nxt = entry.entry_id + 1
                continue
            if self._meta.is_closed:
                return
            before = self._lac
            try:
                lac = await self.wait_lac(nxt - 1)
            except (NoEntryError, NoLedgerError, TimeoutError_, ConnectionLostError) as exc:
                # Bookies that have not seen the ledger yet, or are briefly unreachable:
                # pause one speculative step so the loop cannot spin.
                log.debug("ledger %d: long poll failed: %s", self.ledger_id, exc)
                await asyncio.sleep(self._env.config.speculative_read_max_timeout_ms / 1000.0)
                lac = before
            if lac <= before:
                # No progress within a long poll: maybe the ensemble changed or the
                # ledger was closed; metadata says which.
                meta = await self.refresh_metadata()
                if meta.is_closed and nxt > meta.last_entry_id:
                    return

    def check_open(self) -> None:
        if self._meta.is_closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
