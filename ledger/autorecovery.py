"""Autorecovery: the auditor and replication workers as one embeddable service, and
bookie decommission.

::

    ar = await Autorecovery.connect("127.0.0.1:2181", "/bookline", AutorecoveryConfig())
    await ar.start()          # stands for auditor election, runs a replication worker
    ...
    await ar.stop()

:class:`Autorecovery` runs inside ``bookline autorecovery`` and can be embedded in any
process that has an event loop (a bookie, later). The pieces live in
:mod:`ledger.auditor` (election + scans), :mod:`ledger.scrub` (the replica check the
elected auditor runs) and :mod:`ledger.replication` (workers).

:func:`decommission` drains a live bookie: it marks every ledger referencing the bookie
under-replicated and runs a worker until no ledger metadata names it any more.

:func:`scrub` runs the replica check by hand (``bookline bookie scrub``): it reports what
live bookies lack, and with ``repair`` marks it and runs a worker until it is repaired.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence

from bookie.client import BookieClientPool
from foundation.config import MetadataConfig
from foundation.errors import NoLedgerError, NotFoundError, TimeoutError_
from ledger.adapters import PoolTransport, ZkLedgerStore
from ledger.auditor import Auditor
from ledger.autorecovery_config import ENV_PREFIX, AutorecoveryConfig
from ledger.client import LedgerClient
from ledger.config import LedgerConfig
from ledger.interfaces import ReplicaInspector
from ledger.keys import bookie_identity
from ledger.replication import ListEntries, Outcome, ReplicationWorker
from ledger.scrub import Scrubber, ScrubSummary
from metadata.client import MetadataClient

log = logging.getLogger(__name__)

__all__ = [
    "ENV_PREFIX",
    "Autorecovery",
    "AutorecoveryConfig",
    "DecommissionSummary",
    "ScrubOutcome",
    "decommission",
    "ledgers_on",
    "make_scrubber",
    "scrub",
]


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def connect_parts(
    metadata: MetadataConfig, ledger_config: LedgerConfig | None = None
) -> tuple[MetadataClient, LedgerClient, ListEntries, ReplicaInspector]:
    """One ZooKeeper session shared by the metadata stores and a ledger client (whose
    ``close`` also closes the bookie pool and the session), an entry lister and the
    replica check's inspector on that pool. NotFoundError when no cluster was
    initialised at the root."""
    md = MetadataClient(metadata)
    await md.connect()
    try:
        # Never create a cluster here: a mistyped root must fail, not start an empty one.
        await md.cluster.read()
    except BaseException:
        await md.close()
        raise
    identity = bookie_identity(ledger_config or LedgerConfig())
    store = ZkLedgerStore(md.ledgers, md.bookies, md.ledger_ids, identity=identity)
    pool = BookieClientPool(identity=identity)
    transport = PoolTransport(pool, store.address_of)
    list_timeout_s = (ledger_config or LedgerConfig()).read_timeout_ms / 1000.0

    async def list_entries(bookie: str, ledger_id: int, master_key: bytes) -> Sequence[int]:
        conn = pool.get(await store.address_of(bookie))
        try:
            return await conn.list_entries(
                ledger_id, master_key=master_key, timeout_s=list_timeout_s
            )
        except NoLedgerError:
            return ()  # holds no entry of it

    async def close() -> None:
        try:
            await pool.close()
        finally:
            await md.close()

    client = LedgerClient(store, transport, ledger_config, on_close=close)
    return md, client, list_entries, transport


def make_scrubber(
    client: LedgerClient, inspector: ReplicaInspector, config: AutorecoveryConfig
) -> Scrubber:
    return Scrubber(
        client.env,
        inspector,
        page_entries=config.replica_check_page_entries,
        ledgers_in_flight_max=config.replica_check_ledgers_in_flight_max,
    )


class Autorecovery:
    """Auditor candidate + replication worker on one metadata session."""

    def __init__(
        self,
        md: MetadataClient,
        client: LedgerClient,
        config: AutorecoveryConfig | None = None,
        *,
        instance_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_stop: Callable[[], Awaitable[None]] | None = None,
        list_entries: ListEntries | None = None,
        inspector: ReplicaInspector | None = None,
    ) -> None:
        """Without ``inspector`` (the bookies' replica-check ops) the auditor only looks
        for lost bookies."""
        self.config = config or AutorecoveryConfig()
        self.instance_id = instance_id or default_instance_id()
        self.md = md
        self.client = client
        scrubber = None
        if inspector is not None and (
            self.config.replica_check_interval_ms or self.config.damaged_poll_interval_ms
        ):
            scrubber = make_scrubber(client, inspector, self.config)
        self.auditor = Auditor(md, self.config, self.instance_id, clock=clock, scrubber=scrubber)
        self.worker = ReplicationWorker(
            md, client, self.config, self.instance_id, clock=clock, list_entries=list_entries
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._on_stop = on_stop

    @classmethod
    async def connect(
        cls,
        metadata: MetadataConfig,
        config: AutorecoveryConfig | None = None,
        ledger_config: LedgerConfig | None = None,
        *,
        instance_id: str | None = None,
    ) -> Autorecovery:
        """An instance with its own ZooKeeper session and bookie connections."""
        md, client, lister, inspector = await connect_parts(metadata, ledger_config)
        return cls(
            md,
            client,
            config,
            instance_id=instance_id,
            on_stop=client.close,
            list_entries=lister,
            inspector=inspector,
        )

    async def start(self) -> None:
        if self._tasks:
            return
        if self.config.auditor_enabled:
            self._tasks.append(asyncio.create_task(self.auditor.run(), name="auditor"))
        if self.config.worker_enabled:
            self._tasks.append(asyncio.create_task(self.worker.run(), name="replication"))
        log.info("autorecovery %s started", self.instance_id)

    def failed_part(self) -> tuple[str, str] | None:
        """Which part stopped on its own (``"<part> stopped"``) and its error's text
        ('' when none), apart: the error may name anything; None while every part runs."""
        for task in self._tasks:
            if task.done():
                exc = None if task.cancelled() else task.exception()
                return f"{task.get_name()} stopped", str(exc) if exc else ""
        return None

    async def wait(self) -> None:
        """Return when a part stopped on its own (raising its error); they run forever."""
        done, _pending = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        errors: list[BaseException] = []
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass  # what we asked for
            except Exception as exc:  # noqa: BLE001 - collected, raised together below
                errors.append(exc)
        if self._on_stop is not None:
            closer, self._on_stop = self._on_stop, None
            await closer()
        log.info("autorecovery %s stopped", self.instance_id)
        if errors:
            raise errors[0]

    async def __aenter__(self) -> Autorecovery:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def ledgers_on(md: MetadataClient, bookie_id: str) -> list[int]:
    """Ids of the ledgers whose metadata names ``bookie_id`` in some ensemble."""
    out: list[int] = []
    async for ledger_id in md.ledgers.iter_ledger_ids():
        with contextlib.suppress(NotFoundError):  # deleted while we scanned: not on it
            meta, _version = await md.ledgers.read(ledger_id)
            if bookie_id in meta.all_bookies():
                out.append(ledger_id)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class DecommissionSummary:
    bookie_id: str
    ledgers_found: int  # ledgers naming the bookie when decommission started
    ledgers_replicated: int  # repaired by this process (others may have helped)
    rounds: int
    elapsed_ms: int


async def decommission(
    md: MetadataClient,
    client: LedgerClient,
    bookie_id: str,
    config: AutorecoveryConfig,
    *,
    timeout_ms: int,
    clock: Callable[[], float] = time.monotonic,
    list_entries: ListEntries | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> DecommissionSummary:
    """Move every replica ``bookie_id`` holds to other bookies; return when no ledger
    names it. TimeoutError_ after ``timeout_ms`` (re-run to continue: it is idempotent).
    ``on_progress(ledgers_left, ledgers_found)`` is called after every scan (a bar).

    The bookie should stay up meanwhile (it is a source too) and should be read-only
    or otherwise kept out of new ensembles, else new ledgers keep landing on it."""
    start = clock()
    worker = ReplicationWorker(
        md, client, config, f"decommission-{default_instance_id()}", list_entries=list_entries
    )
    found: int | None = None
    rounds = 0
    while True:
        ids = await ledgers_on(md, bookie_id)
        if found is None:
            found = len(ids)
        if on_progress is not None:
            on_progress(len(ids), max(found, len(ids)))
        if not ids:
            break
        if clock() - start > timeout_ms / 1000.0:
            raise TimeoutError_(
                f"decommission of {bookie_id}: {len(ids)} ledgers still reference it "
                f"after {timeout_ms} ms"
            )
        rounds += 1
        for ledger_id in ids:
            await md.underreplicated.mark(ledger_id, {bookie_id})
        outcomes = await worker.run_once(only=ids)
        progress = sum(1 for o in outcomes.values() if o is Outcome.REPLICATED)
        log.info(
            "decommission %s round %d: %d of %d repaired", bookie_id, rounds, progress, len(ids)
        )
        if progress < len(ids):
            # Others hold claims, OPEN ledgers wait for their writers, or errors back off.
            await asyncio.sleep(min(config.worker_poll_ms, config.retry_backoff_ms or 1) / 1000.0)
    return DecommissionSummary(
        bookie_id=bookie_id,
        ledgers_found=found,
        ledgers_replicated=worker.replicated,
        rounds=rounds,
        elapsed_ms=int((clock() - start) * 1000),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ScrubOutcome:
    summary: ScrubSummary
    marked: tuple[int, ...]  # ledgers marked for repair (with ``repair``)
    entries_repaired: int  # entry copies this process re-copied

    @property
    def clean(self) -> bool:
        """Nothing found -- or all of it repaired -- and every bookie answered."""
        reports = self.summary.reports
        if self.marked:  # repaired, since scrub() returned
            return not any(r.unrecoverable or r.conflicts or r.unchecked for r in reports)
        return not reports


async def scrub(
    md: MetadataClient,
    client: LedgerClient,
    inspector: ReplicaInspector,
    config: AutorecoveryConfig,
    *,
    ledger_ids: Sequence[int] | None = None,
    repair: bool = False,
    timeout_ms: int,
    clock: Callable[[], float] = time.monotonic,
    list_entries: ListEntries | None = None,
) -> ScrubOutcome:
    """Check the replicas of ``ledger_ids`` (default: every ledger). With ``repair``,
    mark what live bookies lack and run a worker (other workers may help; claims are
    respected) until those items are cleared; TimeoutError_ after ``timeout_ms``."""
    start = clock()
    scrubber = make_scrubber(client, inspector, config)
    ids = md.ledgers.iter_ledger_ids() if ledger_ids is None else ledger_ids
    registered = (await md.bookies.list_all()).all
    summary = await scrubber.check_all(ids, registered=registered)
    marked: list[int] = []
    if repair:
        for report in summary.reports:
            if report.repairs:
                await md.underreplicated.mark(report.ledger_id, repair_entries=report.repairs)
                marked.append(report.ledger_id)
    worker = ReplicationWorker(
        md, client, config, f"scrub-{default_instance_id()}", list_entries=list_entries
    )
    remaining = list(marked)
    while remaining:
        if clock() - start > timeout_ms / 1000.0:
            raise TimeoutError_(
                f"scrub: {len(remaining)} ledgers still being repaired after {timeout_ms} ms "
                f"({remaining[:10]}...); re-run to continue"
            )
        await worker.run_once(only=remaining)
        listed = set(await md.underreplicated.list())
        remaining = [i for i in remaining if i in listed]
        if remaining:
            # Others hold claims, or errors back off: look again shortly.
            await asyncio.sleep(min(config.worker_poll_ms, config.retry_backoff_ms or 1) / 1000.0)
    return ScrubOutcome(summary, tuple(marked), worker.entries_repaired)
