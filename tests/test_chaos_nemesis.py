"""The nemesis (ops/chaos/nemesis.py) against a real namespaced chaos cluster: a seed
replays the same faults; each kind of fault does what it says while held, and the
cluster serves again (every host running and reachable, writes acknowledged) once it
is healed; heal_all heals faults left standing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ops.chaos.hosts import ChaosCluster, Node
from ops.chaos.nemesis import NETWORK_KINDS, Fault, Nemesis, Plan, ProcessTarget, Step
from ops.cluster import procs
from tests.test_chaos_hosts import PROBLEM
from tests.waiting import wait_until
from thinclient.client import ClientConfig, ProxyClient

pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no namespaces: {PROBLEM}")

CONNECT_TIMEOUT_S = 1.0
# After a heal every host answers again within this.
SERVE_TIMEOUT_S = 30.0
CLIENT = ClientConfig(request_timeout_ms=5_000, retry_deadline_ms=60_000)
# Short holds: the faults' effects are checked while they are held, not their length.
HOLD_S = 1.0
# A bookie's exit status after a fatal storage error (bookie/main.py EXIT_FATAL).
FATAL_STORAGE_EXIT = 3


def _reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _serving(cluster: ChaosCluster) -> None:
    """Every host runs and takes connections from the root namespace."""
    for node in cluster.nodes:
        assert node.is_running(), f"{node.id} is down after the heal"
        wait_until(
            functools.partial(_reachable, node.address), n_name(node), timeout_s=SERVE_TIMEOUT_S
        )


def n_name(node: Node) -> str:
    return f"{node.id} at {node.address} reachable"


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(tmp_path_factory.mktemp("nemesis"), namespaces=True, seed=7)
    cluster.start()
    try:
        assert cluster.namespaces, cluster.skip_reason
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def client(chaos: ChaosCluster) -> AsyncIterator[ProxyClient]:
    c = ProxyClient.from_cluster_file(chaos.cluster_file, config=CLIENT)
    await c.start()
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[ProcessTarget]:
    """A stand-in for bookline chaos's writer processes: a sleeping child."""
    state: dict[str, subprocess.Popen[bytes]] = {}

    def start() -> None:
        argv = [sys.executable, "-c", "import time; time.sleep(600)"]
        state["proc"] = procs.spawn(argv, log_path=tmp_path / "writer.log")

    start()
    try:
        yield ProcessTarget("writer-1", lambda: state.get("proc"), start)
    finally:
        procs.stop(state["proc"])


def test_a_seed_replays_the_same_faults(chaos: ChaosCluster, writer: ProcessTarget) -> None:
    def sequence(seed: int) -> list[Plan]:
        nemesis = Nemesis(chaos, random.Random(seed))
        nemesis.add_target(writer)
        return [nemesis.plan() for _ in range(300)]

    first = sequence(1515)
    assert first == sequence(1515)
    assert first != sequence(1516)
    kinds = {p.kind for p in first}
    assert set(NETWORK_KINDS) <= kinds and {"kill", "pause", "power-cut", "bit-flip"} <= kinds
    assert "writer-1" in {p.target for p in first if p.kind in ("kill", "pause")}
    pauses = [p for p in first if p.kind == "pause"]
    assert min(p.hold_s for p in pauses) > 4.0  # longer than the 4 s session timeout


def test_every_other_step_overlaps_faults(chaos: ChaosCluster, writer: ProcessTarget) -> None:
    """Issue 21: faults never overlapped. Every other step is now an overlap scenario,
    drawn from the seed: Qa or more bookies down at once, a kill inside a network
    fault, a bookie lost while a ZooKeeper server is cut off or down."""

    def steps(seed: int) -> list[Step]:
        nemesis = Nemesis(chaos, random.Random(seed))
        nemesis.add_target(writer)
        return [nemesis.plan_step() for _ in range(200)]

    first = steps(21)
    assert first == steps(21)
    overlaps = first[1::2]
    assert all(s.scenario != "single" and len(s.plans) >= 2 for s in overlaps)
    assert all(s.scenario == "single" and len(s.plans) == 1 for s in first[0::2])
    bookies = {b.id for b in chaos.bookies}
    for s in overlaps:
        outer, inner = s.plans[0], s.plans[1:]
        assert all(0 < p.delay_s < outer.hold_s for p in inner), s  # starts while it holds
        if s.scenario == "bookies-down":
            assert len({p.target for p in s.plans}) == len(s.plans) >= 2
            assert {p.target for p in s.plans} <= bookies
            assert {p.kind for p in s.plans} <= {"kill", "power-cut"}
        elif s.scenario == "partition-during-kill":
            assert outer.kind in NETWORK_KINDS and inner[0].kind == "kill"
        else:
            assert outer.target.startswith("zookeeper-") and inner[0].target in bookies
    scenarios = {s.scenario for s in overlaps}
    assert scenarios == {
        "bookies-down", "partition-during-kill", "zk-minority-during-bookie-loss"
    }  # fmt: skip
    assert any(len(s.plans) == 3 for s in overlaps if s.scenario == "bookies-down")


