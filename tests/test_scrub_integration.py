"""Replica check (issue 12 defect 5) against real bookie processes and ZooKeeper.

A bookie that stays registered but lost entries (its journal went before a checkpoint
put them into entry logs) used to keep its ledgers at two copies of three for good: the
auditor only noticed bookies that were gone. Now a scrub compares every closed ledger's
replicas, marks what a live bookie lacks, and autorecovery re-copies verified entries to
it. Every process is started through :mod:`ops.cluster.procs` and stopped by pid in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from bookie.client import BookieClientPool
from bookie.storage import faults, journal
from foundation.config import MetadataConfig
from foundation.errors import BooklineError, NoEntryError, NoLedgerError
from ledger.autorecovery import Autorecovery, AutorecoveryConfig, connect_parts
from ledger.client import LedgerClient
from ledger.digest import DigestManager, master_key
from ops.cluster import procs
from tests.test_ledger_integration import BOOKLINE, Bookie, Cluster, config, wait_writable
from tests.waiting import wait_for

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


# Bookies that checkpoint and collect garbage often, in small entry logs: a flipped bit
# lands in an entry log at once, and compaction follows a deleted ledger within seconds.
QUICK_STORAGE = {
    "BOOKLINE_BOOKIE_CHECKPOINT_INTERVAL_MS": "1000",
    "BOOKLINE_BOOKIE_GC_INTERVAL_MS": "500",
    "BOOKLINE_BOOKIE_ENTRY_LOG_BYTES_MAX": str(1 << 20),
}


class ScrubCluster(Cluster):
    """:class:`Cluster` whose bookies run with ``bookie_env`` and a metrics port, and
    can be killed or stopped and started again on the same directories."""

    bookie_env: ClassVar[dict[str, str]] = SLOW_CHECKPOINTS

    def start_bookie(self) -> Bookie:
        port = procs.free_port()
        d = self.workdir / f"bookie-{port}"
        log = d / "bookie.log"
        argv = [
            BOOKLINE, "bookie", "--zk", self.zk, "--root", self.root, "--port", str(port),
            "--journal-dir", str(d / "journal"), "--ledgers-dir", str(d / "ledgers"),
            "--index-dir", str(d / "index"), "--session-timeout-ms", "4000",
            "--metrics-port", str(procs.free_port()),
        ]  # fmt: skip
        b = Bookie(procs.spawn(argv, log_path=log, env=self._env()), port, log, argv)
        self.bookies.append(b)
        self._wait_ready(b, 1)
        return b

    def _env(self) -> dict[str, str]:
        return dict(os.environ, **self.bookie_env)

    def restart(self, b: Bookie, *, kill: bool, offline: Callable[[], None] = lambda: None) -> None:
        """Stop ``b`` (kill -9 or SIGTERM), run ``offline``, start it again."""
        if kill:
            procs.kill9(b.proc)
        else:
            procs.stop(b.proc, grace_s=10.0)
        starts = b.log.read_bytes().count(b"bookie ready")
        offline()
        b.proc = procs.spawn(b.argv, log_path=b.log, env=self._env())
        self._wait_ready(b, starts + 1)

    def lose_journal(self, b: Bookie) -> None:
        """kill -9, remove the journal files (the cookie stays), start again."""
        journal_dir = dir_of(b, "--journal-dir")

        def remove() -> None:
            for file_id in journal.list_files(journal_dir):
                (journal_dir / journal.file_name(file_id)).unlink()

        self.restart(b, kill=True, offline=remove)


class QuickStorageCluster(ScrubCluster):
    bookie_env: ClassVar[dict[str, str]] = QUICK_STORAGE


def dir_of(b: Bookie, flag: str) -> Path:
    return Path(b.argv[b.argv.index(flag) + 1])


def metrics_url(b: Bookie) -> str:
    return f"http://127.0.0.1:{b.argv[b.argv.index('--metrics-port') + 1]}/metrics"


@contextlib.contextmanager
def running(c: ScrubCluster) -> Iterator[ScrubCluster]:
    try:
        yield c
    finally:
        for b in c.bookies:
            procs.stop(b.proc, grace_s=5.0)


@pytest.fixture
def cluster(zk_connect: str, cluster_root: str, tmp_path: Path) -> Iterator[ScrubCluster]:
    with running(ScrubCluster(zk_connect, cluster_root, tmp_path)) as c:
        yield c


@pytest.fixture
def quick_cluster(zk_connect: str, cluster_root: str, tmp_path: Path) -> Iterator[ScrubCluster]:
    with running(QuickStorageCluster(zk_connect, cluster_root, tmp_path)) as c:
        yield c


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
        count += sum(bookie in meta.replicas(e) for e in range(meta.last_entry_id + 1))
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
                for bookie in meta.replicas(entry_id):
                    try:
                        resp = await pool.get(bookie).read(
                            ledger_id, entry_id, master_key=master_key(b"pw")
                        )
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
        MetadataConfig(zk=cluster.zk, root=cluster.root), config()
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

        # The first ledger is repaired by hand, the second by the autorecovery service.
        by_hand = await replicas_on(client, ids[:1], victim.bookie_id)
        code, report = await scrub_cli(cluster, "--ledger", str(ids[0]), "--repair")
        assert code == 0 and report["marked"] == 1, report
        assert report["entries_repaired"] == report["missing"] == by_hand, report
        assert {i[0] for i in await unverified_replicas(client, ids)} == {ids[1]}
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

            async def repaired() -> bool:
                if ar.worker.entries_repaired < len(lost) - by_hand:
                    return False
                return not await md.underreplicated.list()

            await wait_for(repaired, "every lost entry repaired, none under-replicated",
                           timeout_s=WAIT_S, interval_s=0.2)  # fmt: skip
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


def big_payload(entry: int) -> bytes:
    return b"garbage-%d-" % entry + bytes(4000)


async def read_from(
    pool: BookieClientPool, bookie: str, ledger_id: int, count: int
) -> dict[int, bytes | str]:
    """entry id -> the stored blob, or the error name, read from one bookie."""
    out: dict[int, bytes | str] = {}
    for entry_id in range(count):
        try:
            out[entry_id] = (
                await pool.get(bookie).read(ledger_id, entry_id, master_key=master_key(b"pw"))
            ).payload
        except BooklineError as exc:
            out[entry_id] = exc.name
    return out


def flip_payload_bit(ledgers_dir: Path, marker: bytes) -> Path:
    """Flip one bit a few bytes into the only stored copy of the entry whose payload
    starts with ``marker``; return the entry log file that held it."""
    hits = [(f, f.read_bytes().find(marker)) for f in sorted(ledgers_dir.iterdir()) if f.is_file()]
    hits = [(f, at) for f, at in hits if at >= 0]
    assert len(hits) == 1, hits
    path, at = hits[0]
    faults.flip_bit(path, at + len(marker) + 5)
    return path


def scrape(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, (name, text[-2000:])
    return values[0]


async def eventually(check: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    await wait_for(check, what, timeout_s=timeout_s, interval_s=0.2)


async def test_one_flipped_bit_in_one_replica(quick_cluster: ScrubCluster) -> None:
    """The issue's acceptance: one flipped bit in one replica's entry log. Every read
    returns correct data, exactly the damaged entry is reported (log line + metric), a
    scrub finds it, autorecovery restores the third copy, and compaction afterwards
    keeps every valid entry."""
    c = quick_cluster
    await asyncio.gather(*(asyncio.to_thread(c.start_bookie) for _ in range(3)))
    md, client, lister, inspector = await connect_parts(
        MetadataConfig(zk=c.zk, root=c.root), config()
    )
    pool = BookieClientPool()
    try:
        await wait_writable(client, 3)
        # Ledger "big" shares the entry logs and is deleted later, which makes them
        # compaction candidates; ledger "kept" holds the damaged entry.
        big = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw"
        )
        await asyncio.gather(*[await big.submit(big_payload(i)) for i in range(ENTRIES)])
        await big.close()
        kept = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw"
        )
        await asyncio.gather(*[await kept.submit(payload(7, i)) for i in range(ENTRIES)])
        await kept.close()
        lid = kept.ledger_id
        victim, healthy = c.bookies[1], c.bookies[0]
        good = await read_from(pool, healthy.bookie_id, lid, ENTRIES)
        assert all(isinstance(v, bytes) for v in good.values())
        damaged_log: list[Path] = []

        def flip() -> None:  # SIGTERMed: its checkpoint put everything in entry logs
            damaged_log.append(flip_payload_bit(dir_of(victim, "--ledgers-dir"), b"scrub-7-42-"))

        await asyncio.to_thread(c.restart, victim, kill=False, offline=flip)

        # Every read returns correct data; the victim refuses just the damaged entry.
        reader = await client.open_ledger(lid, b"pw", recover=False)
        assert await reader.read(0, ENTRIES - 1) == [payload(7, i) for i in range(ENTRIES)]
        on_victim = await read_from(pool, victim.bookie_id, lid, ENTRIES)
        assert on_victim == {**good, 42: "CHECKSUM"}
        # Exactly that entry is reported: over the wire, in the log, in the metrics.
        assert (await pool.get(victim.bookie_id).list_damaged()).damaged == ((lid, 42),)
        lines = [ln for ln in victim.log.read_text().splitlines() if "damaged entry:" in ln]
        assert lines and all(f"ledger {lid} entry 42 " in ln for ln in lines), lines
        url = metrics_url(victim)
        await eventually(lambda: scrape(url, "bookline_bookie_damaged_entries") == 1, "metric")

        # A scrub finds it (and reports nothing else).
        code, report = await scrub_cli(c, "--ledger", str(lid))
        assert code == 3 and report["damaged"] == 1 and report["missing"] == 0, report
        ledgers = report["ledgers"]
        assert isinstance(ledgers, list)
        (ledger_report,) = ledgers
        assert ledger_report["bookies"] == {
            victim.bookie_id: {"missing": 0, "damaged": 1, "mismatched": 0, "ranges": [[42, 42]]}
        }

        # Autorecovery restores the third copy.
        ar = Autorecovery(
            md, client, FAST, instance_id="ar-flip", list_entries=lister, inspector=inspector
        )

        async def repaired() -> bool:
            return ar.worker.entries_repaired >= 1 and not await md.underreplicated.list()

        await ar.start()
        try:
            await eventually(repaired, "repair")
        finally:
            await ar.stop()
        assert await md.underreplicated.list() == []
        assert await read_from(pool, victim.bookie_id, lid, ENTRIES) == good
        await eventually(  # the victim's next checkpoint clears the mark
            lambda: scrape(url, "bookline_bookie_damaged_entries") == 0, "mark cleared"
        )
        assert (await pool.get(victim.bookie_id).list_damaged()).damaged == ()

        # Compaction afterwards keeps every valid entry: once "big" is gone, the log
        # with the damaged record is compacted away, and every copy still verifies.
        await client.delete_ledger(big.ledger_id)
        await eventually(lambda: not damaged_log[0].exists(), "compaction of the damaged log")
        await asyncio.to_thread(c.restart, victim, kill=False)
        for b in c.bookies:
            assert await read_from(pool, b.bookie_id, lid, ENTRIES) == good, b.bookie_id
        assert await unverified_replicas(client, [lid]) == []
    finally:
        await pool.close()
        await client.close()
