"""Autorecovery: auditor election and scans, replication workers, decommission.

Pure tests of the fragment arithmetic first; then, against a real ZooKeeper and real
bookie processes (stopped by pid in the fixture's ``finally``): a ``kill -9``-ed
bookie's closed ledgers are re-replicated and the under-replicated count returns to 0;
``bookline bookie decommission`` drains a live bookie; a second auditor takes over when
the leader's session expires and still finds a bookie that vanished before it led.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bookie.client import BookieClientPool
from foundation.config import MetadataConfig
from ledger.auditor import Auditor, current_leader
from ledger.autorecovery import Autorecovery, AutorecoveryConfig, connect_parts, ledgers_on
from ledger.client import LedgerClient
from ledger.config import LedgerConfig
from ledger.digest import DigestType, master_key
from ledger.fragments import Fragment, fragment_entries, fragments_to_replace, with_replacement
from ledger.placement import BookieCandidate
from ledger.replication import ListEntries, Outcome, ReplicationWorker
from ledger.testing import MemoryBookie, MemoryBookies, MemoryMetadataStore, candidates
from metadata import serde
from metadata.bookies import BookieInfo
from metadata.client import MetadataClient
from metadata.ledger_metadata import LedgerMetadata, LedgerState, Segment
from metadata.serde import MetadataFormatError
from metadata.underreplicated import RANGES_PER_BOOKIE_MAX, ranges_cover
from ops.cluster import procs
from tests.metadata_support import expire_session, metadata_clients
from tests.test_ledger_integration import BOOKLINE, Cluster, config, start, wait_writable
from tests.waiting import wait_for

FAST = AutorecoveryConfig(
    grace_ms=2_000,
    full_check_interval_ms=60_000,
    audit_poll_ms=100,
    election_poll_ms=500,
    open_ledger_grace_ms=0,
    worker_poll_ms=300,
    retry_backoff_ms=500,
    ledger_timeout_ms=30_000,
)
LEDGER_FAST = LedgerConfig(
    add_timeout_ms=300,
    read_timeout_ms=300,
    fence_timeout_ms=300,
    speculative_read_first_timeout_ms=20,
    speculative_read_max_timeout_ms=100,
)
LEDGERS = 6
ENTRIES = 150
WAIT_S = 45.0


# -- pure -------------------------------------------------------------------------------


def _meta(segments: tuple[Segment, ...], last: int, e: int = 3, qw: int = 2) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=7,
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=qw,
        digest_type=DigestType.CRC32C,
        segments=segments,
        state=LedgerState.CLOSED,
        last_entry_id=last,
    )


def test_fragment_entries_follow_the_write_sets() -> None:
    # E=3, Qw=2: entry i on positions i%3 and (i+1)%3.
    frag = Fragment(0, 0, 8, position=1, bookie="b")
    assert list(fragment_entries(frag, 3, 2)) == [0, 1, 3, 4, 6, 7]
    assert list(fragment_entries(Fragment(0, 5, 4, 0, "b"), 3, 2)) == []  # empty segment
    assert list(fragment_entries(Fragment(0, 0, 3, 2, "b"), 3, 3)) == [0, 1, 2, 3]


def test_fragments_cover_every_segment_with_a_lost_bookie() -> None:
    meta = _meta((Segment(0, ("a", "b", "c")), Segment(10, ("a", "d", "c"))), last=20)
    frags = fragments_to_replace(meta, {"c", "z"})
    assert frags == [Fragment(0, 0, 9, 2, "c"), Fragment(1, 10, 20, 2, "c")]
    swapped = with_replacement(meta, frags[1], "e")
    assert swapped.segments[1].bookies == ("a", "d", "e")
    assert swapped.segments[0] == meta.segments[0]


# -- integration helpers --------------------------------------------------------------


@pytest.fixture
def cluster(zk_connect: str, cluster_root: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(zk_connect, cluster_root, tmp_path)
    try:
        yield c
    finally:
        for b in c.bookies:
            procs.stop(b.proc, grace_s=5.0)


@contextlib.asynccontextmanager
async def parts(
    c: Cluster,
) -> AsyncIterator[tuple[MetadataClient, LedgerClient, ListEntries]]:
    md, client, lister, _inspector = await connect_parts(
        MetadataConfig(zk=c.zk, root=c.root), config()
    )
    try:
        yield md, client, lister
    finally:
        await client.close()


def payload(ledger: int, entry: int) -> bytes:
    return b"ledger-%d-entry-%d-" % (ledger, entry) + bytes(entry % 97)


async def write_ledgers(client: LedgerClient) -> list[int]:
    """Ledgers with E=Qw=3 Qa=2, on 3 of the 4 bookies each: one HMAC, one empty, one
    left OPEN, the others closed."""
    ids: list[int] = []
    for n in range(LEDGERS):
        w = await client.create_ledger(
            ensemble_size=3,
            write_quorum=3,
            ack_quorum=2,
            password=b"pw",
            digest_type="hmac_sha256" if n == 0 else "crc32c",
        )
        count = 0 if n == 1 else ENTRIES
        await asyncio.gather(*[await w.submit(payload(n, i)) for i in range(count)])
        if n != 2:  # ledger 2 stays OPEN: its writer "died"; workers recover it first
            await w.close()
        ids.append(w.ledger_id)
    return ids


async def wait_until_clean(md: MetadataClient, bookie: str) -> None:
    async def clean() -> bool:
        return not await ledgers_on(md, bookie) and not await md.underreplicated.list()

    await wait_for(clean, f"no ledger on {bookie}, none under-replicated", timeout_s=WAIT_S,
                   interval_s=0.2)  # fmt: skip


async def check_fully_replicated(
    client: LedgerClient, ids: list[int], gone: str, repaired: set[int]
) -> None:
    """Metadata never names ``gone``; in the ledgers that named it (``repaired``) each
    entry is on every bookie of its write set; every entry reads back byte-identical.

    Ledgers autorecovery did not touch are only read back: the writer closes once Qa
    replicas acknowledged, so their third replica of an entry may be missing."""
    pool = BookieClientPool()
    try:
        for n, ledger_id in enumerate(ids):
            meta, _v = await client.store.read(ledger_id)
            assert meta.is_closed
            assert gone not in meta.all_bookies(), (ledger_id, meta.segments)
            held = {}
            if ledger_id in repaired and meta.last_entry_id >= 0:  # else no ledger on bookies
                for b in meta.all_bookies():
                    held[b] = set(
                        await pool.get(b).list_entries(ledger_id, master_key=master_key(b"pw"))
                    )
            for entry_id in range(meta.last_entry_id + 1 if held else 0):
                for b in meta.replicas(entry_id):
                    assert entry_id in held[b], (ledger_id, entry_id, b)
            reader = await client.open_ledger(ledger_id, b"pw", recover=False)
            got = await reader.read(0, meta.last_entry_id)
            count = 0 if n == 1 else ENTRIES
            assert got == [payload(n, i) for i in range(count)]
    finally:
        await pool.close()


def most_used(metas: list[LedgerMetadata]) -> str:
    """The bookie in most ledgers among those of the OPEN ledger (so it is covered too)."""
    counts: dict[str, int] = dict.fromkeys(metas[2].all_bookies(), 0)
    for m in metas:
        for b in m.all_bookies() & counts.keys():
            counts[b] += 1
    return max(sorted(counts), key=lambda b: counts[b])


# -- integration ----------------------------------------------------------------------


@pytest.mark.integration
async def test_killed_bookie_is_rereplicated(cluster: Cluster) -> None:
    await start(cluster, 4)
    async with parts(cluster) as (md, client, lister):
        await wait_writable(client, 4)
        ids = await write_ledgers(client)
        metas = [(await client.store.read(i))[0] for i in ids]
        victim = most_used(metas)
        repaired = {m.ledger_id for m in metas if victim in m.all_bookies()}
        procs.kill9(cluster.by_id(victim).proc)
        ar = Autorecovery(md, client, FAST, instance_id="ar-1", list_entries=lister)
        await ar.start()
        try:
            await wait_for(lambda: ar.auditor.marked, "the auditor to notice and mark",
                           timeout_s=WAIT_S, interval_s=0.1)  # fmt: skip
            await wait_until_clean(md, victim)
        finally:
            await ar.stop()
        assert ar.worker.replicated >= 1
        await check_fully_replicated(client, ids, victim, repaired)


@pytest.mark.integration
async def test_decommission_drains_a_live_bookie(cluster: Cluster) -> None:
    await start(cluster, 4)
    async with parts(cluster) as (md, client, _lister):
        await wait_writable(client, 4)
        ids = await write_ledgers(client)
        metas = [(await client.store.read(i))[0] for i in ids]
        target = most_used(metas)
        repaired = {m.ledger_id for m in metas if target in m.all_bookies()}
        found = len(await ledgers_on(md, target))
        argv = [BOOKLINE, "bookie", "decommission", target, "--zk", cluster.zk,
                "--root", cluster.root, "--json", "--timeout-ms", "40000",
                "--open-ledger-grace-ms", "0"]  # fmt: skip
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, timeout=WAIT_S, check=False
        )
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
        assert summary["ledgers_found"] == found > 0
        assert await ledgers_on(md, target) == []
        assert await md.underreplicated.list() == []
        procs.stop(cluster.by_id(target).proc, grace_s=5.0)  # now safe to stop
        await check_fully_replicated(client, ids, target, repaired)


@pytest.mark.integration
async def test_auditor_failover(zk_connect: str, cluster_root: str) -> None:
    config = MetadataConfig(zk=zk_connect, root=cluster_root, session_timeout_ms=4_000)
    mds = [MetadataClient(config), MetadataClient(config)]
    tasks: list[asyncio.Task[None]] = []
    try:
        for md in mds:
            await md.connect()
        await mds[0].init_cluster()
        # A closed ledger on a bookie that never registers: lost before anyone audits.
        await mds[0].ledgers.create(
            LedgerMetadata(
                ledger_id=42,
                ensemble_size=2,
                write_quorum=2,
                ack_quorum=1,
                segments=(Segment(0, ("ghost:1", "ghost:2")),),
                state=LedgerState.CLOSED,
                last_entry_id=9,
            )
        )
        slow = dataclasses.replace(FAST, grace_ms=60_000)
        auditors = [Auditor(mds[0], slow, "a-0"), Auditor(mds[1], FAST, "a-1")]
        tasks = [asyncio.create_task(auditors[0].run())]
        await wait_for(lambda: auditors[0].is_leader, "a-0 to lead", timeout_s=WAIT_S)
        tasks.append(asyncio.create_task(auditors[1].run()))
        await asyncio.sleep(0.5)  # behaviour: a-1 runs a while, and does not take over
        assert not leading(auditors[1])
        assert await current_leader(mds[1]) == "a-0"
        assert await mds[1].underreplicated.list() == []  # a-0's grace is a minute
        # The leader's process "dies": its session expires, then its code stops (before it
        # could stand again on a new session).
        await expire_session(zk_connect, mds[0].zk)
        tasks[0].cancel()

        async def leader_is(want: str | None) -> bool:
            return await current_leader(mds[1]) == want

        async def marked() -> bool:
            return await mds[1].underreplicated.list() == [42]

        await wait_for(lambda: leader_is("a-1"), "a-1 to lead", timeout_s=WAIT_S)
        await wait_for(marked, "a-1 to mark ledger 42", timeout_s=WAIT_S, interval_s=0.1)
        item = await mds[1].underreplicated.get(42)
        assert item.missing_bookies == {"ghost:1", "ghost:2"}
        assert leading(auditors[1])
        tasks[1].cancel()  # stopped with its session alive: it resigns at once
        await wait_for(lambda: leader_is(None), "a-1 to resign", timeout_s=5.0)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):  # cancelled just above
                await task
        for md in mds:
            await md.close()


def leading(auditor: Auditor) -> bool:
    return auditor.is_leader  # a call, so the type checker does not pin the last answer


@pytest.mark.integration
async def test_autorecovery_process_runs_until_sigterm(
    zk_connect: str, cluster_root: str, tmp_path: Path
) -> None:
    md = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root))
    await md.connect()
    log = tmp_path / "autorecovery.log"
    argv = [BOOKLINE, "autorecovery", "--zk", zk_connect, "--root", cluster_root,
            "--grace-ms", "2000"]  # fmt: skip
    try:
        missing = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=WAIT_S)
        assert missing.returncode == 1
        assert b"NOT_FOUND (17)" in missing.stderr
        await md.init_cluster()
        proc = procs.spawn(argv, log_path=log)
        try:

            async def leading_process() -> bool:
                assert proc.poll() is None, log.read_text()[-3000:]
                return await current_leader(md) is not None

            await wait_for(leading_process, "the autorecovery process to lead", timeout_s=WAIT_S,
                           interval_s=0.1)  # fmt: skip
            assert b"autorecovery ready" in log.read_bytes()
            code = await asyncio.to_thread(procs.stop, proc, 10.0)
            assert code == 0, log.read_text()[-3000:]
            assert await current_leader(md) is None
        finally:
            procs.stop(proc, grace_s=5.0)
    finally:
        await md.close()


# -- replica check: work items with repair entries, and the worker ---------------------


@pytest.fixture
async def md(zk_connect: str, cluster_root: str) -> AsyncIterator[MetadataClient]:
    async with metadata_clients(zk_connect, cluster_root) as c:
        yield await c.new()


@pytest.mark.integration
async def test_work_items_carry_repair_entries(md: MetadataClient) -> None:
    ur = md.underreplicated
    path = md.layout.underreplicated(3)
    await ur.mark(3, {"gone"})
    data, _v = await md.zk.get(path)
    assert serde.decode(data, "underreplicated", 1)[0] == 1  # old workers still read it
    await ur.mark(3, repair_entries={"b": [(5, 9), (10, 10)]})
    await ur.mark(3, repair_entries={"b": [(20, 20)], "c": [(1, 1)]})
    await ur.mark(3, {"gone2"})  # keeps the ranges
    item = await ur.get(3)
    assert item.missing_bookies == {"gone", "gone2"}
    assert item.repair_entries == {"b": ((5, 10), (20, 20)), "c": ((1, 1),)}
    data, _v = await md.zk.get(path)
    with pytest.raises(MetadataFormatError, match="newer"):  # an old worker refuses it
        serde.decode(data, "underreplicated", 1)
    # Scattered damage stays bounded: the closest ranges are merged.
    scattered = [(i * 10, i * 10) for i in range(RANGES_PER_BOOKIE_MAX + 50)]
    await ur.mark(4, repair_entries={"b": scattered})
    ranges = (await ur.get(4)).repair_entries["b"]
    assert len(ranges) == RANGES_PER_BOOKIE_MAX
    assert ranges_cover(ranges, tuple(scattered))
    # A mark that adds nothing leaves the item (and its version) alone.
    before = await ur.get(3)
    await ur.mark(3, repair_entries={"b": [(6, 7)]})
    assert (await ur.get(3)).version == before.version


@pytest.mark.integration
async def test_worker_recopies_entries_to_a_live_bookie(md: MetadataClient) -> None:
    """Worker and work items on real ZooKeeper, bookies in memory: damaged and missing
    copies are re-copied from a verified replica to the same bookie, the metadata is
    left alone, the item cleared; an unregistered target fails the pass."""
    cands = candidates(3)
    bookies = MemoryBookies([c.bookie_id for c in cands])
    store = MemoryMetadataStore(cands)
    client = LedgerClient(store, bookies, LEDGER_FAST, rng=random.Random(3))
    for c in cands[:2]:  # bookie-2 is not registered
        await md.bookies.register(BookieInfo(c.bookie_id, c.bookie_id))
    w = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw")
    await asyncio.gather(*[await w.submit(b"e%d" % i) for i in range(20)])
    await w.close()
    lid = w.ledger_id
    before, version = await store.read(lid)
    bookies["bookie-1"].corrupt(lid, 4, detected=True)
    bookies["bookie-1"].corrupt(lid, 5)  # silent: the scrub calls it mismatched
    del bookies["bookie-0"].ledgers[lid].entries[17]
    await md.underreplicated.mark(
        lid, repair_entries={"bookie-1": [(4, 5)], "bookie-0": [(17, 19)]}
    )
    now = [0.0]  # the worker's injected clock: its backoff passes without sleeping
    worker = ReplicationWorker(md, client, FAST, "w", clock=lambda: now[0])
    assert await worker.run_once() == {lid: Outcome.REPLICATED}
    assert worker.entries_repaired == 2 + 3  # 18 and 19 were intact: re-sent, harmless
    good = bookies["bookie-2"].ledgers[lid].entries
    for b in ("bookie-0", "bookie-1"):
        assert bookies[b].ledgers[lid].entries == good
        assert not bookies[b].damaged
    assert await store.read(lid) == (before, version)  # no metadata change
    assert await md.underreplicated.list() == []
    # A target that is not registered (down, or gone and not yet marked lost): retried.
    await md.underreplicated.mark(lid, repair_entries={"bookie-2": [(0, 0)]})
    assert await worker.run_once() == {lid: Outcome.FAILED}
    assert await md.underreplicated.list() == [lid]
    assert await worker.run_once() == {}  # backing off: not tried again yet
    now[0] += FAST.retry_backoff_ms / 1000.0
    # Once it is marked lost, its fragments move; its repair entries are moot.
    await md.bookies.register(BookieInfo("bookie-3", "bookie-3"))
    store.bookies.append(BookieCandidate("bookie-3", ""))
    bookies.bookies["bookie-3"] = MemoryBookie("bookie-3")
    await md.underreplicated.mark(lid, {"bookie-2"})
    assert await worker.run_once() == {lid: Outcome.REPLICATED}
    after, _v = await store.read(lid)
    swapped = tuple("bookie-3" if b == "bookie-2" else b for b in before.segments[0].bookies)
    assert after.segments[0].bookies == swapped
    assert bookies["bookie-3"].ledgers[lid].entries == good


@pytest.mark.integration
async def test_replica_check_schedule_survives_a_new_auditor(md: MetadataClient) -> None:
    """The last full check's end is kept in ZooKeeper: a new leader waits out the rest
    of the interval instead of checking every ledger again at once (or never, when
    leaders change more often than the interval)."""
    wall_ms = [1_000_000]
    config = dataclasses.replace(FAST, replica_check_interval_ms=60_000)

    def auditor(name: str) -> Auditor:
        return Auditor(md, config, name, clock=lambda: 100.0, wall_ms=lambda: wall_ms[0])

    first = auditor("a-1")
    assert await first._first_replica_check(60.0) == 100.0  # none recorded: at once
    await first._note_replica_check()
    wall_ms[0] += 15_000
    assert await auditor("a-2")._first_replica_check(60.0) == pytest.approx(145.0)
    wall_ms[0] += 100_000  # overdue: at once
    assert await auditor("a-3")._first_replica_check(60.0) == 100.0
    wall_ms[0] -= 500_000  # a wall clock set back never delays it past one interval
    assert await auditor("a-4")._first_replica_check(60.0) == 160.0
