"""A Bookline cluster of separate hosts on one machine, for ``bookline chaos``.

:class:`ChaosCluster` runs a ZooKeeper ensemble of 3, 4 bookies (the write proxies'
ledgers have E=Qw=3, Qa=2) and 2 write proxies + 1 read proxy, each in a network
namespace of its own (:mod:`ops.chaos.netns`: its own address on a bridge of the root
namespace, which has an address too). Every service binds its host's address, so a
host's link going down or an nftables rule in its namespace cuts it off exactly as a
pulled cable or a firewall would. Clients run in the root namespace: ``cluster.json``
(the format :mod:`ops.cluster.local` writes) names every host's address, so the thin
client, the core library and the CLI work against it unchanged.

The processes are :class:`ops.cluster.local.LocalCluster`'s (one
:class:`ops.cluster.local.Placement` per child: its address and ``ip netns exec NS``),
started and stopped by pid. When namespaces cannot be made (not root, no ``ip``, a
kernel without them) or are not wanted, the same cluster runs on loopback and
:attr:`ChaosCluster.skip_reason` says why (network faults are then not available to the
nemesis).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from ops.chaos.netns import NetHost, NetnsError, Network
from ops.cluster import procs
from ops.cluster.local import CLUSTER_ROOT, LocalCluster, Placement, ProcessInfo, Quorums

log = logging.getLogger(__name__)

ZK_ENSEMBLE: Final = 3
BOOKIES: Final = 4
WRITE_PROXIES: Final = 2
READ_PROXIES: Final = 1
QUORUMS: Final = Quorums(ensemble_size=3, write_quorum=3, ack_quorum=2)
# Bookies' ZooKeeper session: a paused or cut-off bookie leaves the registry this soon
# (the nemesis pauses processes for longer than this).
SESSION_TIMEOUT_MS: Final = 4_000
# A restarted child serves within this (a bookie first waits out its old session).
RESTART_TIMEOUT_S: Final = 90.0
# Every chaos bookie runs under the storage fault shim's power-cut overlay (only fsynced
# writes reach its files), so any kill -9 of a bookie is a power cut, and fsync errors
# and a full disk can be switched on in a bookie that is serving (FAULTS.toml).
BOOKIE_ARGS: Final = ("--fault-shim", "power-cut")
# Short host names per child kind (interface names have at most 15 characters).
SHORT_NAMES: Final = {"zookeeper": "zk", "bookie": "b", "writeproxy": "wp", "readproxy": "rp"}


def _child_names() -> list[tuple[str, str]]:
    """(child name as in cluster.json, kind) of every host, in start order."""
    return [
        *((f"zookeeper-{i}", "zookeeper") for i in range(1, ZK_ENSEMBLE + 1)),
        *((f"bookie-{i}", "bookie") for i in range(1, BOOKIES + 1)),
        *((f"writeproxy-{i}", "writeproxy") for i in range(1, WRITE_PROXIES + 1)),
        *((f"readproxy-{i}", "readproxy") for i in range(1, READ_PROXIES + 1)),
    ]


def short_name(name: str) -> str:
    kind, index = name.rsplit("-", 1)
    return SHORT_NAMES[kind] + index


def namespace_problem() -> str | None:
    """Why namespaces cannot be used here (None: try them)."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install iproute2 nftables)"
    return None


