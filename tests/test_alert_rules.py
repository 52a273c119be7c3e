"""The alert rules (ops/monitoring/bookline-alerts.yml) against real scrapes, with
``promtool test rules`` (Debian's prometheus package; ops/setup.sh installs it; the
scrape-to-series plumbing is tests/alert_support.py).

One local cluster (4 bookies with the storage fault shim on, a write proxy with a small
per-stream in-flight bound and the stall hook, a read proxy, autorecovery) is put
through states one after another, each the state a rule is meant to catch; every rule
fires in at least one, from the cluster's own metrics:

==================  ===============================================================
state               alerts it must fire
==================  ===============================================================
healthy             none (and none of the speed-independent ones)
slow-writes         WriteLatencyHigh (the write proxy's stall hook)
slow-disks          JournalFsyncSlow, AddLatencyHigh (the shim's ``fsync_delay_ms``),
                    WriteProxyOverloaded (a burst on one stream: 429)
damaged-entry       DamagedEntries, ChecksumFailures (a bit flipped in a stopped
                    bookie's entry log, the entry read after its restart)
bookie-killed       EnsembleChurn (kill -9 of a bookie under writers), ServiceDown
consumer-lag        ConsumerLag (a member that never commits, 100,001 records behind)
disk-full           BookieReadOnly, BookieDiskFilling (the shim's ``disk_bytes_max``)
no-replacement      UnderReplicatedLedgers, ReplicationFailing, ServiceDown (a second
                    bookie killed: the lost replicas have nowhere to go)
all-down            ServiceDown, NoAuditor, ProxyServerErrors (write proxy 5xx)
==================  ===============================================================

A state also names the alerts that must NOT fire in it; the latency alerts are never
among them (a write on a loaded machine may well take 0.5 s: whether they fire in a
healthy state says nothing about the rules).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from bookie.client import BookieClientPool
from bookie.storage import faults
from foundation.config import MetadataConfig
from foundation.names import partition_stream
from groups.coordinator_client import CoordinatorClient
from groups.topics import TopicAdmin
from ledger.autorecovery import connect_parts
from ops.cluster import procs
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from streams.namespace import Namespace
from streams.records import LogRecord
from tests.alert_support import Window, check, instance, rules, scrape
from tests.cluster_support import started_cluster
from tests.test_ledger_integration import config
from tests.test_scrub_integration import flip_payload_bit, read_from
from tests.waiting import wait_for, wait_until
from thinclient.client import ProxyClient

pytestmark = pytest.mark.integration

# A write stalled by the proxy's fault hook answers after this long (> the rule's 0.5 s).
STALL_MS = 1500
# Every journal fsync takes this much longer on the "slow disks" (> the rules' 0.1 s
# fsync and 0.25 s add thresholds, whatever the histograms' buckets around them).
FSYNC_DELAY_MS = 600
# Write requests in flight per stream; a burst of BURST on one stream mostly gets 429.
STREAM_INFLIGHT = 2
BURST = 100
# Requests made while every bookie is down; concurrent, so their 5xx rate is well
# above the rule's 0.1/s whatever the machine's speed (they fail within their timeout).
FAILING_REQUESTS = 30
REQUEST_TIMEOUT_S = 120.0
# Streams written before a bookie is killed: each ledger holds 3 of the 4 bookies, so
# some of them surely have the victim in their ensemble.
CHURN_STREAMS = 8
LAG_RECORDS = 100_001  # the rule's threshold is 100,000
# A bookie away this long has its ledgers marked under-replicated: longer than the
# damaged-entry state's restart of a bookie (it must stay the bookie holding the entry).
GRACE_MS = 15_000
WAIT_S = 180.0
SPEED = {"BooklineWriteLatencyHigh", "BooklineAddLatencyHigh", "BooklineJournalFsyncSlow"}
WP_JOB, BOOKIE_JOB, AR_JOB = "bookline-writeproxy", "bookline-bookie", "bookline-autorecovery"


def _all() -> set[str]:
    return {str(r["alert"]) for r in rules()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(
        tmp_path_factory.mktemp("alerts"),
        bookies=4,
        write_proxies=1,
        read_proxies=1,
        proxy_args={
            "writeproxy": [
                "--fault-stall-writes",
                "1000",
                "--fault-stall-ms",
                str(STALL_MS),
                "--stream-inflight-requests-max",
                str(STREAM_INFLIGHT),
            ]
        },
        autorecovery=True,
        autorecovery_args=[
            "--grace-ms",
            str(GRACE_MS),
            "--retry-backoff-ms",
            "1000",
            "--worker-poll-ms",
            "500",
            # Nothing repairs the damaged entry while its state is looked at.
            "--damaged-poll-interval-ms",
            "0",
            "--replica-check-interval-ms",
            "0",
        ],
        service_session_timeout_ms=4_000,
        # Each bookie's disk a simulated 1 TiB: the states' disk usage is the cluster's
        # own, never how full the machine running the test happens to be.
        extra_args={
            f"bookie-{i}": ["--fault-shim", "on", "--fault-disk-bytes-max", str(1 << 40)]
            for i in range(1, 5)
        },
    ) as c:
        yield c


def _journal(cluster: LocalCluster, name: str) -> Path:
    return cluster.dir / name / "journal"


def _bookie(cluster: LocalCluster, name: str) -> dict[str, str]:
    info = next(b for b in cluster.bookies if b.name == name)
    return {"job": BOOKIE_JOB, "instance": instance(str(info.extra["metrics"]))}


async def _window(cluster: LocalCluster, act: Callable[[], Awaitable[None]]) -> Window:
    before = await scrape(cluster)
    await act()
    return Window(before, await scrape(cluster))


async def _eventually(check_: Callable[[], Awaitable[bool]], what: str) -> None:
    await wait_for(check_, what, timeout_s=WAIT_S, interval_s=0.2)


def _tree_bytes(root: Path) -> int:
    """Apparent size of the files under ``root``: the fault shim's simulated disk use."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def _metric(cluster: LocalCluster, name: str, inst: str) -> float:
    return Window(await scrape(cluster), await scrape(cluster)).value(name, inst) or 0.0


