"""Replication workers: copy the fragments a lost bookie held to new bookies, and
re-copy entries a live bookie lacks or holds damaged.

A work item (``ledgers/underreplicated/<id>``, written by the auditor, decommission or
``bookline bookie scrub --repair``) names a ledger, the bookies it lost, and entry
ranges to repair on live bookies (the replica check, :mod:`ledger.scrub`). A worker:

1. takes the item's ephemeral claim (another worker's claim -> skip; a crashed
   worker's claim vanishes with its session);
2. reads the ledger. Deleted -> drop the item. OPEN, and its writer already swapped
   every lost bookie out of its ensemble (an ensemble change) -> its earlier, *sealed*
   segments are repaired as below and the writer is left alone (as BookKeeper does: a
   new segment starts after the last acknowledged entry, so the ones before it hold
   their final entries; the writer's next ensemble change takes the repaired segments
   over). Otherwise OPEN / IN_RECOVERY -> wait until the item is
   ``open_ledger_grace_ms`` old (its writer may be alive and will swap the bookie out
   itself), then run ledger recovery, which fences any writer and closes the ledger at
   its true end;
3. for every *fragment* -- one lost bookie's position in one sealed segment -- picks
   a replacement (writable, not in that ensemble, rack-aware, :func:`choose_replacement`),
   copies every entry of the segment whose write set includes that position from a
   surviving replica (digest verified, sent as the same packaged bytes with recovery
   adds under the ledger's master key), and only then compare-and-sets the metadata so
   the replacement takes the lost bookie's place in that segment. Metadata therefore
   never names a bookie that lacks the entries. Entries that surviving members of the
   segment lack (a writer closes once Qa replicas acknowledged) are filled in on the
   way, so a repaired segment is complete on every bookie it names;
4. for every live bookie with *repair entries* -- the entries of its ranges whose write
   set, per the current metadata, includes it -- reads a copy from another replica
   (digest verified), writes it to that same bookie with a recovery add (which replaces
   a copy the bookie holds as damaged), and reads it back to check the bookie now holds
   exactly those bytes. No metadata changes: the bookie already is where metadata says.
   A bookie in the item's lost set is skipped (its fragments moved), an unregistered one
   fails the pass (retried later; if it stays away the auditor marks it lost);
5. clears the item (and its claim, in one transaction).

Idempotent when interrupted: a copy without the CAS leaves unreferenced extra replicas
(harmless); after the CAS the lost bookie is no longer in the metadata, so a re-run
finds nothing left to do and clears the item.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from foundation.errors import (
    BadVersionError,
    BooklineError,
    ChecksumError,
    ConnectionLostError,
    InvariantViolation,
    LockOwnedError,
    MetadataError,
    NoLedgerError,
    NotFoundError,
    SessionSuspendedError,
    TimeoutError_,
)
from foundation.invariants import invariant
from ledger.digest import UnpackedEntry
from ledger.fragments import (
    Fragment,
    fragment_entries,
    fragments_to_replace,
    repair_plan,
    sealed_segments,
    segment_last,
    with_replacement,
    writer_replaced,
)
from ledger.keys import ledger_access
from ledger.placement import choose_replacement
from ledger.tasks import run_bounded
from metadata.ledger_metadata import LedgerMetadata
from metadata.underreplicated import EntryRanges, merge_ranges, ranges_cover

if TYPE_CHECKING:
    from ledger.autorecovery_config import AutorecoveryConfig
    from ledger.client import LedgerClient
    from metadata.client import MetadataClient

log = logging.getLogger(__name__)

__all__ = ["ListEntries", "Outcome", "ReplicationWorker"]

# Entry ids a bookie holds for a ledger (empty when it holds none); None: no listing,
# so holes on surviving replicas are not looked for.
# (bookie, ledger id, master key) -> entry ids the bookie holds
ListEntries = Callable[[str, int, bytes], Awaitable[Sequence[int]]]
# Ledgers remembered as "failed recently / deferred" per worker (bounded memory).
_BACKOFF_ENTRIES_MAX = 100_000
# Passes over a ledger when the auditor adds lost bookies while we repair it.
_PASSES_MAX = 5


class Outcome(enum.Enum):
    REPLICATED = "replicated"  # repaired and the item cleared
    GONE = "gone"  # the item or the ledger disappeared; nothing to do
    DEFERRED = "deferred"  # OPEN ledger within its grace period
    CLAIMED = "claimed"  # another worker holds the claim
    FAILED = "failed"  # an error; retried after the backoff


class ReplicationWorker:
    """Claims and repairs under-replicated ledgers. :meth:`run` loops until cancelled;
    :meth:`run_once` makes one pass over the work items (decommission and tests)."""

    def __init__(
        self,
        md: MetadataClient,
        client: LedgerClient,
        config: AutorecoveryConfig,
        worker_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        rng: random.Random | None = None,
        list_entries: ListEntries | None = None,
    ) -> None:
        self._md = md
        self._list_entries = list_entries
        self._client = client
        self._env = client.env
        self._config = config
        self.worker_id = worker_id
        self._clock = clock
        self._wall_ms = wall_ms
        self._rng = rng or random.Random()
        self._not_before: dict[int, float] = {}  # ledger id -> clock time of next try
        self.replicated = 0  # ledgers repaired by this worker (for summaries)
        self.entries_repaired = 0  # entries re-copied to live bookies (replica check)

    # -- loop ----------------------------------------------------------------------

    async def run(self) -> None:
        woken = asyncio.Event()
        watch = await self._md.zk.watch_children(
            self._md.layout.underreplicated_root, lambda _children: woken.set()
        )
        paused = False
        try:
            while True:
                woken.clear()
                try:
                    enabled = await self._md.underreplicated.replication_enabled()
                    if enabled != (not paused):
                        paused = not enabled
                        log.warning(
                            "replication worker %s: re-replication %s by an operator",
                            self.worker_id,
                            "paused" if paused else "resumed",
                        )
                    if enabled:
                        await self.run_once()
                except (MetadataError, SessionSuspendedError, NotFoundError) as exc:
                    # ZooKeeper unreachable or the root went away: try again later.
                    log.warning("replication worker %s: listing failed: %s", self.worker_id, exc)
                try:
                    async with asyncio.timeout(self._config.worker_poll_ms / 1000.0):
                        await woken.wait()
                except TimeoutError:
                    pass  # the periodic pass: deferred and failed ledgers come back
        finally:
            watch.cancel()

    async def run_once(self, only: Iterable[int] | None = None) -> dict[int, Outcome]:
        """Try every claimable item (or those in ``only``); ``ledgers_in_flight_max`` at once."""
        ids = await self._md.underreplicated.list()
        if only is not None:
            wanted = set(only)
            ids = [i for i in ids if i in wanted]
        now = self._clock()
        ids = [i for i in ids if self._not_before.get(i, 0.0) <= now]
        self._rng.shuffle(ids)  # workers started together should not all race for one item
        outcomes: dict[int, Outcome] = {}

        async def one(ledger_id: int) -> None:
            outcomes[ledger_id] = await self.process(ledger_id)

        await run_bounded(ids, one, self._config.ledgers_in_flight_max)
        return outcomes

    def _back_off(self, ledger_id: int, delay_ms: int) -> None:
        self._not_before[ledger_id] = self._clock() + delay_ms / 1000.0
        while len(self._not_before) > _BACKOFF_ENTRIES_MAX:
            del self._not_before[next(iter(self._not_before))]

    # -- one ledger ----------------------------------------------------------------

    async def process(self, ledger_id: int) -> Outcome:
        """Claim ``ledger_id``'s item, repair it, release the claim."""
        ur = self._md.underreplicated
        try:
            await ur.claim(ledger_id, self.worker_id)
        except LockOwnedError:
            return Outcome.CLAIMED
        try:
            try:
                async with asyncio.timeout(self._config.ledger_timeout_ms / 1000.0):
                    outcome = await self._repair(ledger_id)
            except TimeoutError as exc:
                raise TimeoutError_(
                    f"ledger {ledger_id}: repair took over {self._config.ledger_timeout_ms} ms"
                ) from exc
        except InvariantViolation:
            raise  # a bug, not an operating error: stop loudly
        except BooklineError as exc:
            log.warning(
                "worker %s: ledger %d not repaired, retry in %d ms: %s",
                self.worker_id,
                ledger_id,
                self._config.retry_backoff_ms,
                exc,
            )
            self._back_off(ledger_id, self._config.retry_backoff_ms)
            self._env.metrics.replication_failures += 1
            outcome = Outcome.FAILED
        finally:
            await ur.release(ledger_id)  # a no-op after clear() took it with the item
        if outcome is Outcome.DEFERRED:
            self._back_off(ledger_id, self._config.worker_poll_ms)
        elif outcome is not Outcome.FAILED:
            self._not_before.pop(ledger_id, None)
        return outcome

    async def _repair(self, ledger_id: int) -> Outcome:
        ur = self._md.underreplicated
        store = self._env.store
        try:
            item = await ur.get(ledger_id)
        except NotFoundError:
            return Outcome.GONE  # repaired and cleared by someone else meanwhile
        try:
            meta, _version = await store.read(ledger_id)
        except NoLedgerError:
            log.info("ledger %d was deleted; dropping its under-replication item", ledger_id)
            await ur.clear(ledger_id)
            return Outcome.GONE
        lost = set(item.missing_bookies)
        repairs = dict(item.repair_entries)
        if not meta.is_closed and (repairs or not writer_replaced(meta, lost)):
            age_ms = self._wall_ms() - item.ctime_ms
            if age_ms < self._config.open_ledger_grace_ms:
                log.info(
                    "ledger %d is %s; waiting for its writer (%d of %d ms)",
                    ledger_id,
                    meta.state.value,
                    age_ms,
                    self._config.open_ledger_grace_ms,
                )
                return Outcome.DEFERRED
            log.info("ledger %d is %s past its grace: recovering it", ledger_id, meta.state.value)
            await self._client.open_ledger(ledger_id, recover=True)
        for _ in range(_PASSES_MAX):
            if not await self._replace_all(ledger_id, lost):
                return Outcome.DEFERRED  # a bookie its writer still uses was added: wait
            await self._repair_entries(ledger_id, repairs, lost)
            try:
                latest = await ur.get(ledger_id)
            except NotFoundError:
                return Outcome.GONE
            covered = all(
                ranges_cover(repairs.get(b, ()), r) for b, r in latest.repair_entries.items()
            )
            if latest.missing_bookies <= lost and covered:
                try:
                    await ur.clear(ledger_id, latest.version)
                except BadVersionError:
                    continue  # marked again since we read it: look at what was added
                self.replicated += 1
                self._env.metrics.ledgers_replicated += 1
                log.info(
                    "ledger %d repaired (lost %s, entries re-copied to %s)",
                    ledger_id,
                    sorted(lost),
                    sorted(repairs),
                )
                return Outcome.REPLICATED
            lost |= latest.missing_bookies  # the auditor found more while we worked
            for bookie, ranges in latest.repair_entries.items():
                repairs[bookie] = merge_ranges((*repairs.get(bookie, ()), *ranges))
        raise BadVersionError(f"ledger {ledger_id}: its work item kept changing during repair")

    async def _replace_all(self, ledger_id: int, lost: set[str]) -> bool:
        """Move every fragment of ``lost`` to other bookies: all of a CLOSED ledger's;
        of an OPEN one whose writer swapped them out of its ensemble, those of its
        sealed segments, leaving the writer alone. False (nothing done) when the writer
        of an OPEN ledger still writes to one of them."""
        meta, _version = await self._env.store.read(ledger_id)
        if not meta.is_closed and not writer_replaced(meta, lost):
            return False
        for fragment in fragments_to_replace(meta, lost):
            meta = await self._replace(meta, fragment, lost)
        remaining = {b for s in meta.segments[: sealed_segments(meta)] for b in s.bookies} & lost
        invariant(not remaining, "ledger %d still on lost bookies %r", ledger_id, remaining)
        return True

    async def _repair_entries(
        self, ledger_id: int, repairs: Mapping[str, EntryRanges], lost: set[str]
    ) -> None:
        """Re-copy each live bookie's repair entries to it (see the module, step 4)."""
        if not repairs:
            return
        meta, _version = await self._env.store.read(ledger_id)
        plan = repair_plan(meta, repairs, lost)
        if not plan:
            return
        registered = (await self._md.bookies.list_all()).all
        absent = {b for targets in plan.values() for b in targets} - registered
        if absent:
            raise ConnectionLostError(
                f"ledger {ledger_id}: bookies {sorted(absent)} with entries to repair are "
                "not registered"
            )
        targets = sorted({b for bs in plan.values() for b in bs})
        log.info("ledger %d: re-copying %d entries to %s", ledger_id, len(plan), ", ".join(targets))
        await self._copy(meta, plan, lost - registered, read_back=True)
        repaired = sum(len(bs) for bs in plan.values())
        self.entries_repaired += repaired
        log.info("ledger %d: %d entry copies repaired on %s", ledger_id, repaired, targets)

    async def _replace(
        self, meta: LedgerMetadata, fragment: Fragment, lost: set[str]
    ) -> LedgerMetadata:
        store = self._env.store
        candidates = [c for c in await store.writable_bookies() if c.bookie_id not in lost]
        ensemble = meta.segments[fragment.segment_index].bookies
        replacement = choose_replacement(
            candidates,
            ensemble,
            fragment.position,
            meta.write_quorum,
            avoid=self._env.health.avoided() | lost,
            racks={c.bookie_id: c.rack for c in candidates},
            rng=self._rng,
        )
        registered = (await self._md.bookies.list_all()).all
        # A lost bookie that is still up (decommission) is a fine source; dead ones are not.
        unusable = (lost - registered) | {replacement}
        plan: dict[int, list[str]] = {
            e: [replacement]
            for e in fragment_entries(fragment, meta.ensemble_size, meta.write_quorum)
        }
        survivors = [b for b in ensemble if b in registered and b not in lost]
        await self._plan_holes(meta, fragment, survivors, plan)
        log.info(
            "ledger %d: copying %d entries of segment %d from %s to %s (%d holes on others)",
            meta.ledger_id,
            len(plan),
            fragment.first_entry_id,
            fragment.bookie,
            replacement,
            sum(len(targets) - 1 for targets in plan.values()),
        )
        await self._copy(meta, plan, unusable)
        return await self._swap(meta, fragment, replacement)

    async def _plan_holes(
        self,
        meta: LedgerMetadata,
        fragment: Fragment,
        survivors: list[str],
        plan: dict[int, list[str]],
    ) -> None:
        """Add to ``plan`` the entries of the segment that surviving members of their
        write sets lack (a writer closes once Qa replicas acknowledged; the others may
        never have been sent), so the repaired segment is complete on every bookie."""
        if self._list_entries is None:
            return
        ensemble = meta.segments[fragment.segment_index].bookies
        key = ledger_access(meta, self._env.secret).master_key
        for bookie in survivors:
            held = set(await self._list_entries(bookie, meta.ledger_id, key))
            position = ensemble.index(bookie)
            part = dataclasses.replace(fragment, position=position, bookie=bookie)
            for entry_id in fragment_entries(part, meta.ensemble_size, meta.write_quorum):
                if entry_id not in held:
                    plan.setdefault(entry_id, []).append(bookie)

    async def _copy(
        self,
        meta: LedgerMetadata,
        plan: dict[int, list[str]],
        unusable: set[str],
        *,
        read_back: bool = False,
    ) -> None:
        """For each entry, read it from a replica that holds it and recovery-add it to
        each target bookie; with ``read_back``, then check each target serves exactly
        the bytes written (ChecksumError otherwise)."""
        env = self._env
        access = ledger_access(meta, env.secret)
        digest, key = access.digest, access.master_key
        read_timeout_s = env.read_timeout_s

        async def copy_one(entry_id: int) -> None:
            async def attempt(bookie: str) -> tuple[UnpackedEntry, bytes]:
                ans = await env.transport.read(
                    bookie,
                    meta.ledger_id,
                    entry_id,
                    fence=False,
                    master_key=key,
                    timeout_s=read_timeout_s,
                )
                return digest.verify(ans.data, entry_id), ans.data

            targets = plan[entry_id]
            sources = [b for b in meta.replicas(entry_id) if b not in unusable and b not in targets]
            entry, data = await env.speculative(
                sources,
                attempt,
                what=f"re-replication read of ledger {meta.ledger_id} entry {entry_id}",
            )
            adders = [
                env.transport.adder(
                    target, meta.ledger_id, key, recovery=True, timeout_s=env.add_timeout_s
                )
                for target in targets
            ]
            results = await asyncio.gather(
                *(adder.add(entry_id, entry.lac, data) for adder in adders),
                return_exceptions=True,  # every add settles before we report the first error
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            env.metrics.entries_copied += len(targets)
            env.metrics.bytes_copied += len(data) * len(targets)
            if read_back:
                for target in targets:
                    await self._check_copy(
                        meta, entry_id, target, data, key=key, timeout_s=read_timeout_s
                    )

        await run_bounded(sorted(plan), copy_one, self._config.entries_in_flight_max)

    async def _check_copy(
        self,
        meta: LedgerMetadata,
        entry_id: int,
        bookie: str,
        data: bytes,
        *,
        key: bytes,
        timeout_s: float,
    ) -> None:
        ans = await self._env.transport.read(
            bookie, meta.ledger_id, entry_id, fence=False, master_key=key, timeout_s=timeout_s
        )
        if ans.data != data:
            raise ChecksumError(
                f"ledger {meta.ledger_id} entry {entry_id}: bookie {bookie} still serves "
                "other bytes after the repair"
            )

    async def _swap(
        self, copied: LedgerMetadata, fragment: Fragment, replacement: str
    ) -> LedgerMetadata:
        """CAS ``replacement`` into the fragment's place; re-read and re-apply on a lost race."""
        store = self._env.store
        for _ in range(self._env.config.metadata_cas_retries_max):
            meta, version = await store.read(copied.ledger_id)
            # A sealed segment's entries never change, also while its writer goes on
            # (the ledger may be closed meanwhile, at or after the segment's end).
            index = fragment.segment_index
            invariant(
                index < sealed_segments(meta)
                and segment_last(meta, index) == fragment.last_entry_id,
                "ledger %d: end of segment %d moved during re-replication (%d -> %d)",
                meta.ledger_id,
                fragment.first_entry_id,
                fragment.last_entry_id,
                segment_last(meta, min(index, len(meta.segments) - 1)),
            )
            seg = meta.segments[index]
            if seg.first_entry_id != fragment.first_entry_id:
                raise BadVersionError(f"ledger {meta.ledger_id}: segments changed under repair")
            if seg.bookies[fragment.position] != fragment.bookie:
                raise BadVersionError(
                    f"ledger {meta.ledger_id}: position {fragment.position} of segment "
                    f"{fragment.first_entry_id} is now {seg.bookies[fragment.position]}"
                )
            if replacement in seg.bookies:
                raise BadVersionError(
                    f"ledger {meta.ledger_id}: {replacement} joined segment "
                    f"{fragment.first_entry_id} meanwhile"
                )
            new = with_replacement(meta, fragment, replacement)
            try:
                await store.write(new, version)
            except BadVersionError:
                continue
            log.info(
                "ledger %d: segment %d position %d is now %s (was %s)",
                meta.ledger_id,
                fragment.first_entry_id,
                fragment.position,
                replacement,
                fragment.bookie,
            )
            return new
        raise MetadataError(
            f"ledger {copied.ledger_id}: re-replication lost the metadata CAS "
            f"{self._env.config.metadata_cas_retries_max} times"
        )
