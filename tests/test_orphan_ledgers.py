"""Issue 22 (3): the ledger a stream writer creates in advance for its next segment (its
spare) never leaks, and is never taken from a live writer.

* A write proxy killed with ``kill -9`` leaves its spare OPEN with no segment naming it:
  ``ledger list`` shows it as an orphan, the elected auditor deletes it after the
  collection interval, and every record written is still readable.
* ``ledger list`` shows a live writer's spare as a spare, not as a segment.
* A collector running as often as it can beside a writer that rolls segments all the
  time never collects that writer's spare.
* A writer whose spare vanished anyway (deleted by hand) rolls onto a new ledger.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bookline import LogRecord, Namespace, NamespaceConfig, StreamOptions
from foundation.config import MetadataConfig
from foundation.errors import NotFoundError
from ledger.autorecovery import Autorecovery, AutorecoveryConfig
from metadata.client import MetadataClient
from metadata.ledger_metadata import LedgerMetadata, LedgerState
from ops.cluster import procs
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from tests import proxy_support
from tests.cli_support import cli_json
from tests.conftest import BookieCluster
from tests.metadata_support import wait_for
from tests.values import values
from thinclient.client import ProxyClient

pytestmark = pytest.mark.integration

_names = itertools.count()
CONFIG = NamespaceConfig(session_timeout_ms=4000, long_poll_timeout_ms=1000)
# The dead proxy's session expires (4 s) and ZooKeeper notices; the spare then has to
# reach the collection age and meet a pass. Generous for a loaded machine.
COLLECTED_WAIT_S = 90.0


def fast_collection() -> AutorecoveryConfig:
    """A collector that looks often and waits little, so the test sees it act."""
    return AutorecoveryConfig(
        orphan_check_interval_ms=200,
        orphan_ledger_age_ms=1_000,
        worker_enabled=False,  # only the auditor: nothing here is under-replicated
        full_check_interval_ms=3_600_000,
        replica_check_interval_ms=0,
        damaged_poll_interval_ms=0,
    )


async def stream_ledgers(md: MetadataClient, ns: str, stream: str) -> list[LedgerMetadata]:
    """Every ledger tagged with ``ns/stream``."""
    tag = f"{ns}/{stream}".encode()
    out = []
    for ledger_id in await md.ledgers.list_ledger_ids():
        try:
            meta, _version = await md.ledgers.read(ledger_id)
        except NotFoundError:
            continue  # deleted while we listed
        if meta.custom.get("stream") == tag:
            out.append(meta)
    return out


async def unreferenced(md: MetadataClient, ns: str, stream: str) -> list[LedgerMetadata]:
    """The stream's ledgers no segment names (spares, orphans)."""
    referenced = {s.ledger_id for s, _v in await md.segments.list_segments(ns, stream)}
    return [m for m in await stream_ledgers(md, ns, stream) if m.ledger_id not in referenced]


def _cli_json(cluster: LocalCluster, *args: str) -> Any:
    return cli_json(*args, cluster=cluster.dir / "cluster.json")


def _roles(cluster: LocalCluster, stream: str) -> dict[int, str]:
    return {
        r["ledger_id"]: r["role"]
        for r in _cli_json(cluster, "ledger", "list", "--stream", stream)["ledgers"]
    }


# -- through write proxies (real processes) ----------------------------------------------


