"""The nemesis: seeded faults against a :class:`~ops.chaos.hosts.ChaosCluster`.

Each :meth:`Nemesis.step` picks one fault with the run's ``random.Random`` (what, on
whom, for how long), starts it, holds it, heals it and returns a :class:`Fault`. The
choice depends only on the ``rng`` and the cluster's fixed topology (never on timing or
state), so a seed replays the same sequence of kinds, targets and holds. Steps run one
at a time (a lock), so faults never overlap and each is healed within its step.

Kinds (the ``bookline chaos`` summary counts them):

* ``kill`` -- ``kill -9`` of a bookie, proxy, ZooKeeper server or a registered writer
  process, restarted after the hold;
* ``pause`` -- SIGSTOP, held longer than the services' ZooKeeper session, SIGCONT;
* network (namespaced hosts only): ``link-down`` (a host's veth down: cut off from
  everyone), ``partition-zk-minority`` (one ZooKeeper server cut off from every other
  host), ``partition-halves`` (a minority side with one ZooKeeper server and some
  hosts, a majority side with two and the rest), ``one-way`` (a host drops what
  another sends it), ``bookie-cut-from-proxies`` (a bookie cannot reach the write
  proxies, nor they it, but reaches ZooKeeper);
* storage (bookies restarted with the fault shim, bookie/storage/faults.py):
  ``power-cut`` (shim in power-cut mode, then ``kill -9``: unsynced writes are lost),
  ``fsync-eio`` (every fsync fails with EIO), ``disk-full`` (a simulated disk that is
  already full), ``bit-flip`` (one bit of the newest entry log flipped while the
  bookie is down after a clean stop, which checkpoints; checksums must catch it on
  read).

Healing restarts what is down without the shim, sets links up, SIGCONTs and deletes
the fault's nftables table; :meth:`Nemesis.heal_all` does all of it for every host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from bookie.storage.entrylog_format import FILE_HEADER_BYTES
from bookie.storage.faults import CONTROL_FILE, flip_bit
from ops import procs
from ops.chaos.hosts import SESSION_TIMEOUT_MS, ChaosCluster, Node
from ops.chaos.netns import NetHost

log = logging.getLogger(__name__)

PROCESS_KINDS: Final = ("kill", "pause")
NETWORK_KINDS: Final = (
    "link-down",
    "partition-zk-minority",
    "partition-halves",
    "one-way",
    "bookie-cut-from-proxies",
)
STORAGE_KINDS: Final = ("power-cut", "fsync-eio", "disk-full", "bit-flip")
# How long each kind of fault is held, seconds (low, high): long enough to matter
# (sessions expire, writers time out and fail over), short enough for many per run.
HOLD_S: Final = {
    "kill": (0.5, 3.0),
    # A pause outlasts the session timeout, so the paused service's session expires.
    "pause": (SESSION_TIMEOUT_MS / 1000 + 1.0, SESSION_TIMEOUT_MS / 1000 + 3.0),
    # Past the client and bookie timeouts that matter (a read's speculative timeout, an
    # add's retry), below a session's expiry or longer.
    "network": (1.5, 6.0),
    # A storage fault also costs the bookie's restart (seconds) on each side of its hold.
    "storage": (2.0, 5.0),
}


class Target(Protocol):
    """A process the nemesis can crash and pause (a cluster node, or a writer)."""

    id: str
    kind: str

    def kill9(self) -> None: ...

    def restart(self, extra_args: list[str] | None = None) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def is_running(self) -> bool: ...


class ProcessTarget:
    """Adapts a caller's process (``bookline chaos``'s writers) to :class:`Target`:
    ``current()`` gives its live Popen (None when down), ``start()`` starts it again."""

    def __init__(
        self,
        name: str,
        current: Callable[[], subprocess.Popen[bytes] | None],
        start: Callable[[], None],
        kind: str = "writer",
    ) -> None:
        self.id, self.kind = name, kind
        self._current, self._start = current, start
        self._paused = False

    def is_running(self) -> bool:
        proc = self._current()
        return proc is not None and proc.poll() is None

    def kill9(self) -> None:
        self.resume()
        proc = self._current()
        if proc is not None:
            procs.kill9(proc)

    def restart(self, extra_args: list[str] | None = None) -> None:
        if extra_args:
            raise ValueError(f"{self.id}: a writer restarts without extra arguments")
        self.kill9()
        self._start()

    def pause(self) -> None:
        proc = self._current()
        if proc is None:
            raise ProcessLookupError(f"{self.id} is not running")
        os.killpg(proc.pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        proc = self._current()
        if self._paused and proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
        self._paused = False


@dataclass(frozen=True, slots=True)
class Plan:
    """A fault chosen but not started: what only the seed decides."""

    kind: str
    target: str  # e.g. "bookie-2"; "a|b,c" for a partition of sides a and b,c
    hold_s: float
    detail: str = ""  # kind-specific choice (e.g. which bit), also seeded


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault that was injected and healed; times are wall-clock seconds (time.time)."""

    kind: str
    target: str
    hold_s: float
    started_at: float
    healed_at: float
    detail: str = ""
    notes: list[str] = field(default_factory=list)  # what happened (e.g. nothing to flip)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind, "target": self.target, "hold_s": round(self.hold_s, 3),
            "started_at": self.started_at, "healed_at": self.healed_at,
            "detail": self.detail, "notes": list(self.notes),
        }  # fmt: skip


