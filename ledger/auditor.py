"""The auditor: notices bookies gone for good and marks their ledgers under-replicated.

Exactly one auditor acts at a time. Candidates race to create the ephemeral node
``<root>/ledgers/auditor`` (data: the candidate's id); the winner audits, the others
watch the node and try again when it disappears -- when the leader's session ends.
After a session loss the leader stops and stands for election again.

The leader watches the bookie registry. A bookie that is referenced by some ledger but
registered neither writable nor read-only is *absent*; once it has been absent for
``grace_ms`` (a restart is not a failure) the leader scans every ledger and marks each
one whose ensembles include it (``ledgers/underreplicated/<id>``, merged with any
bookies already recorded). The same scan also runs every ``full_check_interval_ms`` and
when a leader takes over, so a failure missed across a failover is still found: a
bookie first seen absent during a scan gets its grace period from that moment.

The leader also runs the *replica check* (:mod:`ledger.scrub`), which finds entries a
live bookie lacks or holds damaged, and marks them in the same work items (as entry
ranges per bookie): every ``damaged_poll_interval_ms`` it asks each registered bookie
which entries its storage found damaged (cheap), and every
``replica_check_interval_ms`` it compares the replicas of every closed ledger. The time
the last full check finished is kept in ``ledgers/replicacheck``, so an auditor that
takes over keeps the schedule instead of starting the hour again (or checking at once
after every restart).

Every ``orphan_check_interval_ms`` the leader also deletes the ledgers a dead stream
writer created in advance and left behind (:mod:`ledger.orphans`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from foundation.errors import (
    AlreadyExistsError,
    BadVersionError,
    BooklineError,
    ClosedError,
    InvariantViolation,
    MetadataError,
    NotFoundError,
    SessionSuspendedError,
)
from ledger.orphans import OrphanCollector
from ledger.tasks import cancel_and_wait
from metadata import serde
from metadata.bookies import BookieSet
from metadata.ledger_metadata import LedgerMetadata
from metadata.zk import SessionState

if TYPE_CHECKING:
    from ledger.autorecovery_config import AutorecoveryConfig
    from ledger.scrub import LedgerReport, Scrubber, ScrubSummary
    from metadata.client import MetadataClient

log = logging.getLogger(__name__)

__all__ = ["AUDITOR_KIND", "Auditor", "auditor_path", "current_leader"]

AUDITOR_KIND = "auditor"
AUDITOR_FORMAT_VERSION = 1
REPLICA_CHECK_KIND = "replicacheck"
REPLICA_CHECK_FORMAT_VERSION = 1
# Operating errors after which the auditor tries again (ZooKeeper unreachable, a lost
# session, contention on a work item); anything else is a bug and stops it.
_TRANSIENT = (MetadataError, SessionSuspendedError, BadVersionError)
# Absent bookies tracked at once (bounded memory; a cluster has far fewer bookies).
_ABSENT_TRACKED_MAX = 10_000


def auditor_path(md: MetadataClient) -> str:
    """The election node (``ledgers/auditor``)."""
    return md.layout.auditor


class Auditor:
    """One candidate; :meth:`run` stands for election and audits while elected."""

    def __init__(
        self,
        md: MetadataClient,
        config: AutorecoveryConfig,
        auditor_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        scrubber: Scrubber | None = None,
    ) -> None:
        self._md = md
        self._config = config
        self.auditor_id = auditor_id
        self._clock = clock
        self._wall_ms = wall_ms
        self._scrubber = scrubber
        self._path = auditor_path(md)
        self._absent_since: dict[str, float] = {}  # bookie -> clock time first seen absent
        self._handled: set[str] = set()  # absent past grace and covered by a scan
        self._registered: frozenset[str] = frozenset()
        self._changed = asyncio.Event()
        self.is_leader = False
        self.audits = 0  # completed scans (tests and logs)
        self.marked = 0  # ledgers marked under-replicated
        self.replica_checks = 0  # completed full replica checks
        self.damaged_sweeps = 0  # completed damaged-entry sweeps
        self.replica_marked = 0  # ledgers marked by either, for entries on live bookies
        self.orphans = OrphanCollector(
            md,
            min_age_ms=config.orphan_ledger_age_ms,
            reads_in_flight_max=config.audit_reads_in_flight_max,
            wall_ms=wall_ms,
        )

    # -- election --------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: win the election, audit until the session is lost, repeat."""
        try:
            while True:
                try:
                    await self._elect()
                    await self._lead()
                except _TRANSIENT as exc:
                    log.warning("auditor %s: %s; standing again shortly", self.auditor_id, exc)
                    await asyncio.sleep(self._config.election_poll_ms / 1000.0)
        finally:
            await self._md.zk.tidy(self._resign(), f"auditor {self.auditor_id}'s resignation")

    async def _resign(self) -> None:
        """Give up the election node now (when stopped while the session lives on, as
        in an embedding process), so the next candidate need not wait for expiry."""
        zk = self._md.zk
        if zk.closed:
            return  # the session ended: ZooKeeper removed the node already
        try:
            stat = await zk.exists(self._path)
            if stat is not None and stat.ephemeral_owner == zk.session_id:
                await zk.delete(self._path, stat.version)
                log.info("auditor %s resigned", self.auditor_id)
        except (NotFoundError, BadVersionError):
            pass  # no longer ours: nothing to give up
        except (MetadataError, SessionSuspendedError, ClosedError) as exc:
            log.warning(
                "auditor %s: could not resign (%s); the node goes with the session",
                self.auditor_id,
                exc,
            )

    async def _elect(self) -> None:
        zk = self._md.zk
        body = serde.encode(AUDITOR_KIND, AUDITOR_FORMAT_VERSION, {"id": self.auditor_id})
        while True:
            try:
                await zk.create(self._path, body, ephemeral=True, makepath=True)
                log.info("auditor %s elected", self.auditor_id)
                return
            except AlreadyExistsError:
                if await self._wait_for_vacancy():
                    log.info("auditor %s still holds the election node", self.auditor_id)
                    return

    async def _wait_for_vacancy(self) -> bool:
        """Wait until the election node changes (or a poll interval passed); True if the
        node is ours already (our session survived a disconnection)."""
        zk = self._md.zk
        changed = asyncio.Event()

        def on_event(_event: Any) -> None:
            zk.call_in_loop(changed.set)  # kazoo's thread

        stat = await zk.exists(self._path, watch=on_event)
        if stat is None:
            return False
        if stat.ephemeral_owner == zk.session_id:
            return True
        with contextlib.suppress(TimeoutError):  # periodic look without an event
            async with asyncio.timeout(self._config.election_poll_ms / 1000.0):
                await changed.wait()
        return False

    async def _lead(self) -> None:
        zk = self._md.zk
        lost = asyncio.Event()

        def on_state(state: SessionState) -> None:
            if state is SessionState.LOST:
                lost.set()
            self._changed.set()

        zk.add_state_listener(on_state)
        watch = await self._md.bookies.watch(self._on_membership)
        self.is_leader = True
        checks: list[asyncio.Task[None]] = []
        if self._scrubber is not None:
            checks.append(asyncio.create_task(self._replica_loop(), name="replica-check"))
        if self._config.orphan_check_interval_ms:
            checks.append(asyncio.create_task(self._orphan_loop(), name="orphan-collection"))
        try:
            await self._lead_loop(lost, checks)
        finally:
            self.is_leader = False
            await cancel_and_wait(checks)
            watch.cancel()
            zk.remove_state_listener(on_state)
            log.info("auditor %s stepped down", self.auditor_id)

    async def _lead_loop(self, lost: asyncio.Event, checks: list[asyncio.Task[None]]) -> None:
        zk = self._md.zk
        next_full = self._clock()  # a new leader scans at once
        while not lost.is_set():
            for task in checks:
                if task.done():
                    task.result()  # the replica check only ends on a bug: raise it
            now = self._clock()
            due = now >= next_full or self._grace_ran_out(now)
            if zk.state is SessionState.CONNECTED and due:
                try:
                    await self.audit()
                    next_full = self._clock() + self._config.full_check_interval_ms / 1000.0
                except _TRANSIENT as exc:
                    log.warning("auditor %s: audit failed, retrying: %s", self.auditor_id, exc)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):  # periodic grace check
                async with asyncio.timeout(self._config.audit_poll_ms / 1000.0):
                    await self._changed.wait()

    # -- membership ------------------------------------------------------------------

    def _on_membership(self, members: BookieSet) -> None:
        now = self._clock()
        previous = self._registered
        self._registered = members.all
        for bookie in previous - members.all:
            self._note_absent(bookie, now)
            log.info("bookie %s left the registry", bookie)
        for bookie in members.all:
            self._absent_since.pop(bookie, None)
            self._handled.discard(bookie)
        self._changed.set()

    def _note_absent(self, bookie: str, now: float) -> None:
        if bookie not in self._absent_since and len(self._absent_since) < _ABSENT_TRACKED_MAX:
            self._absent_since[bookie] = now

    def _grace_ran_out(self, now: float) -> bool:
        grace_s = self._config.grace_ms / 1000.0
        return any(
            now - since >= grace_s and bookie not in self._handled
            for bookie, since in self._absent_since.items()
        )

    # -- the scan --------------------------------------------------------------------

    async def audit(self) -> int:
        """Check every ledger against the registry; mark those on bookies absent past
        the grace period. Returns the number of ledgers marked."""
        registered = (await self._md.bookies.list_all()).all
        for bookie in registered:
            self._absent_since.pop(bookie, None)
            self._handled.discard(bookie)
        now = self._clock()
        grace_s = self._config.grace_ms / 1000.0
        marked = 0
        batch: list[int] = []

        async def flush() -> None:
            nonlocal marked
            metas = await asyncio.gather(*(self._read(i) for i in batch))
            batch.clear()
            for meta in metas:
                if meta is None:
                    continue
                gone = meta.all_bookies() - registered
                for bookie in gone:
                    self._note_absent(bookie, now)
                expired = {
                    b
                    for b in gone
                    if b in self._absent_since and now - self._absent_since[b] >= grace_s
                }
                if expired:
                    await self._md.underreplicated.mark(meta.ledger_id, expired)
                    marked += 1
                    log.info("ledger %d under-replicated: lost %s", meta.ledger_id, sorted(expired))

        async for ledger_id in self._md.ledgers.iter_ledger_ids():
            batch.append(ledger_id)
            if len(batch) >= self._config.audit_reads_in_flight_max:
                await flush()
        await flush()
        self._handled = {b for b, since in self._absent_since.items() if now - since >= grace_s}
        self.audits += 1
        self.marked += marked
        log.info(
            "audit %d: %d ledgers marked; absent bookies %s",
            self.audits,
            marked,
            sorted(self._absent_since),
        )
        return marked

    # -- replica check ---------------------------------------------------------------

    async def _replica_loop(self) -> None:
        """While leading: damaged-entry sweeps and full replica checks on schedule.
        Operating errors are logged and the step is tried again at its next turn."""
        cfg = self._config
        full_s = cfg.replica_check_interval_ms / 1000.0
        sweep_s = cfg.damaged_poll_interval_ms / 1000.0
        never = float("inf")
        next_full = await self._first_replica_check(full_s) if full_s else never
        next_sweep = self._clock() if sweep_s else never
        while True:
            if self._clock() >= next_sweep:
                await self._step("damaged-entry sweep", self.damaged_sweep)
                next_sweep = self._clock() + sweep_s
            if self._clock() >= next_full:
                await self._step("replica check", self.replica_check)
                next_full = self._clock() + full_s
            await asyncio.sleep(max(0.0, min(next_sweep, next_full) - self._clock()))

    async def _orphan_loop(self) -> None:
        """While leading: collect orphaned stream ledgers, at once and then on schedule."""
        interval_s = self._config.orphan_check_interval_ms / 1000.0
        while True:
            await self._step("orphan collection", self.orphans.collect)
            await asyncio.sleep(interval_s)

    async def _step(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        try:
            await step()
        except InvariantViolation:
            raise
        except BooklineError as exc:
            log.warning("auditor %s: %s failed, next turn retries: %s", self.auditor_id, what, exc)

    async def _first_replica_check(self, interval_s: float) -> float:
        """Clock time of the first full check: ``interval`` after the last one finished
        (by any auditor), at once when none is recorded."""
        path = self._md.layout.replica_check
        try:
            data, _version = await self._md.zk.get(path)
        except NotFoundError:
            return self._clock()
        _v, body = serde.decode(data, REPLICA_CHECK_KIND, REPLICA_CHECK_FORMAT_VERSION, path)
        done_ms = int(serde.field(body, "completed_ms", int, path))
        wait_s = max(0.0, min(interval_s, interval_s - (self._wall_ms() - done_ms) / 1000.0))
        log.info("auditor %s: next replica check in %.0f s", self.auditor_id, wait_s)
        return self._clock() + wait_s

    async def _note_replica_check(self) -> None:
        path = self._md.layout.replica_check
        body = serde.encode(
            REPLICA_CHECK_KIND,
            REPLICA_CHECK_FORMAT_VERSION,
            {"completed_ms": self._wall_ms(), "by": self.auditor_id},
        )
        try:
            await self._md.zk.set(path, body)
        except NotFoundError:
            try:
                await self._md.zk.create(path, body, makepath=True)
            except AlreadyExistsError:
                await self._md.zk.set(path, body)  # another auditor just wrote it

    async def replica_check(self) -> ScrubSummary:
        """Compare the replicas of every closed ledger; mark what live bookies lack."""
        scrubber = self._scrubber
        if scrubber is None:
            raise InvariantViolation("replica check without a scrubber")
        marked = 0

        async def mark(report: LedgerReport) -> None:
            nonlocal marked
            if report.repairs:
                await self._md.underreplicated.mark(report.ledger_id, repair_entries=report.repairs)
                marked += 1

        registered = (await self._md.bookies.list_all()).all
        summary = await scrubber.check_all(
            self._md.ledgers.iter_ledger_ids(), mark, registered=registered
        )
        await self._note_replica_check()
        self.replica_checks += 1
        self.replica_marked += marked
        log.info(
            "replica check %d: %d ledgers (%d entries) checked, %d skipped, %d marked for repair",
            self.replica_checks,
            summary.ledgers_checked,
            summary.entries_checked,
            summary.ledgers_skipped,
            marked,
        )
        return summary

    async def damaged_sweep(self) -> int:
        """Ask every registered bookie which entries it found damaged; mark those of
        closed ledgers it must hold. Returns the number of ledgers marked."""
        scrubber = self._scrubber
        if scrubber is None:
            raise InvariantViolation("damaged-entry sweep without a scrubber")
        registered = (await self._md.bookies.list_all()).all
        repairs, unchecked = await scrubber.damaged_repairs(registered)
        for bookie, error in sorted(unchecked.items()):
            log.warning("damaged-entry sweep: bookie %s not asked: %s", bookie, error)
        for ledger_id, ranges in repairs.items():
            await self._md.underreplicated.mark(ledger_id, repair_entries=ranges)
            log.info("ledger %d: damaged entries reported on %s", ledger_id, sorted(ranges))
        self.damaged_sweeps += 1
        self.replica_marked += len(repairs)
        return len(repairs)

    async def _read(self, ledger_id: int) -> LedgerMetadata | None:
        try:
            meta, _version = await self._md.ledgers.read(ledger_id)
        except NotFoundError:
            return None  # deleted while we scanned
        return meta


async def current_leader(md: MetadataClient) -> str | None:
    """The id of the elected auditor, or None when there is none."""
    path = auditor_path(md)
    try:
        data, _version = await md.zk.get(path)
    except NotFoundError:
        return None
    _v, body = serde.decode(data, AUDITOR_KIND, AUDITOR_FORMAT_VERSION, path)
    return str(serde.field(body, "id", str, path))
