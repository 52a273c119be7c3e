"""The ledger layer's figures (ledger/metrics.py) move when what they count happens:
in-memory bookies and metadata, virtual time (fast, deterministic), and the Prometheus
families the services export them as (httpapi.monitoring.LedgerCollector). Issue 16:
"ledgers and autorecovery export nothing"."""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from httpapi.monitoring import LedgerCollector
from ledger.client import LedgerClient
from ledger.metrics import PROCESS_LEDGER_METRICS, AddTimer, LatencyHistogram, LedgerMetrics
from ledger.replication import Outcome, ReplicationWorker
from ledger.testing import MemoryBookies, MemoryMetadataStore, candidates
from metadata.bookies import BookieInfo
from metadata.client import MetadataClient
from tests.metadata_support import metadata_clients
from tests.metrics_support import family_types, sample_sum
from tests.test_ledger_autorecovery import FAST as AR_FAST
from tests.test_ledger_protocol import FAST
from tests.virtual_time import loop_clock, virtual_time

M = PROCESS_LEDGER_METRICS  # what LedgerEnv uses by default: tests take deltas


def _client(n: int) -> tuple[LedgerClient, MemoryBookies]:
    cands = candidates(n)
    bookies = MemoryBookies([c.bookie_id for c in cands])
    client = LedgerClient(
        MemoryMetadataStore(cands), bookies, FAST, clock=loop_clock(), rng=random.Random(1)
    )
    return client, bookies


def test_add_timer_observes_entries_in_order() -> None:
    hist = LatencyHistogram((0.001, 0.01))
    timer = AddTimer(hist)
    timer.pushed(0, 1.0)
    timer.pushed(1, 1.0)
    timer.pushed(2, 1.5)
    timer.confirmed(-1, 1.1)  # nothing confirmed yet
    assert hist.count == 0
    timer.confirmed(1, 1.005)
    assert hist.counts == [0, 2, 0]
    timer.confirmed(2, 2.0)
    assert hist.counts == [0, 2, 1]
    assert hist.sum == pytest.approx(0.005 * 2 + 0.5)


@virtual_time
async def test_writer_counts_adds_and_ensemble_changes() -> None:
    client, bookies = _client(4)
    adds, changes = M.add_seconds.count, M.ensemble_changes
    w = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    await asyncio.gather(*[await w.submit(b"a%d" % i) for i in range(20)])
    bookies[w.metadata.last_segment.bookies[1]].down = True
    await asyncio.gather(*[await w.submit(b"b%d" % i) for i in range(20)])
    await w.close()
    assert M.add_seconds.count - adds == 40
    assert M.ensemble_changes - changes == w.ensemble_changes >= 1


@virtual_time
async def test_reader_counts_reads_and_speculation() -> None:
    client, bookies = _client(3)
    w = await client.create_ledger()
    for i in range(20):
        await w.add_entry(b"%d" % i)
    await w.close()
    reads, fired, won = M.entry_read_seconds.count, M.speculative_reads, M.speculative_reads_won
    r = await client.open_ledger(w.ledger_id)
    bookies[w.metadata.last_segment.bookies[0]].hung = True
    assert len(await r.read(0, 19)) == 20
    assert M.entry_read_seconds.count - reads == 20
    assert M.speculative_reads - fired >= 1
    assert M.speculative_reads_won - won >= 1
    assert M.speculative_reads_won - won <= M.speculative_reads - fired


@virtual_time
async def test_recovery_is_counted() -> None:
    client, _bookies = _client(3)
    w = await client.create_ledger(password=b"pw")
    await w.add_entry(b"x")
    before = M.recoveries
    await client.open_ledger(w.ledger_id, b"pw", recover=True)  # the writer never closed
    assert M.recoveries - before == 1
    await client.open_ledger(w.ledger_id, b"pw", recover=True)  # already closed: no run
    assert M.recoveries - before == 1


def test_collector_exports_typed_families() -> None:
    m = LedgerMetrics()
    m.add_seconds.observe(0.002)
    m.entry_read_seconds.observe(0.0003)
    m.ensemble_changes, m.speculative_reads, m.speculative_reads_won, m.recoveries = 1, 3, 2, 4
    m.ledgers_replicated, m.entries_copied, m.bytes_copied = 5, 6, 700
    registry = CollectorRegistry()
    registry.register(LedgerCollector(m, autorecovery=True))
    text = generate_latest(registry).decode()
    types = family_types(text)
    assert types["bookline_ledger_add_seconds"] == "histogram"
    assert types["bookline_ledger_entry_read_seconds"] == "histogram"
    assert sample_sum(text, "bookline_ledger_add_seconds_bucket", 'le="0.002"') == 1
    assert sample_sum(text, "bookline_ledger_speculative_reads_won_total") == 2
    assert sample_sum(text, "bookline_ledger_recoveries_total") == 4
    assert sample_sum(text, "bookline_autorecovery_copied_bytes_total") == 700
    proxies = CollectorRegistry()
    proxies.register(LedgerCollector(m))  # a proxy: no autorecovery families
    assert "bookline_autorecovery" not in generate_latest(proxies).decode()


@pytest.mark.integration
async def test_replication_counts_ledgers_entries_and_bytes(
    zk_connect: str, cluster_root: str
) -> None:
    """A worker on real ZooKeeper with bookies in memory re-replicates a lost bookie's
    fragment: ledgers replicated, entry copies and their bytes are counted."""
    cands = candidates(4)
    bookies = MemoryBookies([c.bookie_id for c in cands])
    store = MemoryMetadataStore(cands)
    client = LedgerClient(store, bookies, FAST, rng=random.Random(3))
    async with metadata_clients(zk_connect, cluster_root) as clients:
        md: MetadataClient = await clients.new()
        w = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await asyncio.gather(*[await w.submit(b"e%03d" % i) for i in range(20)])
        await w.close()
        lost = w.metadata.last_segment.bookies[0]
        for c in cands:
            if c.bookie_id != lost:
                await md.bookies.register(BookieInfo(c.bookie_id, c.bookie_id))
        store.bookies = [c for c in store.bookies if c.bookie_id != lost]
        bookies[lost].down = True
        await md.underreplicated.mark(w.ledger_id, {lost})
        replicated, copied, copied_bytes = M.ledgers_replicated, M.entries_copied, M.bytes_copied
        worker = ReplicationWorker(md, client, AR_FAST, "w")
        assert await worker.run_once() == {w.ledger_id: Outcome.REPLICATED}
    assert M.ledgers_replicated - replicated == 1
    assert M.entries_copied - copied == 20
    assert M.bytes_copied - copied_bytes > 20 * 4  # packaged entries: payload + digest
