"""Replica check (issue 12 defect 5) against real bookie processes and ZooKeeper.

A bookie that stays registered but lost entries (its journal went before a checkpoint
put them into entry logs) used to keep its ledgers at two copies of three for good: the
auditor only noticed bookies that were gone. Now a scrub compares every closed ledger's
replicas, marks what a live bookie lacks, and autorecovery re-copies verified entries to
it. Every process is started through :mod:`ops.procs` and stopped by pid in ``finally``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookie.client import BookieClientPool
from bookie.storage import journal
from bookline.config import MetadataConfig
from bookline.errors import NoEntryError, NoLedgerError
from ledger.autorecovery import Autorecovery, AutorecoveryConfig, connect_parts
from ledger.client import LedgerClient
from ledger.digest import DigestManager
from ledger.reader import replicas_of
from ops import procs
from tests.test_ledger_integration import BOOKLINE, CONFIG, Bookie, Cluster, wait_writable

pytestmark = pytest.mark.integration

FAST = AutorecoveryConfig(
    grace_ms=60_000,  # no bookie is lost here: the replica check must do the work
    full_check_interval_ms=60_000,
    audit_poll_ms=100,
    election_poll_ms=500,
    open_ledger_grace_ms=0,
    worker_poll_ms=300,
    retry_backoff_ms=500,
    ledger_timeout_ms=30_000,
    replica_check_interval_ms=500,
    damaged_poll_interval_ms=500,
)
ENTRIES = 100
WAIT_S = 45.0
# Checkpoints far apart: what a test writes stays in the journal only, so removing the
# journal removes it from the bookie.
SLOW_CHECKPOINTS = {"BOOKLINE_BOOKIE_CHECKPOINT_INTERVAL_MS": "3600000"}


class ScrubCluster(Cluster):
    """:class:`Cluster` whose bookies checkpoint rarely and can be killed and restarted."""

    def start_bookie(self) -> Bookie:
        port = procs.free_port()
        d = self.workdir / f"bookie-{port}"
        log = d / "bookie.log"
        argv = [
            BOOKLINE, "bookie", "--zk", self.zk, "--root", self.root, "--port", str(port),
            "--journal-dir", str(d / "journal"), "--ledgers-dir", str(d / "ledgers"),
            "--index-dir", str(d / "index"), "--session-timeout-ms", "4000",
        ]  # fmt: skip
        b = Bookie(procs.spawn(argv, log_path=log, env=_env()), port, log, argv)
        self.bookies.append(b)
        self._wait_ready(b, 1)
        return b

    def lose_journal(self, b: Bookie) -> None:
        """kill -9, remove the journal files (the cookie stays), start again."""
        procs.kill9(b.proc)
        starts = b.log.read_bytes().count(b"bookie ready")
        journal_dir = Path(b.argv[b.argv.index("--journal-dir") + 1])
        for file_id in journal.list_files(journal_dir):
            (journal_dir / journal.file_name(file_id)).unlink()
        b.proc = procs.spawn(b.argv, log_path=b.log, env=_env())
        self._wait_ready(b, starts + 1)


def _env() -> dict[str, str]:
    return dict(os.environ, **SLOW_CHECKPOINTS)


@pytest.fixture
def cluster(zk_connect: str, cluster_root: str, tmp_path: Path) -> Iterator[ScrubCluster]:
    c = ScrubCluster(zk_connect, cluster_root, tmp_path)
    try:
        yield c
    finally:
        for b in c.bookies:
            procs.stop(b.proc, grace_s=5.0)


def payload(ledger: int, entry: int) -> bytes:
    return b"scrub-%d-%d-" % (ledger, entry) + bytes(entry % 53)


async def write_closed_ledgers(client: LedgerClient) -> list[int]:
    """Two closed ledgers on all three bookies: E=Qw=3 CRC32C, and E=3 Qw=2 HMAC (each
    bookie holds two thirds of its entries)."""
    ids = []
    for n, (qw, digest) in enumerate(((3, "crc32c"), (2, "hmac_sha256"))):
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=qw, ack_quorum=2, password=b"pw", digest_type=digest
        )
        await asyncio.gather(*[await w.submit(payload(n, i)) for i in range(ENTRIES)])
        await w.close()
        ids.append(w.ledger_id)
    return ids


async def replicas_on(client: LedgerClient, ids: list[int], bookie: str) -> int:
    """How many entries of ``ids`` have ``bookie`` in their write set."""
    count = 0
    for ledger_id in ids:
        meta, _v = await client.store.read(ledger_id)
        count += sum(bookie in replicas_of(meta, e) for e in range(meta.last_entry_id + 1))
    return count


async def unverified_replicas(client: LedgerClient, ids: list[int]) -> list[tuple[int, int, str]]:
    """(ledger, entry, bookie) of every write-set member that lacks a verified copy."""
    pool = BookieClientPool()
    bad: list[tuple[int, int, str]] = []
    try:
        for ledger_id in ids:
            meta, _v = await client.store.read(ledger_id)
            digest = DigestManager(ledger_id, meta.digest_type, meta.password)
            for entry_id in range(meta.last_entry_id + 1):
                for bookie in replicas_of(meta, entry_id):
                    try:
                        resp = await pool.get(bookie).read(ledger_id, entry_id)
                        digest.verify(resp.payload, entry_id)
                    except (NoLedgerError, NoEntryError):
                        bad.append((ledger_id, entry_id, bookie))
    finally:
        await pool.close()
    return bad


async def scrub_cli(c: Cluster, *extra: str) -> tuple[int, dict[str, object]]:
    argv = [BOOKLINE, "bookie", "scrub", "--zk", c.zk, "--root", c.root, "--json", *extra]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, timeout=WAIT_S, check=False
    )
    assert done.returncode in (0, 3), done.stderr.decode()[-3000:]
    return done.returncode, json.loads(done.stdout.decode().strip().splitlines()[-1])


async def test_entries_missing_on_a_live_bookie_are_recopied(cluster: ScrubCluster) -> None:
    """Regression test of defect 5: a live, registered bookie lost entries; the scrub
    finds them and autorecovery restores the third copy of every entry."""
    await asyncio.gather(*(asyncio.to_thread(cluster.start_bookie) for _ in range(3)))
    md, client, lister, inspector = await connect_parts(
        MetadataConfig(zk=cluster.zk, root=cluster.root), CONFIG
    )
    try:
        await wait_writable(client, 3)
        ids = await write_closed_ledgers(client)
        assert await unverified_replicas(client, ids) == []
        victim = cluster.bookies[1]
        await asyncio.to_thread(cluster.lose_journal, victim)
        await wait_writable(client, 3)  # registered again: not a lost bookie
        lost = await unverified_replicas(client, ids)
        assert {b for _l, _e, b in lost} == {victim.bookie_id}
        assert len(lost) == await replicas_on(client, ids, victim.bookie_id)

        code, report = await scrub_cli(cluster)  # report only: nothing is marked
        assert code == 3, report
        assert report["missing"] == len(lost) and report["marked"] == 0, report
        assert await md.underreplicated.list() == []

        ar = Autorecovery(
            md,
            client,
            dataclasses.replace(FAST),
            instance_id="ar-scrub",
            list_entries=lister,
            inspector=inspector,
        )
        await ar.start()
        try:
            async with asyncio.timeout(WAIT_S):
                while ar.worker.entries_repaired < len(lost) or await md.underreplicated.list():
                    await asyncio.sleep(0.2)
        finally:
            await ar.stop()
        assert ar.auditor.replica_checks >= 1
        assert await unverified_replicas(client, ids) == []
        for n, ledger_id in enumerate(ids):  # and the ledger reads back unchanged
            reader = await client.open_ledger(ledger_id, b"pw", recover=False)
            assert await reader.read(0, ENTRIES - 1) == [payload(n, i) for i in range(ENTRIES)]
        code, report = await scrub_cli(cluster)
        assert code == 0 and report["missing"] == report["damaged"] == 0, report
    finally:
        await client.close()