async def test_a_killed_write_proxy_leaves_no_orphan_ledger(
    proxy_cluster: LocalCluster, tmp_path: Path
) -> None:
    """A write proxy killed mid-stream left its spare OPEN and unreferenced forever
    (seen 1.5 min later). Now the auditor collects it, and no record is lost."""
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "writeproxy.log"
    stream = f"orphan-{uuid.uuid4().hex[:8]}"
    md = MetadataClient(MetadataConfig(zk=proxy_cluster.zk_connect, root=CLUSTER_ROOT))
    await md.connect()
    proc = proxy_support.spawn_write_proxy(
        proxy_cluster.zk_connect, CLUSTER_ROOT, log_path, proxy_id=f"wp-orphan-{port}", port=port
    )
    ar: Autorecovery | None = None
    try:
        await proxy_support.wait_ready(proc, log_path)
        payloads = [f"record {i}".encode() for i in range(40)]
        async with ProxyClient(write_urls=[url]) as client:
            for p in payloads:
                await client.write(stream, p)
        await wait_for(
            lambda: _has_unreferenced(md, stream),
            "the writer's spare",
            timeout_s=COLLECTED_WAIT_S,
            interval_s=0.2,
        )
        (spare,) = await unreferenced(md, "default", stream)
        assert _roles(proxy_cluster, stream)[spare.ledger_id] == "spare"
        procs.kill9(proc)
        # Once the dead proxy's session is gone, `ledger list` calls it what it is.
        await wait_for(
            lambda: _roles(proxy_cluster, stream).get(spare.ledger_id) == "orphan",
            "ledger list to call the dead proxy's spare an orphan",
            timeout_s=COLLECTED_WAIT_S,
            interval_s=0.5,
        )

        ar = await Autorecovery.connect(
            MetadataConfig(zk=proxy_cluster.zk_connect, root=CLUSTER_ROOT), fast_collection()
        )
        await ar.start()
        await wait_for(
            lambda: _no_unreferenced(md, stream),
            "the orphan to be collected",
            timeout_s=COLLECTED_WAIT_S,
            interval_s=0.2,
        )
        assert ar.auditor.orphans.collected >= 1
        assert not await md.ledgers.exists(spare.ledger_id)

        # No live ledger went with it: a new owner recovers the killed proxy's open
        # segment, and every record is there.
        write_urls = [p.extra["url"] for p in proxy_cluster.write_proxies]
        read_urls = [p.extra["url"] for p in proxy_cluster.read_proxies]
        async with ProxyClient(write_urls=write_urls, read_urls=read_urls) as client:
            await client.write(stream, b"after the kill")
            got = await _read_all(client, stream, len(payloads) + 1)
        assert got == [*payloads, b"after the kill"]
        ledgers = await stream_ledgers(md, "default", stream)
        segments = await md.segments.list_segments("default", stream)
        assert {s.ledger_id for s, _v in segments} <= {m.ledger_id for m in ledgers}
    finally:
        if ar is not None:
            await ar.stop()
        await proxy_support.stop(proc)
        await md.close()


async def _read_all(client: ProxyClient, stream: str, n: int) -> list[bytes]:
    out: list[bytes] = []
    start = "earliest"
    while len(out) < n:
        page = await client.read(stream, start, limit=n, wait_ms=5_000)
        assert page.records, f"no record after {len(out)} of {n}"
        out.extend(values(page.records))
        start = page.next
    return out


async def _has_unreferenced(md: MetadataClient, stream: str) -> bool:
    return bool(await unreferenced(md, "default", stream))


async def _no_unreferenced(md: MetadataClient, stream: str) -> bool:
    return not [m for m in await unreferenced(md, "default", stream) if m.state is LedgerState.OPEN]


def test_ledger_list_shows_a_live_writers_spare_as_a_spare(proxy_cluster: LocalCluster) -> None:
    """``ledger list`` showed the spare as one of the stream's open ledgers."""
    stream = f"spare-{uuid.uuid4().hex[:8]}"
    write_urls = [p.extra["url"] for p in proxy_cluster.write_proxies]

    async def write() -> None:
        async with ProxyClient(write_urls=write_urls) as client:
            await client.write(stream, b"one")

    asyncio.run(write())

    def roles() -> dict[int, str]:
        return _roles(proxy_cluster, stream)

    asyncio.run(
        wait_for(
            lambda: sorted(roles().values()) == ["segment", "spare"],
            "a segment and a spare",
            timeout_s=60.0,
            interval_s=0.5,
        )
    )
    rows = _cli_json(proxy_cluster, "ledger", "list", "--stream", stream)["ledgers"]
    assert sorted((r["role"], r["state"]) for r in rows) == [("segment", "OPEN"), ("spare", "OPEN")]