class Node:
    """One host's process: what it is, where, and how to crash, pause or restart it."""

    def __init__(self, cluster: ChaosCluster, name: str, kind: str, net: NetHost | None):
        self.id = name
        self.kind = kind
        self.net = net
        self._cluster = cluster

    def __repr__(self) -> str:
        return f"Node({self.id}, {self.address}, pid {self.pid})"

    @property
    def info(self) -> ProcessInfo:
        for info in self._cluster.local.children():
            if info.name == self.id:
                return info
        raise LookupError(f"{self.id} is not a child of the cluster")

    @property
    def address(self) -> str:
        return self.info.address

    @property
    def pid(self) -> int:
        return self.info.proc.pid

    @property
    def data_dirs(self) -> dict[str, Path]:
        base = self._cluster.dir / self.id
        if self.kind == "bookie":
            return {d: base / d for d in ("journal", "ledgers", "index")}
        return {"data": base}

    def is_running(self) -> bool:
        return self.info.proc.poll() is None

    def kill9(self) -> None:
        """``kill -9`` (the process group, by pid); the node stays down."""
        self.resume()  # a SIGSTOPped process is killed too, but forget it was paused
        procs.kill9(self.info.proc)
        self._cluster.local.note_exit(self.info)

    def stop(self) -> None:
        """Stop the process cleanly (SIGTERM: a bookie checkpoints first); it stays down."""
        self.resume()
        procs.stop(self.info.proc)
        self._cluster.local.note_exit(self.info)

    def pause(self) -> None:
        """SIGSTOP the process group (SIGCONT with :meth:`resume`)."""
        os.killpg(self.pid, signal.SIGSTOP)
        self._cluster.paused.add(self.id)

    def resume(self) -> None:
        if self.id in self._cluster.paused:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGCONT)
            self._cluster.paused.discard(self.id)

    def restart(self, extra_args: list[str] | None = None) -> None:
        """Stop the process if it runs, start it again (with ``extra_args`` on its
        command line, none by default) and wait until it serves."""
        local = self._cluster.local
        if self.kind == "bookie" and extra_args is None:
            extra_args = list(self._cluster.bookie_args)
        if self.kind != "zookeeper":
            local.extra_args[self.id] = list(extra_args or [])
        if self.is_running():
            self.resume()
            procs.stop(self.info.proc)
        with self._cluster.lock:  # the nemesis restarts several nodes at once
            fresh = local.respawn(self.info)
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while not local.is_ready(fresh):
            if fresh.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.id} exited with {fresh.proc.returncode} at restart; "
                    f"see {fresh.extra.get('log')}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.id} not serving {RESTART_TIMEOUT_S:.0f}s after restart")
            time.sleep(0.1)
        fresh.state = "running"
        self._cluster.write_cluster_file()


