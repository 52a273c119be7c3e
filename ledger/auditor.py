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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bookline.errors import (
    AlreadyExistsError,
    BadVersionError,
    ClosedError,
    MetadataError,
    NotFoundError,
    SessionSuspendedError,
)
from metadata import serde
from metadata.bookies import BookieSet
from metadata.ledgers import LedgerMetadata
from metadata.zk import SessionState

if TYPE_CHECKING:
    from ledger.autorecovery import AutorecoveryConfig
    from metadata.client import MetadataClient

log = logging.getLogger(__name__)

__all__ = ["AUDITOR_KIND", "Auditor", "auditor_path", "current_leader"]

AUDITOR_KIND = "auditor"
AUDITOR_FORMAT_VERSION = 1
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
    ) -> None:
        self._md = md
        self._config = config
        self.auditor_id = auditor_id
        self._clock = clock
        self._path = auditor_path(md)
        self._absent_since: dict[str, float] = {}  # bookie -> clock time first seen absent
        self._handled: set[str] = set()  # absent past grace and covered by a scan
        self._registered: frozenset[str] = frozenset()
        self._changed = asyncio.Event()
        self.is_leader = False
        self.audits = 0  # completed scans (tests and logs)
        self.marked = 0  # ledgers marked under-replicated

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
            await self._resign()

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
        try:
            await self._lead_loop(lost)
        finally:
            self.is_leader = False
            watch.cancel()
            zk.remove_state_listener(on_state)
            log.info("auditor %s stepped down", self.auditor_id)

    async def _lead_loop(self, lost: asyncio.Event) -> None:
        zk = self._md.zk
        next_full = self._clock()  # a new leader scans at once
        while not lost.is_set():
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
                gone = {b for _first, ens in meta.ensembles for b in ens} - registered
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
