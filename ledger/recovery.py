"""Ledger recovery: fence the writer out, find the true end, close the ledger.

Opening a ledger another writer may still hold (BookKeeper's recovery, with the two fixes a TLA+
model of its protocol found: fence until no write set can reach Qa, and call an entry absent
only when Qw - Qa + 1 bookies say so):

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
import logging
from collections.abc import Awaitable
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
from foundation.quorum import write_set
from ledger.digest import DigestManager, UnpackedEntry
from ledger.env import LedgerEnv
from ledger.interfaces import ReadAnswer
from ledger.keys import LedgerAccess, check_legacy_password, ledger_access
from ledger.tasks import abandon, gather_answers
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

    def __init__(self, ledger_id: int, env: LedgerEnv) -> None:
        self._ledger_id = ledger_id
        self._env = env

    async def run(self, password: bytes | None = None) -> RecoveryResult:
        """Recover the ledger (``password``: checked against a legacy ledger's own, see
        :func:`ledger.keys.check_legacy_password`)."""
        store, retries = self._env.store, self._env.config.metadata_cas_retries_max
        for _attempt in range(retries):
            meta, version = await store.read(self._ledger_id)
            check_legacy_password(meta, password)
            if meta.is_closed:
                return RecoveryResult(meta, version, recovered_by_us=False)
            # The key first: a client that cannot have it changes nothing, not even state.
            access = ledger_access(meta, self._env.secret)
            if meta.state is LedgerState.OPEN:
                marked = meta.with_state(LedgerState.IN_RECOVERY)
                try:
                    version = await store.write(marked, version)
                except BadVersionError:
                    continue  # the writer changed the ensemble, or another opener marked it
                meta = marked
            last_entry_id, length = await self._find_end(meta, access)
            closed = meta.closed(last_entry_id, length)
            try:
                version = await store.write(closed, version)
            except BadVersionError:
                continue  # another recovery closed it (or re-marked): re-read and adopt
            log.info(
                "ledger %d recovered: last entry %d, %d bytes",
                self._ledger_id,
                last_entry_id,
                length,
            )
            self._env.metrics.recoveries += 1
            return RecoveryResult(closed, version, recovered_by_us=True)
        raise MetadataError(
            f"ledger {self._ledger_id}: recovery lost the metadata CAS {retries} times"
        )

    # -- steps ---------------------------------------------------------------------

    async def _find_end(self, meta: LedgerMetadata, access: LedgerAccess) -> tuple[int, int]:
        key, digest = access.master_key, access.digest
        max_lac = await self._fence(meta, key)
        start = max(max_lac, meta.last_segment.first_entry_id - 1)
        length = 0
        if start >= 0:
            length = (await self._read_committed(meta, digest, key, start)).length
        return await self._read_forward(meta, digest, key, start, length)

    async def _fence(self, meta: LedgerMetadata, key: bytes) -> int:
        """Fence the last ensemble (step 2); return the highest LAC a bookie reported."""
        bookies = meta.last_segment.bookies
        e, qw, qa = meta.ensemble_size, meta.write_quorum, meta.ack_quorum
        sets = [write_set(i, e, qw) for i in range(e)]
        timeout_s = self._env.config.fence_timeout_ms / 1000.0
        fenced: set[int] = set()
        max_lac = NO_ENTRY

        def enough() -> bool:
            return all(sum(1 for p in ws if p not in fenced) < qa for ws in sets)

        def judge(pos: int, outcome: ReadAnswer | BooklineError) -> bool:
            nonlocal max_lac
            if isinstance(outcome, ReadAnswer):
                fenced.add(pos)
                max_lac = max(max_lac, outcome.lac)
            elif isinstance(outcome, _ABSENT):
                fenced.add(pos)  # fenced; holds no entry, so its LAC is -1
            elif isinstance(outcome, UnauthorizedError):
                raise outcome
            else:
                log.warning(
                    "ledger %d: fencing %s failed: %s", meta.ledger_id, bookies[pos], outcome
                )
                self._env.health.record_failure(bookies[pos])
            return enough()

        def fence(bookie: str) -> Awaitable[ReadAnswer]:
            return self._env.transport.read(
                bookie, meta.ledger_id, NO_ENTRY, fence=True, master_key=key, timeout_s=timeout_s
            )

        await gather_answers({pos: fence(b) for pos, b in enumerate(bookies)}, judge)
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
        self, meta: LedgerMetadata, digest: DigestManager, key: bytes, entry_id: int
    ) -> UnpackedEntry:
        async def attempt(bookie: str) -> UnpackedEntry:
            ans = await self._env.transport.read(
                bookie,
                meta.ledger_id,
                entry_id,
                fence=False,
                master_key=key,
                timeout_s=self._env.read_timeout_s,
            )
            return digest.verify(ans.data, entry_id)

        try:
            return await self._env.speculative(
                meta.replicas(entry_id),
                attempt,
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
        window_max = self._env.config.reads_in_flight_max
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
        absent_needed = meta.write_quorum - meta.ack_quorum + 1
        timeout_s = self._env.read_timeout_s
        absent = 0
        found: tuple[UnpackedEntry, bytes] | None = None
        errors: list[BooklineError] = []

        def judge(_bookie: str, outcome: ReadAnswer | BooklineError) -> bool:
            nonlocal absent, found
            if found is not None or absent >= absent_needed:
                return True  # decided by an earlier answer of the same batch
            if isinstance(outcome, _ABSENT):
                absent += 1
            elif isinstance(outcome, UnauthorizedError):
                raise outcome
            elif isinstance(outcome, BooklineError):
                errors.append(outcome)
            else:
                try:
                    found = digest.verify(outcome.data, entry_id), outcome.data
                except ChecksumError as bad:
                    errors.append(bad)
            return found is not None or absent >= absent_needed

        # An early answer leaves other replicas' reads running or finished (a dead
        # bookie's error among them): they are cancelled and every outcome retrieved.
        def read(bookie: str) -> Awaitable[ReadAnswer]:
            return self._env.transport.read(
                bookie, meta.ledger_id, entry_id, fence=True, master_key=key, timeout_s=timeout_s
            )

        await gather_answers({b: read(b) for b in meta.replicas(entry_id)}, judge)
        if found is not None:
            return found
        if absent >= absent_needed:
            return None
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
        acks = 0
        errors: list[str] = []

        def judge(bookie: str, outcome: BooklineError | None) -> bool:
            nonlocal acks
            if outcome is None:
                acks += 1
            else:
                errors.append(f"{bookie}: {outcome}")
            return acks >= meta.ack_quorum

        def add(bookie: str) -> Awaitable[None]:
            adder = self._env.transport.adder(
                bookie, meta.ledger_id, key, recovery=True, timeout_s=self._env.add_timeout_s
            )
            return adder.add(entry.entry_id, entry.lac, data)

        # Slower replicas' adds finish on their own (also when this is cancelled); every
        # outcome is retrieved.
        await gather_answers(
            {b: add(b) for b in meta.replicas(entry.entry_id)},
            judge,
            leave_running=self._log_late_rewrite,
        )
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