class Nemesis:
    """Seeded faults against ``cluster`` (see the module docstring)."""

    def __init__(self, cluster: ChaosCluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.writers: list[Target] = []
        self._counts: Counter[str] = Counter()
        self._lock = asyncio.Lock()
        self._tag = 0

    def add_target(self, target: Target) -> None:
        """A process of the caller (a writer) that ``kill`` and ``pause`` may hit.
        Register every one before the first step: the choice depends on the list."""
        self.writers.append(target)

    def kinds(self) -> tuple[str, ...]:
        network = NETWORK_KINDS if self.cluster.namespaces else ()
        return (*PROCESS_KINDS, *network, *STORAGE_KINDS)

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    # -- choosing (pure: rng + topology) -----------------------------------------------
    def plan(self) -> Plan:
        kind = self.rng.choice(self.kinds())
        group = "network" if kind in NETWORK_KINDS else "storage" if kind in STORAGE_KINDS else kind
        low, high = HOLD_S[group]
        target, detail = self._choose_target(kind)
        return Plan(kind, target, round(self.rng.uniform(low, high), 3), detail)

    def _choose_target(self, kind: str) -> tuple[str, str]:
        c, rng = self.cluster, self.rng
        names = [n.id for n in c.nodes]
        if kind in PROCESS_KINDS:
            return rng.choice([*names, *(w.id for w in self.writers)]), ""
        if kind == "link-down":
            return rng.choice(names), ""
        if kind == "partition-zk-minority":
            return rng.choice([z.id for z in c.zookeepers]), ""
        if kind == "partition-halves":
            zks = [z.id for z in c.zookeepers]
            lone = rng.choice(zks)
            others = [n.id for n in c.nodes if n.kind != "zookeeper"]
            side = sorted(rng.sample(others, len(others) // 2))
            minority = [lone, *side]
            majority = [n for n in names if n not in minority]
            return f"{','.join(minority)}|{','.join(majority)}", ""
        if kind == "one-way":
            receiver, sender = rng.sample(names, 2)
            return f"{receiver}<-{sender}", "receiver drops what the sender sends"
        bookie = rng.choice([b.id for b in c.bookies])
        if kind == "bit-flip":
            return bookie, f"position={rng.random():.6f} bit={rng.randrange(8)}"
        return bookie, ""

    # -- running ---------------------------------------------------------------------
    async def step(self) -> Fault:
        """Choose, start, hold and heal one fault."""
        async with self._lock:
            return await self._run(self.plan())

    async def run(self, plan: Plan) -> Fault:
        """Start, hold and heal the fault ``plan`` names (tests choose their own)."""
        async with self._lock:
            return await self._run(plan)

    async def _run(self, plan: Plan) -> Fault:
        notes: list[str] = []
        log.info("nemesis: %s %s for %.1fs %s", plan.kind, plan.target, plan.hold_s, plan.detail)
        started = time.time()
        heal = await asyncio.to_thread(self.begin, plan, notes)
        try:
            await asyncio.sleep(plan.hold_s)
        finally:
            await asyncio.to_thread(heal)
        self._counts[plan.kind] += 1
        return Fault(plan.kind, plan.target, plan.hold_s, started, time.time(), plan.detail, notes)

    async def heal_all(self) -> None:
        """Heal everything: network, paused processes, shims, processes that are down."""
        async with self._lock:
            await asyncio.to_thread(self._heal_everything)

    def _heal_everything(self) -> None:
        c = self.cluster
        if c.network is not None:
            c.heal_network()
        for target in [*c.nodes, *self.writers]:
            target.resume()
        for node in c.nodes:
            shim = node.kind == "bookie" and _has_shim(c, node)
            if shim or not node.is_running():
                _clear_control(node)
                node.restart()
        for writer in self.writers:
            if not writer.is_running():
                writer.restart()

    def _target(self, name: str) -> Target:
        for writer in self.writers:
            if writer.id == name:
                return writer
        return self.cluster.node(name)

    def begin(self, plan: Plan, notes: list[str] | None = None) -> Callable[[], None]:
        """Start ``plan``'s fault now (blocking: restarts wait until the process
        serves); the function that heals it. What happened is added to ``notes``.
        :meth:`step` holds the fault in between; tests look at it instead."""
        self._tag += 1
        tag, notes = f"f{self._tag}", notes if notes is not None else []
        kind = plan.kind
        if kind == "kill":
            target = self._target(plan.target)
            target.kill9()
            return target.restart
        if kind == "pause":
            target = self._target(plan.target)
            target.pause()
            return target.resume
        if kind in NETWORK_KINDS:
            return self._start_network(plan, tag)
        return self._start_storage(plan, notes)

    # -- network -----------------------------------------------------------------------
    def _net(self, name: str) -> NetHost:
        net = self.cluster.node(name).net
        if net is None:
            raise RuntimeError(f"{name} is not on a host of its own (no namespaces)")
        return net

    def _start_network(self, plan: Plan, tag: str) -> Callable[[], None]:
        network = self.cluster.network
        if network is None:
            raise RuntimeError(f"{plan.kind} needs namespaced hosts")
        if plan.kind == "link-down":
            host = self._net(plan.target)
            network.set_link(host, up=False)
            return lambda: network.set_link(host, up=True)
        cuts = self._cuts(plan)  # (host, peers, both ways)
        touched = []
        try:
            for host, peers, both in cuts:
                touched.append(host)
                network.block(host, tag, peers, both=both)
        except BaseException:
            for host in touched:
                network.unblock(host, tag)
            raise

        def heal() -> None:
            for host in touched:
                network.unblock(host, tag)

        return heal

    def _cuts(self, plan: Plan) -> list[tuple[NetHost, list[NetHost], bool]]:
        c = self.cluster
        if plan.kind == "one-way":
            receiver, sender = plan.target.split("<-")
            return [(self._net(receiver), [self._net(sender)], False)]
        if plan.kind == "partition-zk-minority":
            others = [self._net(n.id) for n in c.nodes if n.id != plan.target]
            return [(self._net(plan.target), others, True)]
        if plan.kind == "partition-halves":
            left, right = (side.split(",") for side in plan.target.split("|"))
            return [(self._net(a), [self._net(b) for b in right], True) for a in left]
        # bookie-cut-from-proxies: ZooKeeper stays reachable.
        proxies = [self._net(p.id) for p in c.write_proxies]
        return [(self._net(plan.target), proxies, True)]

    # -- storage -------------------------------------------------------------------------
    def _start_storage(self, plan: Plan, notes: list[str]) -> Callable[[], None]:
        node = self.cluster.node(plan.target)

        def heal() -> None:
            _clear_control(node)
            node.restart()

        if plan.kind == "power-cut":
            node.restart(["--fault-shim", "power-cut"])

            def cut_then_heal() -> None:
                node.kill9()  # what was not fsynced is lost with the process
                heal()

            return cut_then_heal
        if plan.kind in ("fsync-eio", "disk-full"):
            node.restart(["--fault-shim", "on"])
            setting = 'fsync_error = "EIO"' if plan.kind == "fsync-eio" else "disk_bytes_max = 1"
            _control_path(node).write_text(setting + "\n")
            return heal
        node.stop()  # a clean stop checkpoints: the newest entries reach an entry log
        notes.append(_flip(node, plan.detail))
        node.restart()
        return lambda: None


def _control_path(node: Node) -> Path:
    return node.data_dirs["journal"] / CONTROL_FILE


def _clear_control(node: Node) -> None:
    if node.kind == "bookie":
        _control_path(node).unlink(missing_ok=True)


def _has_shim(cluster: ChaosCluster, node: Node) -> bool:
    return "--fault-shim" in cluster.local.extra_args.get(node.id, [])


def _flip(node: Node, detail: str) -> str:
    """Flip the bit ``detail`` names in the newest entry log of a stopped bookie."""
    fields = dict(part.split("=", 1) for part in detail.split())
    logs = sorted(node.data_dirs["ledgers"].glob("*.log"))
    logs = [p for p in logs if p.stat().st_size > FILE_HEADER_BYTES]
    if not logs:
        return "no entry log with records yet: nothing flipped"
    path = logs[-1]
    records = path.stat().st_size - FILE_HEADER_BYTES
    offset = FILE_HEADER_BYTES + int(float(fields["position"]) * records)
    flip_bit(path, offset, int(fields["bit"]))
    return f"flipped bit {fields['bit']} at {path.name}:{offset}"