# -- the core library against real bookies ----------------------------------------------


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"orph{os.getpid()}-{next(_names)}", CONFIG
    )
    try:
        yield n
    finally:
        await n.close()


def payload(i: int, size: int = 500) -> bytes:
    return i.to_bytes(8, "big") + bytes((i + k) & 0xFF for k in range(size - 8))


async def read_all(ns: Namespace, name: str, n: int) -> list[bytes]:
    reader = await ns.open_reader(name, "earliest")
    out: list[bytes] = []
    try:
        while len(out) < n:
            batch = await reader.read_many(1_000, timeout_s=20)
            assert batch, f"no record within 20 s after {len(out)} of {n}"
            out.extend(values(batch))
    finally:
        await reader.close()
    return out


async def test_a_live_writers_spare_is_never_collected_while_it_rolls(
    ns: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    """The collector runs pass after pass with no age limit while the writer rolls a
    segment every few records: it never takes the writer's spare."""
    from ledger.orphans import OrphanCollector

    caplog.set_level(logging.INFO, logger="ledger.orphans")
    # INFO for both: set_level also sets the capturing handler's level.
    caplog.set_level(logging.INFO, logger="streams.writer.segments")
    name = "rolling"
    await ns.create_stream(name, StreamOptions(segment_rollover_bytes=2_000))
    md = ns.context.md
    collector = OrphanCollector(md, min_age_ms=0, reads_in_flight_max=32)
    writing = asyncio.Event()
    passes = 0

    async def collect_all_the_time() -> None:
        nonlocal passes
        while writing.is_set():
            await collector.collect()
            passes += 1

    writer = await ns.open_writer(name)
    writing.set()
    task = asyncio.create_task(collect_all_the_time())
    count = 120
    try:
        for i in range(count):
            await writer.write(LogRecord(payload(i)))
    finally:
        writing.clear()
        await task
    await writer.close()
    segments = await ns.segments(name)
    assert len(segments) >= 20, "the writer rolled often"
    assert passes >= 2, "the collector ran alongside"
    ours = f"stream {ns.name}/{name} "
    assert not [r.message for r in caplog.records if ours in r.getMessage()]
    assert not [r for r in caplog.records if "vanished" in r.getMessage()]
    assert await read_all(ns, name, count) == [payload(i) for i in range(count)]


async def test_a_writer_whose_spare_vanished_rolls_onto_a_new_ledger(ns: Namespace) -> None:
    """Deleted spare (by hand, or collected while the lock was lost): the roll opens the
    next segment on a fresh ledger instead of on a ledger that no longer exists."""
    name = "vanish"
    await ns.create_stream(name, StreamOptions(segment_rollover_bytes=2_000))
    md = ns.context.md
    writer = await ns.open_writer(name)
    await writer.write(LogRecord(payload(0)))
    await wait_for(lambda: _spare_of(md, ns.name, name), "a spare", timeout_s=30.0, interval_s=0.1)
    (spare,) = await unreferenced(md, ns.name, name)
    await ns.context.ledgers.delete_ledger(spare.ledger_id)
    count = 20
    for i in range(1, count):
        await writer.write(LogRecord(payload(i)))
    await writer.close()
    segments = await ns.segments(name)
    assert len(segments) >= 3
    for seg in segments:
        assert await md.ledgers.exists(seg.ledger_id), seg
    assert await read_all(ns, name, count) == [payload(i) for i in range(count)]


async def _spare_of(md: MetadataClient, ns: str, stream: str) -> bool:
    return bool(await unreferenced(md, ns, stream))