async def _write(client: ProxyClient, what: str) -> None:
    await _write_to(client, "nemesis", what)


async def _write_to(client: ProxyClient, stream: str, what: str) -> None:
    await client.write(stream, what.encode())


async def _fault(nemesis: Nemesis, kind: str, target: str, detail: str = "") -> Fault:
    return await nemesis.run(Plan(kind, target, HOLD_S, detail))


async def test_kill_and_pause_are_healed(
    chaos: ChaosCluster, client: ProxyClient, writer: ProcessTarget
) -> None:
    nemesis = Nemesis(chaos, random.Random(1))
    nemesis.add_target(writer)
    bookie = chaos.bookies[0]
    before = bookie.pid
    fault = await _fault(nemesis, "kill", bookie.id)
    assert bookie.pid != before and bookie.is_running()
    assert fault.healed_at - fault.started_at >= HOLD_S
    assert fault.effective and fault.evidence.startswith(f"pid {before} gone"), fault
    old_writer = writer._current()
    await _fault(nemesis, "kill", "writer-1")
    assert writer.is_running() and writer._current() is not old_writer
    paused = await _fault(nemesis, "pause", chaos.write_proxies[0].id)
    assert paused.effective and "state T" in paused.evidence, paused
    zk = chaos.zookeepers[1]
    before = zk.pid
    await _fault(nemesis, "kill", zk.id)
    assert zk.pid != before and zk.is_running()
    assert chaos.paused == set()
    _serving(chaos)
    await _write(client, "after kill and pause")
    assert nemesis.counts() == {"kill": 3, "pause": 1}


def _reachable_from(source: Node, target: Node) -> bool:
    """Whether ``source``'s host can open a connection to ``target``'s service."""
    assert source.net is not None
    host, port = target.address.rsplit(":", 1)
    code = (
        "import socket, sys\n"
        f"try: socket.create_connection(({host!r}, {port}), timeout={CONNECT_TIMEOUT_S})\n"
        "except OSError: sys.exit(1)\n"
    )
    argv = ["ip", "netns", "exec", source.net.ns, sys.executable, "-c", code]
    return subprocess.run(argv, timeout=30, check=False).returncode == 0


@contextlib.asynccontextmanager
async def _held(nemesis: Nemesis, kind: str, target: str, detail: str = "") -> AsyncIterator[None]:
    """The fault started (the block looks at it), then healed."""
    heal = await asyncio.to_thread(nemesis.begin, Plan(kind, target, 0.0, detail))
    try:
        yield
    finally:
        await asyncio.to_thread(heal)


async def test_network_faults_cut_while_held_and_heal(
    chaos: ChaosCluster, client: ProxyClient
) -> None:
    nemesis = Nemesis(chaos, random.Random(2))
    b1, b2 = chaos.bookies[0], chaos.bookies[1]
    zk1, zk2 = chaos.zookeepers[0], chaos.zookeepers[1]
    wp1 = chaos.write_proxies[0]

    async with _held(nemesis, "link-down", b2.id):
        assert not _reachable(b2.address) and _reachable(b1.address)
    async with _held(nemesis, "partition-zk-minority", zk1.id):
        assert not _reachable_from(zk2, zk1) and not _reachable_from(b1, zk1)
        assert _reachable_from(b1, zk2) and _reachable(zk1.address)  # root still reaches it
    halves = f"{zk1.id},{b2.id}|" + ",".join(n.id for n in chaos.nodes if n not in (zk1, b2))
    async with _held(nemesis, "partition-halves", halves):
        assert not _reachable_from(b1, b2) and not _reachable_from(zk2, zk1)
        assert _reachable_from(b2, zk1) and _reachable_from(b1, zk2)
    async with _held(nemesis, "one-way", f"{b2.id}<-{wp1.id}"):
        assert not _reachable_from(wp1, b2) and _reachable_from(b1, b2)
    async with _held(nemesis, "bookie-cut-from-proxies", b2.id):
        assert not _reachable_from(wp1, b2) and _reachable_from(b2, zk1)
    _serving(chaos)
    await _write(client, "after the partitions")


