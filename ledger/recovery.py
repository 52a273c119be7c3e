"""Ledger recovery: fence the writer out, find the true end, close the ledger.

Opening a ledger another writer may still hold (issue 4 item 5; DESIGN.md section 4):

1. **IN_RECOVERY.** Compare-and-set the metadata from OPEN to IN_RECOVERY. From then on
   the writer's ensemble changes lose their CAS and the writer stops, so the last
   ensemble in metadata is final.
2. **Fence** every bookie of the last ensemble (a READ of the last entry with the FENCE
   flag). Done when every write set has fewer than Qa bookies that have not answered
   "fenced": the writer then cannot gather Qa acks for any new entry. A hung bookie
   (SIGSTOP) is tolerated as long as that holds. Keep the highest LAC reported.
3. **Read forward** from ``max(LAC, first entry of the last segment - 1)``. Everything up
   to there is committed. The second term fixes the *empty last ensemble* defect: after
   an ensemble change the new bookies may report LAC -1 although every entry before the
   segment was committed. Each following entry is read from its whole write set with
   reads that **also fence** -- the fix for the *lost fence message* defect: a bookie
   that missed step 2 is fenced by the read before it can answer NO_ENTRY, so an entry
   declared absent can never be acknowledged later. An entry is absent only when
   Qw - Qa + 1 bookies say NO_ENTRY / NO_LEDGER (then at most Qa - 1 could ever hold it);
   one valid copy makes it present; anything else is "don't know" and recovery fails
   (retriable) rather than guess.
4. **Re-replicate** each entry found to its full write set with recovery adds (they
   pass the fence) and wait for Qa acks each.
5. **CLOSED** by compare-and-set with the last entry id and length. A recovery that
   loses this CAS to a concurrent one re-reads and adopts the stored result, so every
   opener agrees on the same length.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from foundation.errors import (
    BadVersionError,
    BooklineError,
    ChecksumError,
    MetadataError,
    NoEntryError,
    NoLedgerError,
    NotEnoughBookiesError,
    TimeoutError_,
    UnauthorizedError,
)
from foundation.invariants import invariant
from ledger.config import LedgerConfig
from ledger.digest import DigestManager, UnpackedEntry, master_key
from ledger.interfaces import BookieTransport, MetadataStore
from ledger.placement import BookieHealth, write_set
from ledger.speculative import speculative
from ledger.tasks import abandon, consume
from metadata.ledger_metadata import NO_ENTRY, LedgerMetadata, LedgerState

log = logging.getLogger(__name__)

__all__ = ["LedgerRecovery", "RecoveryResult"]

_ABSENT = (NoEntryError, NoLedgerError)


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    meta: LedgerMetadata
    version: int
    recovered_by_us: bool  # False when another opener's close won


class LedgerRecovery:
    """One recovery of one ledger (use once)."""

    def __init__(
        self,
        ledger_id: int,
        *,
        store: MetadataStore,
        transport: BookieTransport,
        config: LedgerConfig,
        health: BookieHealth,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger_id = ledger_id
        self._store = store
        self._transport = transport
        self._config = config
        self._health = health
        self._clock = clock

    async def run(self, password: bytes) -> RecoveryResult:
        for _attempt in range(self._config.metadata_cas_retries_max):
            meta, version = await self._store.read(self._ledger_id)
            if meta.password != password:
                raise UnauthorizedError(f"wrong password for ledger {self._ledger_id}")
            if meta.is_closed:
                return RecoveryResult(meta, version, recovered_by_us=False)
            if meta.state is LedgerState.OPEN:
                marked = dataclasses.replace(meta, state=LedgerState.IN_RECOVERY)
                try:
                    version = await self._store.write(marked, version)
                except BadVersionError:
                    continue  # the writer changed the ensemble, or another opener marked it
                meta = marked
            last_entry_id, length = await self._find_end(meta)
            closed = meta.closed(last_entry_id, length)
            try:
                version = await self._store.write(closed, version)
            except BadVersionError:
                continue  # another recovery closed it (or re-marked): re-read and adopt
            log.info(
                "ledger %d recovered: last entry %d, %d bytes",
                self._ledger_id,
                last_entry_id,
                length,
            )
            return RecoveryResult(closed, version, recovered_by_us=True)
        raise MetadataError(
            f"ledger {self._ledger_id}: recovery lost the metadata CAS "
            f"{self._config.metadata_cas_retries_max} times"
        )

    # -- steps ---------------------------------------------------------------------

    async def _find_end(self, meta: LedgerMetadata) -> tuple[int, int]:
        key = master_key(meta.password)
        digest = DigestManager(meta.ledger_id, meta.digest_type, meta.password)
        max_lac = await self._fence(meta, key)
        start = max(max_lac, meta.last_segment.first_entry_id - 1)
        length = 0
        if start >= 0:
            length = (await self._read_committed(meta, digest, start)).length
        return await self._read_forward(meta, digest, key, start, length)

    async def _fence(self, meta: LedgerMetadata, key: bytes) -> int:
        bookies = meta.last_segment.bookies
        e, qw, qa = meta.ensemble_size, meta.write_quorum, meta.ack_quorum
        sets = [write_set(i, e, qw) for i in range(e)]
        timeout_s = self._config.fence_timeout_ms / 1000.0
        tasks = {
            asyncio.ensure_future(
                self._transport.read(
                    b, meta.ledger_id, NO_ENTRY, fence=True, master_key=key, timeout_s=timeout_s
                )
            ): pos
            for pos, b in enumerate(bookies)
        }
        fenced: set[int] = set()
        max_lac = NO_ENTRY

        def enough() -> bool:
            return all(sum(1 for p in ws if p not in fenced) < qa for ws in sets)

        pending = set(tasks)
        try:
            while pending and not enough():
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    pos = tasks[task]
                    exc = task.exception()
                    if exc is None:
                        fenced.add(pos)
                        max_lac = max(max_lac, task.result().lac)
                    elif isinstance(exc, _ABSENT):
                        fenced.add(pos)  # fenced; holds no entry, so its LAC is -1
                    elif isinstance(exc, UnauthorizedError):
                        raise exc
                    elif isinstance(exc, BooklineError):
                        log.warning(
                            "ledger %d: fencing %s failed: %s", meta.ledger_id, bookies[pos], exc
                        )
                        self._health.record_failure(bookies[pos])
                    else:
                        raise exc
        finally:
            abandon(tasks)  # answers not needed any more; retrieve every outcome
        if not enough():
            raise NotEnoughBookiesError(
                f"ledger {meta.ledger_id}: fenced only {sorted(bookies[p] for p in fenced)} of "
                f"{list(bookies)}; a write set still has Qa={qa} unfenced bookies"
            )
        log.info(
            "ledger %d: fenced %d/%d bookies, max LAC %d", meta.ledger_id, len(fenced), e, max_lac
        )
        return max_lac

    async def _read_committed(
        self, meta: LedgerMetadata, digest: DigestManager, entry_id: int
    ) -> UnpackedEntry:
        async def attempt(bookie: str) -> UnpackedEntry:
            ans = await self._transport.read(
                bookie,
                meta.ledger_id,
                entry_id,
                fence=False,
                master_key=b"",
                timeout_s=self._config.read_timeout_ms / 1000.0,
            )
            return digest.verify(ans.data, entry_id)

        try:
            return await speculative(
                meta.replicas(entry_id),
                attempt,
                health=self._health,
                clock=self._clock,
                first_timeout_s=self._config.speculative_read_first_timeout_ms / 1000.0,
                max_timeout_s=self._config.speculative_read_max_timeout_ms / 1000.0,
                what=f"recovery read of committed entry {entry_id} of ledger {meta.ledger_id}",
            )
        except NoEntryError as exc:
            # A committed entry no replica holds: data loss, never paper over it.
            raise NoEntryError(
                f"ledger {meta.ledger_id}: committed entry {entry_id} is on no replica"
            ) from exc

    async def _read_forward(
        self, meta: LedgerMetadata, digest: DigestManager, key: bytes, start: int, length: int
    ) -> tuple[int, int]:
        window_max = self._config.reads_in_flight_max
        reads: collections.deque[asyncio.Task[tuple[UnpackedEntry, bytes] | None]]
        reads = collections.deque()
        rewrites: collections.deque[asyncio.Task[None]] = collections.deque()
        nxt = start + 1
        last = start
        try:
            while True:
                while len(reads) < window_max:
                    reads.append(asyncio.ensure_future(self._recovery_read(meta, digest, key, nxt)))
                    nxt += 1
                found = await reads.popleft()
                if found is None:
                    break
                entry, data = found
                invariant(
                    entry.entry_id == last + 1,
                    "recovery out of order: %d after %d",
                    entry.entry_id,
                    last,
                )
                invariant(
                    entry.length >= length,
                    "ledger %d: length shrinks at entry %d",
                    meta.ledger_id,
                    entry.entry_id,
                )
                last, length = entry.entry_id, entry.length
                rewrites.append(asyncio.ensure_future(self._rewrite(meta, key, entry, data)))
                while len(rewrites) > window_max:
                    await rewrites.popleft()
            while rewrites:
                await rewrites.popleft()
        finally:
            abandon((*reads, *rewrites))  # read-ahead past the end may have failed
        return last, length

    async def _recovery_read(
        self, meta: LedgerMetadata, digest: DigestManager, key: bytes, entry_id: int
    ) -> tuple[UnpackedEntry, bytes] | None:
        """The entry if present, None if absent (Qw - Qa + 1 say so), else raise."""
        bookies = meta.replicas(entry_id)
        absent_needed = meta.write_quorum - meta.ack_quorum + 1
        timeout_s = self._config.read_timeout_ms / 1000.0
        tasks = [
            asyncio.ensure_future(
                self._transport.read(
                    b, meta.ledger_id, entry_id, fence=True, master_key=key, timeout_s=timeout_s
                )
            )
            for b in bookies
        ]
        absent = 0
        errors: list[BooklineError] = []
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if isinstance(exc, _ABSENT):
                        absent += 1
                        if absent >= absent_needed:
                            return None
                    elif isinstance(exc, UnauthorizedError):
                        raise exc
                    elif isinstance(exc, BooklineError):
                        errors.append(exc)
                    elif exc is not None:
                        raise exc
                    else:
                        ans = task.result()
                        try:
                            return digest.verify(ans.data, entry_id), ans.data
                        except ChecksumError as bad:
                            errors.append(bad)
        finally:
            # An early answer leaves other replicas' reads running or finished (a dead
            # bookie's error among them): cancel them and retrieve every outcome.
            abandon(tasks)
        raise TimeoutError_(
            f"ledger {meta.ledger_id}: recovery cannot tell whether entry {entry_id} exists "
            f"({absent} NO_ENTRY of {absent_needed} needed; errors: "
            + "; ".join(str(e) for e in errors)
            + ")"
        )

    async def _rewrite(
        self, meta: LedgerMetadata, key: bytes, entry: UnpackedEntry, data: bytes
    ) -> None:
        """Recovery-add the entry to its whole write set; done at Qa acks (a hung
        replica does not hold recovery up; its add finishes or times out on its own)."""
        bookies = meta.replicas(entry.entry_id)
        timeout_s = self._config.add_timeout_ms / 1000.0
        tasks = {
            asyncio.ensure_future(
                self._transport.add(
                    b,
                    meta.ledger_id,
                    entry.entry_id,
                    entry.lac,
                    key,
                    data,
                    recovery=True,
                    timeout_s=timeout_s,
                )
            ): b
            for b in bookies
        }
        acks = 0
        errors: list[str] = []
        pending = set(tasks)
        try:
            while pending and acks < meta.ack_quorum:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if exc is None:
                        acks += 1
                    elif isinstance(exc, BooklineError):
                        errors.append(f"{tasks[task]}: {exc}")
                    else:
                        raise exc
        finally:
            # Slower replicas' adds finish on their own (also when this is cancelled);
            # every outcome is retrieved.
            for task in tasks:
                if task.done():
                    consume(task)
                else:
                    task.add_done_callback(self._log_late_rewrite)
        if acks < meta.ack_quorum:
            raise NotEnoughBookiesError(
                f"ledger {meta.ledger_id}: recovery add of entry {entry.entry_id} reached "
                f"{acks} bookies, Qa={meta.ack_quorum} needed: " + "; ".join(errors)
            )

    def _log_late_rewrite(self, task: asyncio.Future[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.warning("ledger %d: late recovery add failed: %s", self._ledger_id, exc)