class ChaosCluster:
    """ZooKeeper x3, bookies x4, write proxies x2, read proxy x1, each on a host of its
    own (see the module docstring). ``start()``/``stop()``; ``stop()`` also after a
    failed start, and it removes every namespace and link the cluster made."""

    def __init__(
        self, directory: Path, *, namespaces: bool, seed: int | None = None, auth: bool = False,
        bookie_args: Sequence[str] = BOOKIE_ARGS,
    ) -> None:  # fmt: skip
        self.dir = Path(directory).resolve()
        # Every bookie's extra command line (a restart without arguments uses it too);
        # the broken-build test adds --no-journal-sync.
        self.bookie_args = tuple(bookie_args)
        # Held while a node is respawned or cluster.json written (threads of the nemesis).
        self.lock = threading.Lock()
        # Proxies require tokens (as `bookline local` does by default); cluster.json
        # names the admin token's file, so the run's clients send it.
        self.auth = auth
        self.want_namespaces = namespaces
        # The run's seed, written into cluster.json so a cluster is matched to its run.
        self.seed = seed
        self.skip_reason: str | None = None if namespaces else "namespaces not requested"
        self.network: Network | None = None
        self.paused: set[str] = set()
        self.local = self._local({})
        self.nodes: list[Node] = [Node(self, n, k, None) for n, k in _child_names()]

    def _local(self, placements: dict[str, Placement]) -> LocalCluster:
        local = LocalCluster(
            self.dir, bookies=BOOKIES, write_proxies=WRITE_PROXIES, read_proxies=READ_PROXIES,
            zk_ensemble=ZK_ENSEMBLE, quorums=QUORUMS,
            service_session_timeout_ms=SESSION_TIMEOUT_MS, placements=placements,
            auth=self.auth, kafka=True,  # every proxy a Kafka broker too (docs/kafka.md)
        )  # fmt: skip
        for name, kind in _child_names():
            if kind == "bookie":
                local.extra_args[name] = list(self.bookie_args)
        return local

    # -- what callers use ------------------------------------------------------------
    @property
    def namespaces(self) -> bool:
        """True when the hosts are network namespaces (network faults possible)."""
        return self.network is not None

    @property
    def cluster_file(self) -> Path:
        return self.dir / "cluster.json"

    @property
    def zk_connect(self) -> str:
        return self.local.zk_connect

    @property
    def root(self) -> str:
        return CLUSTER_ROOT

    @property
    def zookeepers(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "zookeeper"]

    @property
    def bookies(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "bookie"]

    @property
    def write_proxies(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "writeproxy"]

    @property
    def proxies(self) -> list[Node]:
        return [n for n in self.nodes if n.kind in ("writeproxy", "readproxy")]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.id == name:
                return node
        raise LookupError(f"no host {name!r} in the chaos cluster")

    # -- start / stop --------------------------------------------------------------------
    def start(self) -> None:
        """Make the hosts (or fall back to loopback), start every process, write
        cluster.json. On failure everything started is stopped again."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            placements = self._make_hosts() if self.want_namespaces else {}
            self.local = self._local(placements)
            self.local.start()
            self.write_cluster_file()
        except BaseException:
            self.stop()
            raise

    def _make_hosts(self) -> dict[str, Placement]:
        self.skip_reason = namespace_problem()
        if self.skip_reason is None:
            network = self.network = Network()
            atexit.register(self._close_network)  # a run that dies leaves no namespaces
            try:
                network.open()
                for node in self.nodes:
                    node.net = network.add_host(short_name(node.id))
            except NetnsError as exc:
                self.skip_reason = f"network namespaces unavailable: {exc}"
                self._close_network()
        if self.skip_reason is not None:
            print(f"chaos cluster on loopback: {self.skip_reason}", file=sys.stderr)
            log.warning("chaos cluster on loopback: %s", self.skip_reason)
            return {}
        return {n.id: Placement(n.net.address, n.net.prefix) for n in self.nodes if n.net}

    def stop(self) -> None:
        """Heal the network, SIGCONT what is paused, stop every process by pid, remove
        the namespaces and links. Safe to call twice or after a failed start."""
        try:
            if self.network is not None:
                try:
                    self.heal_network()
                except NetnsError as exc:  # _close_network() below removes it all anyway
                    log.warning("could not heal the network before stopping: %s", exc)
            for node in self.nodes:
                with contextlib.suppress(LookupError):
                    node.resume()
            self.local.stop()
        finally:
            self._close_network()

    def _close_network(self) -> None:
        atexit.unregister(self._close_network)
        network, self.network = self.network, None
        for node in self.nodes:
            node.net = None
        if network is not None:
            removed = network.close()
            log.info("removed %d namespaces and links", len(removed))

    def heal_network(self) -> None:
        """Every host's link up and every fault's nftables table gone."""
        assert self.network is not None
        for node in self.nodes:
            if node.net is not None:
                self.network.set_link(node.net, up=True)
                self.network.unblock(node.net)

    # -- cluster.json ----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        doc = self.local.describe()
        doc["chaos"] = {
            "namespaces": self.namespaces,
            "skip_reason": self.skip_reason,
            "seed": self.seed,
            "slot": self.network.slot if self.network is not None else None,
            "hosts": {
                n.id: {"namespace": n.net.ns, "veth": n.net.veth, "address": n.net.address}
                for n in self.nodes
                if n.net is not None
            },
        }
        return doc

    def write_cluster_file(self) -> Path:
        with self.lock:
            path = self.local.write_cluster_json(self.describe())
        log.debug("wrote %s", path)
        return path

    def read_cluster_file(self) -> dict[str, Any]:
        doc = json.loads(self.cluster_file.read_text())
        assert isinstance(doc, dict)
        return doc
