"""The chaos cluster's hosts (ops/chaos/hosts.py, ops/chaos/netns.py), real processes:
every ZooKeeper server, bookie and proxy in a network namespace of its own, reachable
from the root namespace; a host's link down cuts it off and up restores it; nothing of
the namespaces, veths or bridge survives stop(), a failed start or a killed owner."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookline import Namespace, NamespaceConfig, ReadRecord
from ops.chaos import netns
from ops.chaos.hosts import ChaosCluster, namespace_problem
from ops.chaos.nemesis import NETWORK_KINDS, Nemesis
from tests.waiting import wait_until
from thinclient.client import ClientConfig, ProxyClient

# Fail fast when a host is cut off, instead of waiting out the default timeouts.
CONNECT_TIMEOUT_S = 1.0
# A healed host answers again within this.
RESTORE_TIMEOUT_S = 15.0
CLIENT = ClientConfig(request_timeout_ms=5_000, retry_deadline_ms=30_000)


def _problem() -> str | None:
    problem = namespace_problem()
    if problem is not None:
        return problem
    probe = f"blc-probe-{os.getpid()}"  # test workers probe at once: a name of its own
    try:
        netns.run(["ip", "netns", "add", probe])
        netns.run(["ip", "netns", "del", probe])
    except netns.NetnsError as exc:
        return f"cannot create network namespaces: {exc}"
    return None


PROBLEM = _problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no namespaces: {PROBLEM}")


def _ours(slot: int) -> list[str]:
    """Namespaces and links of a chaos slot that exist right now."""
    return [n for n in netns.namespaces() if n.startswith(f"blc-{slot}-")] + [
        link for link in netns.links() if link.startswith(f"blc{slot}-")
    ]


def _reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _wait_reachable(address: str) -> None:
    """Until ``address`` takes connections again: a link that comes back up takes a
    moment (the root namespace asks for the host's MAC address again)."""
    wait_until(lambda: _reachable(address), f"{address} reachable", timeout_s=RESTORE_TIMEOUT_S)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(tmp_path_factory.mktemp("chaos"), namespaces=True, seed=15)
    cluster.start()
    assert cluster.network is not None, cluster.skip_reason
    slot = cluster.network.slot
    try:
        yield cluster
    finally:
        cluster.stop()
    assert _ours(slot) == [], "stop() left namespaces or links behind"


def test_every_host_has_its_own_namespace_and_address(chaos: ChaosCluster) -> None:
    doc = chaos.read_cluster_file()
    hosts = doc["chaos"]["hosts"]
    assert len(hosts) == 10 and chaos.skip_reason is None
    addresses = {h["address"] for h in hosts.values()}
    assert len(addresses) == 10 and all(a.startswith("10.77.") for a in addresses)
    for node in chaos.nodes:
        assert node.address.split(":")[0] == hosts[node.id]["address"]
        # The process runs inside its host's namespace (ip netns exec keeps the pid).
        pids = netns.run(["ip", "netns", "pids", hosts[node.id]["namespace"]]).split()
        assert str(node.pid) in pids, node
    assert doc["zk"] == chaos.zk_connect and "127.0.0.1" not in chaos.zk_connect


async def test_thin_client_write_and_core_read_from_the_root_namespace(
    chaos: ChaosCluster,
) -> None:
    client = ProxyClient.from_cluster_file(chaos.cluster_file, config=CLIENT)
    await client.start()
    try:
        dlsns = [await client.write("hosts", f"r{i}".encode()) for i in range(5)]
    finally:
        await client.close()
    assert dlsns == sorted(dlsns)
    ns = await Namespace.from_cluster_file(
        str(chaos.cluster_file), "default", NamespaceConfig(session_timeout_ms=4_000)
    )
    try:
        reader = await ns.open_reader("hosts")
        try:
            records: list[ReadRecord] = []
            while len(records) < 5:
                batch = await reader.read_many(5 - len(records), timeout_s=20)
                assert batch, f"only {len(records)} of 5 records readable"
                records.extend(batch)
        finally:
            await reader.close()
    finally:
        await ns.close()
    assert [r.payload for r in records] == [f"r{i}".encode() for i in range(5)]


def test_link_down_cuts_a_bookie_off_and_up_restores_it(chaos: ChaosCluster) -> None:
    bookie = chaos.bookies[1]
    assert chaos.network is not None and bookie.net is not None
    _wait_reachable(bookie.address)
    chaos.network.set_link(bookie.net, up=False)
    try:
        assert not _reachable(bookie.address)
        assert _reachable(chaos.bookies[0].address)  # only that host is cut off
    finally:
        chaos.network.set_link(bookie.net, up=True)
    _wait_reachable(bookie.address)


def test_nft_block_drops_one_peer_and_unblock_restores(chaos: ChaosCluster) -> None:
    assert chaos.network is not None
    bookie = chaos.bookies[2]
    assert bookie.net is not None
    root = netns.NetHost("root", "", "", chaos.network.gateway)
    chaos.network.block(bookie.net, "t1", [root], both=True)
    try:
        assert not _reachable(bookie.address)
    finally:
        chaos.network.unblock(bookie.net, "t1")
    _wait_reachable(bookie.address)


def test_a_failed_start_removes_its_namespaces(tmp_path: Path) -> None:
    # A file where the first ZooKeeper's directory goes: the start fails after every
    # namespace was made.
    (tmp_path / "zookeeper-1").write_text("not a directory")
    cluster = ChaosCluster(tmp_path, namespaces=True, seed=1)
    slots: list[int] = []
    real_open = netns.Network.open

    def spy(self: netns.Network) -> netns.Network:
        out = real_open(self)
        slots.append(self.slot)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(netns.Network, "open", spy)
        with pytest.raises(FileExistsError):
            cluster.start()
    assert slots and _ours(slots[0]) == []


def test_leftovers_of_a_killed_owner_are_removed_by_the_next_open() -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from ops.chaos.netns import Network
        net = Network().open()
        net.add_host("x1")
        print(net.slot, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -9, done.stderr
    slot = int(done.stdout.split()[0])
    assert _ours(slot) != []  # the crash left them
    net = netns.Network().open()
    try:
        assert [name for name in _ours(slot) if name != net.bridge] == []
    finally:
        net.close()
    assert _ours(slot) == []


@pytest.mark.slow
def test_without_namespaces_the_cluster_runs_on_loopback_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ip netns add`` failing (here: made to fail) falls back to loopback: the reason
    is recorded and printed, no namespace stays behind, the nemesis has no network
    faults, and the cluster serves."""
    slots: list[int] = []
    real_open = netns.Network.open

    def spy(self: netns.Network) -> netns.Network:
        out = real_open(self)
        slots.append(self.slot)
        return out

    def refuse(self: netns.Network, name: str) -> netns.NetHost:
        raise netns.NetnsError(f"`ip netns add blc-x-{name}` failed (1): Operation not permitted")

    cluster = ChaosCluster(tmp_path, namespaces=True, seed=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(netns.Network, "open", spy)
        mp.setattr(netns.Network, "add_host", refuse)
        try:
            cluster.start()
            assert cluster.skip_reason is not None
            assert "Operation not permitted" in cluster.skip_reason
            assert cluster.skip_reason in capsys.readouterr().err
            assert not cluster.namespaces and slots and _ours(slots[0]) == []
            assert cluster.read_cluster_file()["chaos"]["skip_reason"] == cluster.skip_reason
            assert all(n.address.startswith("127.0.0.1:") for n in cluster.nodes)
            assert not set(NETWORK_KINDS) & set(Nemesis(cluster, random.Random(1)).kinds())
            _wait_reachable(cluster.bookies[0].address)
        finally:
            cluster.stop()


def test_namespaces_not_wanted_means_loopback_placements() -> None:
    cluster = ChaosCluster(Path("/nonexistent-never-started"), namespaces=False)
    assert cluster.skip_reason == "namespaces not requested"
    assert not cluster.namespaces and cluster.local.placements == {}
    assert not set(NETWORK_KINDS) & set(Nemesis(cluster, random.Random(1)).kinds())


def test_a_run_that_exits_without_stop_leaves_no_namespaces(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from ops.chaos.hosts import ChaosCluster
        cluster = ChaosCluster(Path({str(tmp_path)!r}), namespaces=True)
        cluster._make_hosts()  # the hosts, no processes: then exit without stop()
        print(cluster.network.slot, flush=True)
        raise SystemExit(5)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 5, done.stderr
    assert _ours(int(done.stdout.split()[0])) == []