class States:
    """The cluster's states, in order (each builds on the one before)."""

    def __init__(self, cluster: LocalCluster, session: aiohttp.ClientSession, tmp: Path) -> None:
        self.c, self.session, self.tmp = cluster, session, tmp
        self.wp = str(cluster.write_proxies[0].extra["url"])
        self.rp = str(cluster.read_proxies[0].extra["url"])
        self.wp_i = instance(self.wp)
        self.tag = uuid.uuid4().hex[:8]
        self.fired: set[str] = set()

    def check(self, name: str, w: Window, fire: dict[str, list[dict[str, str]]],
              quiet: set[str]) -> None:  # fmt: skip
        check(self.tmp, name, w, fire, quiet - set(fire))
        self.fired |= {a for a, labels in fire.items() if labels}

    async def post(self, stream: str) -> int:
        url = f"{self.wp}/v1/streams/{stream}/records"
        async with self.session.post(url, json={"payload": "hi"}) as resp:
            await resp.read()
            return resp.status

    async def get(self, stream: str) -> int:
        url = f"{self.rp}/v1/streams/{stream}/records?from=earliest&limit=1"
        async with self.session.get(url) as resp:
            await resp.read()
            return resp.status

    async def healthy(self) -> None:
        ar = instance(str(self.c.autorecovery[0].extra["metrics"]))

        async def elected() -> bool:
            return await _metric(self.c, "bookline_autorecovery_auditor_leader", ar) == 1

        await _eventually(elected, "an auditor is elected")

        async def act() -> None:
            for _ in range(20):
                assert await self.post(f"h-{self.tag}") == 200
            assert await self.get(f"h-{self.tag}") == 200

        self.check("healthy", await _window(self.c, act), {}, _all() - SPEED)

    async def slow_writes(self) -> None:
        async def act() -> None:
            posts = (self.post(f"fault-{self.tag}-{i}") for i in range(5))
            assert set(await asyncio.gather(*posts)) == {200}

        w = await _window(self.c, act)
        fire = {"BooklineWriteLatencyHigh": [{"instance": self.wp_i}]}
        self.check("slow-writes", w, fire, _all() - SPEED)

    async def slow_disks(self) -> None:
        for b in self.c.bookies:
            (_journal(self.c, b.name) / faults.CONTROL_FILE).write_text(
                f"fsync_delay_ms = {FSYNC_DELAY_MS}\n"
            )
        # Every fsync from here on is slow (a group commit under way may not be).
        assert await self.post(f"slow-{self.tag}") == 200
        rejected: list[int] = []

        async def act() -> None:
            for _ in range(3):
                assert await self.post(f"slow-{self.tag}") == 200
            statuses = await asyncio.gather(*(self.post(f"burst-{self.tag}") for _ in range(BURST)))
            rejected.extend(s for s in statuses if s == 429)
            assert set(statuses) <= {200, 429}, statuses

        w = await _window(self.c, act)
        for b in self.c.bookies:
            (_journal(self.c, b.name) / faults.CONTROL_FILE).unlink()
        assert len(rejected) >= BURST // 2, f"only {len(rejected)} of {BURST} got 429"
        fsynced = w.grew("bookline_bookie_journal_fsync_seconds_count")
        added = w.grew("bookline_ledger_add_seconds_count")
        assert len(fsynced) >= 3 and self.wp_i in added, (fsynced, added)
        fire = {
            "BooklineJournalFsyncSlow": [{"instance": i} for i in sorted(fsynced)],
            "BooklineAddLatencyHigh": [{"instance": i} for i in sorted(added)],
            "BooklineWriteProxyOverloaded": [
                {"job": WP_JOB, "instance": self.wp_i, "reason": "overloaded"}
            ],
        }
        quiet = {"BooklineServiceDown", "BooklineProxyServerErrors", "BooklineEnsembleChurn"}
        self.check("slow-disks", w, fire, quiet)

    async def damaged_entry(self) -> None:
        md = MetadataConfig(zk=self.c.zk_connect, root=CLUSTER_ROOT)
        _md, client, _lister, _inspector = await connect_parts(md, config())
        try:
            ledger = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw"
            )
            marker = f"alert-{self.tag}-".encode()
            await asyncio.gather(*[await ledger.submit(marker + b"%d-" % i + bytes(64))
                                   for i in range(10)])  # fmt: skip
            await ledger.close()
            lid, ensemble = ledger.ledger_id, ledger.metadata.segments[0].bookies
        finally:
            await client.close()
        victim = next(b for b in self.c.bookies if b.name in ensemble)
        procs.stop(victim.proc)  # SIGTERM: its checkpoint puts every entry in entry logs
        self.c.note_exit(victim)
        flip_payload_bit(self.c.dir / victim.name / "ledgers", marker + b"7-")
        fresh = self.c.respawn(victim)
        wait_until(lambda: self.c.is_ready(fresh), f"{fresh.name} restarted", timeout_s=WAIT_S)
        pool = BookieClientPool()
        bi = _bookie(self.c, fresh.name)["instance"]

        async def act() -> None:
            got = await read_from(pool, str(fresh.address), lid, 10)
            assert got[7] == "CHECKSUM" and sum(v == "CHECKSUM" for v in got.values()) == 1, got

            async def counted() -> bool:  # the bookie's figures are refreshed, not live
                return await _metric(self.c, "bookline_bookie_damaged_entries", bi) == 1

            await _eventually(counted, "the bookie counts the damaged entry")

        try:
            w = await _window(self.c, act)
        finally:
            await pool.close()
        labels = [_bookie(self.c, fresh.name)]
        fire = {"BooklineDamagedEntries": labels, "BooklineChecksumFailures": labels}
        quiet = {"BooklineServiceDown", "BooklineNoAuditor", "BooklineEnsembleChurn"}
        self.check("damaged-entry", w, fire, quiet)

    async def bookie_killed(self) -> None:
        streams = [f"churn-{self.tag}-{i}" for i in range(CHURN_STREAMS)]
        assert set(await asyncio.gather(*(self.post(s) for s in streams))) == {200}
        victim = self.c.bookies[3]
        changes = "bookline_ledger_ensemble_changes_total"

        async def act() -> None:
            start = await _metric(self.c, changes, self.wp_i)
            procs.kill9(victim.proc)

            async def changed() -> bool:
                await asyncio.gather(*(self.post(s) for s in streams))
                return await _metric(self.c, changes, self.wp_i) > start

            await _eventually(changed, "a writer replaced the killed bookie")

        w = await _window(self.c, act)
        fire = {
            "BooklineEnsembleChurn": [{"job": WP_JOB, "instance": self.wp_i}],
            "BooklineServiceDown": [_bookie(self.c, victim.name)],
        }
        quiet = {"BooklineNoAuditor", "BooklineConsumerLag", "BooklineBookieReadOnly"}
        self.check("bookie-killed", w, fire, quiet)

    async def consumer_lag(self) -> None:
        group, topic = f"g-{self.tag}", f"t-{self.tag}"
        ns = await Namespace.open(self.c.zk_connect, CLUSTER_ROOT, "default")
        client = ProxyClient(write_urls=[self.wp])
        await client.start()
        try:
            await TopicAdmin(ns).create_topic(topic, 1)
            # A member that joined and then never commits: it stopped consuming.
            await CoordinatorClient.of(client).join(group, [topic], session_timeout_ms=300_000)

            async def act() -> None:
                writer = await ns.open_writer(partition_stream(topic, 0))
                try:
                    for lo in range(0, LAG_RECORDS, 20_000):
                        hi = min(lo + 20_000, LAG_RECORDS)
                        await writer.write_many([LogRecord(b"x") for _ in range(lo, hi)])
                finally:
                    await writer.close()

                async def behind() -> bool:
                    return await _lag(self.c, group) >= LAG_RECORDS

                await _eventually(behind, "the lag reaches the records written")

            w = await _window(self.c, act)
        finally:
            await client.close()
            await ns.close()
        fire = {"BooklineConsumerLag": [{"group": group}]}
        self.check("consumer-lag", w, fire, {"BooklineNoAuditor", "BooklineBookieReadOnly"})

    async def disk_full(self) -> None:
        b = self.c.bookies[1]
        bi = _bookie(self.c, b.name)["instance"]
        used = max(_tree_bytes(self.c.dir / b.name / d) for d in ("journal", "ledgers", "index"))
        # The fullest disk 97 % used: past the 0.95 read-only threshold.
        control = _journal(self.c, b.name) / faults.CONTROL_FILE
        control.write_text(f"disk_bytes_max = {int(used / 0.97)}\n")

        async def act() -> None:
            async def read_only() -> bool:
                return await _metric(self.c, "bookline_bookie_read_only", bi) == 1

            await _eventually(read_only, "the bookie turns read-only")

        w = await _window(self.c, act)
        labels = [_bookie(self.c, b.name)]
        fire = {"BooklineBookieReadOnly": labels, "BooklineBookieDiskFilling": labels}
        self.check("disk-full", w, fire, {"BooklineNoAuditor"})

    async def no_replacement(self) -> None:
        ar = instance(str(self.c.autorecovery[0].extra["metrics"]))
        failures = "bookline_autorecovery_replication_failures_total"
        victim = self.c.bookies[2]

        async def act() -> None:
            start = await _metric(self.c, failures, ar)
            procs.kill9(victim.proc)

            async def failing() -> bool:
                marked = await _metric(self.c, "bookline_autorecovery_underreplicated_ledgers", ar)
                return marked > 0 and await _metric(self.c, failures, ar) > start

            await _eventually(failing, "repairs fail: no bookie left to copy to")

        w = await _window(self.c, act)
        fire: dict[str, list[dict[str, str]]] = {
            "BooklineUnderReplicatedLedgers": [{}],
            "BooklineReplicationFailing": [{"job": AR_JOB, "instance": ar}],
            "BooklineServiceDown": [_bookie(self.c, b.name) for b in self.c.bookies[2:]],
        }
        self.check("no-replacement", w, fire, {"BooklineNoAuditor"})

    async def all_down(self) -> None:
        for b in self.c.bookies[:2]:
            procs.kill9(b.proc)
        procs.kill9(self.c.autorecovery[0].proc)

        async def act() -> None:
            fresh = f"down-{self.tag}"
            posts = (self.post(f"{fresh}-{i}") for i in range(FAILING_REQUESTS))
            statuses = await asyncio.gather(*posts)
            assert all(s >= 500 for s in statuses), statuses

        w = await _window(self.c, act)
        down = [_bookie(self.c, b.name) for b in self.c.bookies]
        ar = instance(str(self.c.autorecovery[0].extra["metrics"]))
        fire: dict[str, list[dict[str, str]]] = {
            "BooklineServiceDown": [*down, {"job": AR_JOB, "instance": ar}],
            "BooklineNoAuditor": [{}],
            # Not the read proxy: with every bookie down it answers a stream's read
            # with 200 and no records (not 5xx), so it has nothing to count here.
            "BooklineProxyServerErrors": [{"instance": self.wp_i}],
        }
        self.check("all-down", w, fire, set())


async def _lag(cluster: LocalCluster, group: str) -> float:
    w = Window(await scrape(cluster), await scrape(cluster))
    return max(
        (v for k, v in w.after.samples.items()
         if k.startswith("bookline_group_lag_records{") and f'group="{group}"' in k),
        default=0.0,
    )  # fmt: skip


async def test_each_alert_fires_in_the_state_it_catches(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        s = States(cluster, session, tmp_path)
        await s.healthy()
        await s.slow_writes()
        await s.slow_disks()
        await s.damaged_entry()
        await s.bookie_killed()
        await s.consumer_lag()
        await s.disk_full()
        await s.no_replacement()
        await s.all_down()
    assert s.fired == _all(), f"never made to fire: {_all() - s.fired}"


def test_rules_file_is_valid_for_promtool() -> None:
    import shutil
    import subprocess

    from tests.alert_support import RULES

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: ops/setup.sh installs Debian's prometheus package"
    run = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