async def test_heal_all_heals_what_was_left_standing(
    chaos: ChaosCluster, client: ProxyClient
) -> None:
    nemesis = Nemesis(chaos, random.Random(3))
    assert chaos.network is not None
    bookie, proxy, zk = chaos.bookies[2], chaos.write_proxies[1], chaos.zookeepers[2]
    assert bookie.net is not None and zk.net is not None
    chaos.network.set_link(bookie.net, up=False)
    chaos.network.block(zk.net, "left", [n.net for n in chaos.zookeepers if n.net], both=True)
    proxy.pause()
    chaos.bookies[3].kill9()
    await nemesis.heal_all()
    _serving(chaos)
    assert chaos.paused == set()
    await _write(client, "after heal_all")


def _cmdline(node: Node) -> list[str]:
    return Path(f"/proc/{node.pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


async def test_storage_faults_hit_a_serving_bookie_and_are_verified(
    chaos: ChaosCluster, client: ProxyClient
) -> None:
    """Issue 21: an injected fsync EIO failed an fsync in 1 of 6 injections (the bookie
    was restarted with the shim and got no writes), and "disk full" stopped the bookie
    fatally. Every chaos bookie runs under the power-cut overlay; the faults switch on
    in a bookie that serves, and each counts only once it took effect."""
    nemesis = Nemesis(chaos, random.Random(4))
    bookie = chaos.bookies[0]
    assert _cmdline(bookie)[-2:] == ["--fault-shim", "power-cut"]

    async def writes(prefix: str) -> None:
        # Fresh streams get fresh ledgers: 3 of the 4 bookies are in each ensemble.
        for i in range(8):
            await _write_to(client, f"{prefix}-{i}", "while a storage fault holds")

    cut = await nemesis.run(Plan("power-cut", bookie.id, HOLD_S))
    assert cut.effective and "power-cut overlay" in cut.evidence, cut
    full_task = asyncio.create_task(nemesis.run(Plan("disk-full", bookie.id, HOLD_S)))
    await writes("full")
    full = await full_task
    assert full.effective and "read-only" in full.evidence, full
    assert bookie.is_running()  # read-only, not stopped
    eio_task = asyncio.create_task(nemesis.run(Plan("fsync-eio", bookie.id, HOLD_S)))
    await writes("eio")
    eio = await eio_task
    assert eio.effective and "failed with EIO" in eio.evidence, eio
    assert nemesis.ineffective() == {}
    for node in chaos.bookies:
        names = {p.name for p in node.data_dirs["journal"].iterdir()}
        assert not names & {"FAULTS.toml", "FAULTS.hits"}
        assert _cmdline(node)[-2:] == ["--fault-shim", "power-cut"]
    _serving(chaos)
    await _write(client, "after the storage faults")


async def test_overlapping_bookie_losses_and_a_verified_partition(
    chaos: ChaosCluster, client: ProxyClient
) -> None:
    nemesis = Nemesis(chaos, random.Random(6))
    b1, b2, zk1 = chaos.bookies[1], chaos.bookies[2], chaos.zookeepers[0]
    step = Step("bookies-down", (
        Plan("power-cut", b1.id, 3.0), Plan("kill", b2.id, 1.0, delay_s=0.5),
    ))  # fmt: skip
    faults = await nemesis.run_step(step)
    assert all(f.effective and f.overlapped for f in faults), faults
    assert nemesis.overlap_stats() == {"faults_overlapping": 2, "bookies_down_max": 2}
    step = Step("zk-minority-during-bookie-loss", (
        Plan("partition-zk-minority", zk1.id, 3.0), Plan("kill", b1.id, 1.0, delay_s=0.5),
    ))  # fmt: skip
    partition, kill = await nemesis.run_step(step)
    assert partition.effective and "does not get through" in partition.evidence, partition
    assert kill.effective and partition.overlapped and kill.overlapped
    assert nemesis.counts() == {"power-cut": 1, "kill": 2, "partition-zk-minority": 1}
    _serving(chaos)
    await _write(client, "after the overlapping faults")


async def test_bit_flip_damages_an_entry_log_of_a_stopped_bookie(
    chaos: ChaosCluster, client: ProxyClient
) -> None:
    nemesis = Nemesis(chaos, random.Random(5))
    bookie = chaos.bookies[3]
    # Fresh streams, fresh ledgers: 3 of the 4 bookies are in each one's ensemble.
    for i in range(6):
        await _write_to(client, f"flip-{i}", "to be damaged on one replica")
    fault = await nemesis.run(Plan("bit-flip", bookie.id, HOLD_S, "position=0.5 bit=3"))
    assert len(fault.notes) == 1 and fault.notes[0].startswith("flipped bit 3 at "), fault.notes
    assert bookie.is_running()
    _serving(chaos)
    await _write(client, "after a bit flip")
