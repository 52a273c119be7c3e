"""The nemesis: seeded faults against a :class:`~ops.chaos.hosts.ChaosCluster`.

Each :meth:`Nemesis.step` takes the next :class:`~ops.chaos.plans.Step` from the run's
``random.Random`` (:mod:`ops.chaos.plans`: what, on whom, for how long, and for an
overlap scenario when each fault starts), runs its faults concurrently -- each started
after its delay, held and healed on its own clock -- and returns them as
:class:`Fault`. Steps run one after another; the faults inside an overlap step overlap.

A fault counts only once it took effect (:mod:`ops.chaos.effects`): a killed pid is
gone, a paused one is stopped, a power-cut bookie ran under the overlay, the shim says
it failed an fsync or a write, the full bookie turned read-only, a cut host's
connection does not get through. One that did not (within its hold, or
``VERIFY_TIMEOUT_S``) is healed and reported as ineffective, not counted.

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
* storage (every chaos bookie runs under the fault shim's power-cut overlay,
  bookie/storage/faults.py): ``power-cut`` (``kill -9``: what was not fsynced is lost),
  ``fsync-eio`` (the serving bookie's fsyncs fail with EIO: it stops, fail-stop, at
  the next one), ``disk-full`` (its disks fill up: it turns read-only), ``bit-flip``
  (one bit of the newest entry log flipped while the bookie is down after a clean
  stop, which checkpoints; checksums must catch it on read).

Healing restarts what is down (bookies under the overlay again), sets links up,
SIGCONTs, removes the shim's control file and deletes the fault's nftables table;
:meth:`Nemesis.heal_all` does all of it for every host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bookie.storage.entrylog_format import FILE_HEADER_BYTES
from bookie.storage.faults import CONTROL_FILE, HITS_FILE, flip_bit
from ops.chaos import effects
from ops.chaos.hosts import ChaosCluster, Node
from ops.chaos.netns import NetHost
from ops.chaos.plans import (
    HOLD_S,
    NETWORK_KINDS,
    PROCESS_KINDS,
    STORAGE_KINDS,
    Plan,
    Planner,
    Step,
    Topology,
)
from ops.chaos.targets import ProcessTarget, Target
from ops.cluster import procs

log = logging.getLogger(__name__)

__all__ = [
    "HOLD_S",
    "NETWORK_KINDS",
    "PROCESS_KINDS",
    "STORAGE_KINDS",
    "Fault",
    "Nemesis",
    "Plan",
    "ProcessTarget",
    "Step",
]

# A fault not seen to take effect within its hold is looked at this long at least (a
# bookie's disk check runs every 5 s; a loaded machine is slow to show anything).
VERIFY_TIMEOUT_S: Final = 12.0
# An fsync error shows at the bookie's next fsync: its next journal write, or for a
# bookie in no current ensemble its next checkpoint (every 10 s) if it has anything.
VERIFY_FSYNC_TIMEOUT_S: Final = 25.0
VERIFY_POLL_S: Final = 0.2
# A bookie whose fsync failed has stopped within this (it exits with status 3).
FAIL_STOP_TIMEOUT_S: Final = 30.0
# What a bookie logs when its disk check turns it read-only (bookie/server.py).
READ_ONLY_MARKER: Final = b"turning read-only"
# Kinds that take a bookie out of service while they hold (for bookies_down_max).
DOWN_KINDS: Final = ("kill", "power-cut", "pause", "fsync-eio")

Probe = Callable[[], str | None]


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
    effective: bool = True  # seen to take effect (else not counted)
    evidence: str = ""  # what showed it (a pid gone, a probe that did not get through)
    scenario: str = "single"  # the step's: "single" or an overlap scenario
    step: int = 0
    overlapped: bool = False  # in effect while another fault was

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind, "target": self.target, "hold_s": round(self.hold_s, 3),
            "started_at": self.started_at, "healed_at": self.healed_at,
            "detail": self.detail, "notes": list(self.notes), "effective": self.effective,
            "evidence": self.evidence, "scenario": self.scenario, "step": self.step,
            "overlapped": self.overlapped,
        }  # fmt: skip


@dataclass(slots=True)
class Injected:
    """A fault started: how to see it took effect, how to heal it, what it takes down."""

    probe: Probe
    heal: Callable[[], None]
    down: str | None = None  # the bookie it takes out of service, if any


class Nemesis:
    """Seeded faults against ``cluster`` (see the module docstring)."""

    def __init__(self, cluster: ChaosCluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.planner = Planner(rng)
        self.writers: list[Target] = []
        self.on_fault: Callable[[Fault], None] | None = None  # each fault once healed
        self._counts: Counter[str] = Counter()
        self._ineffective: Counter[str] = Counter()
        self._lock = asyncio.Lock()
        self._tag = 0
        self._steps = 0
        self._active: dict[int, bool] = {}  # fault number -> overlapped so far
        self._overlapping = 0
        self._down: Counter[str] = Counter()
        self._down_max = 0

    def add_target(self, target: Target) -> None:
        """A process of the caller (a writer) that ``kill`` and ``pause`` may hit.
        Register every one before the first step: the choice depends on the list."""
        self.writers.append(target)

    def topology(self) -> Topology:
        c = self.cluster
        return Topology(
            zookeepers=tuple(n.id for n in c.zookeepers),
            bookies=tuple(n.id for n in c.bookies),
            services=tuple(n.id for n in c.proxies),
            writers=tuple(w.id for w in self.writers),
            namespaces=c.namespaces,
        )

    def kinds(self) -> tuple[str, ...]:
        return self.planner.kinds(self.topology())

    def counts(self) -> dict[str, int]:
        """Faults that took effect, by kind."""
        return dict(self._counts)

    def ineffective(self) -> dict[str, int]:
        """Faults injected that were not seen to take effect (not counted), by kind."""
        return dict(self._ineffective)

    def overlap_stats(self) -> dict[str, int]:
        """Counted faults in effect while another was; most bookies out at once."""
        return {"faults_overlapping": self._overlapping, "bookies_down_max": self._down_max}

    # -- choosing (pure: rng + topology) -----------------------------------------------
    def plan(self) -> Plan:
        """One single fault (tests); :meth:`plan_step` is what a run draws."""
        return self.planner.plan(self.topology())

    def plan_step(self) -> Step:
        return self.planner.step(self.topology())

    # -- running ---------------------------------------------------------------------
    async def step(self) -> list[Fault]:
        """Choose the next step and run it: its faults started, held, healed."""
        async with self._lock:
            return await self._run_step(self.plan_step())

    async def run_step(self, step: Step) -> list[Fault]:
        """Run ``step`` (tests and the broken-build check choose their own)."""
        async with self._lock:
            return await self._run_step(step)

    async def run(self, plan: Plan) -> Fault:
        """Start, hold and heal the single fault ``plan`` names (tests)."""
        return (await self.run_step(Step("single", (plan,))))[0]

    async def _run_step(self, step: Step) -> list[Fault]:
        self._steps += 1
        results = await asyncio.gather(
            *(self._run_one(plan, step.scenario, self._steps) for plan in step.plans),
            return_exceptions=True,
        )
        faults = [r for r in results if isinstance(r, Fault)]
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return faults

    async def _run_one(self, plan: Plan, scenario: str, step: int) -> Fault:
        await asyncio.sleep(plan.delay_s)
        self._tag += 1
        number, notes = self._tag, list[str]()
        log.info("nemesis: %s %s for %.1fs %s", plan.kind, plan.target, plan.hold_s, plan.detail)
        started = time.time()
        injected = await asyncio.to_thread(self._begin, plan, f"f{number}", notes)
        evidence: str | None = None
        try:
            wait_s = VERIFY_FSYNC_TIMEOUT_S if plan.kind == "fsync-eio" else VERIFY_TIMEOUT_S
            evidence = await self._verify(injected.probe, started, max(plan.hold_s, wait_s))
            if evidence is not None:
                self._enter(number, injected.down)
            await asyncio.sleep(max(0.0, started + plan.hold_s - time.time()))
        finally:
            await asyncio.to_thread(injected.heal)
            overlapped = self._leave(number, injected.down) if evidence is not None else False
        if evidence is None:
            self._ineffective[plan.kind] += 1
            log.warning("nemesis: %s %s did not take effect", plan.kind, plan.target)
        else:
            self._counts[plan.kind] += 1
        fault = Fault(
            plan.kind, plan.target, plan.hold_s, started, time.time(), plan.detail, notes,
            evidence is not None, evidence or "not seen to take effect", scenario, step,
            overlapped,
        )  # fmt: skip
        if self.on_fault is not None:
            self.on_fault(fault)
        return fault

    async def _verify(self, probe: Probe, started: float, wait_s: float) -> str | None:
        """Poll ``probe`` until it shows the effect, at most ``wait_s`` from ``started``."""
        deadline = started + wait_s
        while True:
            evidence = await asyncio.to_thread(probe)
            if evidence is not None or time.time() >= deadline:
                return evidence
            await asyncio.sleep(VERIFY_POLL_S)

    def _enter(self, number: int, down: str | None) -> None:
        if self._active:
            for other in self._active:
                self._active[other] = True
            self._active[number] = True
        else:
            self._active[number] = False
        if down is not None:
            self._down[down] += 1
            self._down_max = max(self._down_max, len(+self._down))

    def _leave(self, number: int, down: str | None) -> bool:
        overlapped = self._active.pop(number, False)
        self._overlapping += overlapped
        if down is not None:
            self._down[down] -= 1
        return overlapped

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
            odd_args = node.kind == "bookie" and not _has_cluster_args(c, node)
            _clear_control(node)
            if odd_args or not node.is_running():
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
        """Start ``plan``'s fault now (blocking); the function that heals it. Tests look
        at the fault in between; :meth:`step` also verifies and holds it."""
        self._tag += 1
        return self._begin(plan, f"f{self._tag}", notes if notes is not None else []).heal

    def _begin(self, plan: Plan, tag: str, notes: list[str]) -> Injected:
        kind = plan.kind
        if kind in PROCESS_KINDS:
            return self._start_process(plan)
        if kind in NETWORK_KINDS:
            return self._start_network(plan, tag)
        return self._start_storage(plan, notes)

    # -- processes -----------------------------------------------------------------------
    def _start_process(self, plan: Plan) -> Injected:
        target = self._target(plan.target)
        pid = _pid(target)
        down = plan.target if getattr(target, "kind", "") == "bookie" else None
        if plan.kind == "kill":
            target.kill9()
            return Injected(lambda: effects.pid_gone(pid), target.restart, down)
        target.pause()
        return Injected(lambda: effects.stopped(pid), target.resume, down)

    # -- network -----------------------------------------------------------------------
    def _net(self, name: str) -> NetHost:
        net = self.cluster.node(name).net
        if net is None:
            raise RuntimeError(f"{name} is not on a host of its own (no namespaces)")
        return net

    def _start_network(self, plan: Plan, tag: str) -> Injected:
        network = self.cluster.network
        if network is None:
            raise RuntimeError(f"{plan.kind} needs namespaced hosts")
        probe = self._network_probe(plan)
        if plan.kind == "link-down":
            host = self._net(plan.target)
            network.set_link(host, up=False)
            return Injected(probe, lambda: network.set_link(host, up=True))
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

        return Injected(probe, heal)

    def _network_probe(self, plan: Plan) -> Probe:
        """A connection that the fault must stop: (from whom, to whose service)."""
        c = self.cluster
        source: Node | None
        if plan.kind == "link-down":
            source, dest = None, c.node(plan.target)  # from the root namespace
        elif plan.kind == "one-way":
            receiver, sender = plan.target.split("<-")
            source, dest = c.node(sender), c.node(receiver)
        elif plan.kind == "partition-zk-minority":
            source = next(z for z in c.zookeepers if z.id != plan.target)
            dest = c.node(plan.target)
        elif plan.kind == "partition-halves":
            left, right = (side.split(",") for side in plan.target.split("|"))
            source, dest = c.node(right[0]), c.node(left[0])
        else:  # bookie-cut-from-proxies
            source, dest = c.write_proxies[0], c.node(plan.target)
        namespace = None if source is None or source.net is None else source.net.ns
        what = f"{source.id if source else 'root'} -> {dest.id}"

        def probe() -> str | None:
            if effects.blocked(dest.address, namespace):
                return f"{what} ({dest.address}) does not get through"
            return None

        return probe

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
    def _start_storage(self, plan: Plan, notes: list[str]) -> Injected:
        node = self.cluster.node(plan.target)
        pid = node.pid

        def heal() -> None:
            _clear_control(node)
            if not node.is_running():
                node.restart()

        if plan.kind == "power-cut":
            argv = effects.cmdline(pid)
            node.kill9()  # what was not fsynced is lost with the process

            def power_cut() -> str | None:
                if not effects.under_power_cut(argv):
                    return None  # a plain kill: the page cache kept everything
                gone = effects.pid_gone(pid)
                return gone and f"{gone}; it ran under the power-cut overlay"

            return Injected(power_cut, node.restart, node.id)
        if plan.kind in ("fsync-eio", "disk-full"):
            _clear_control(node)
            offset = _log_size(node)
            setting = 'fsync_error = "EIO"' if plan.kind == "fsync-eio" else "disk_full = true"
            _control_path(node).write_text(setting + "\n")
            if plan.kind == "disk-full":
                return Injected(self._full_probe(node, offset), heal)
            return Injected(self._fsync_probe(node), lambda: _heal_fsync(node), node.id)
        node.stop()  # a clean stop checkpoints: the newest entries reach an entry log
        notes.append(_flip(node, plan.detail))
        node.restart()
        flipped = notes[-1] if notes[-1].startswith("flipped") else None
        return Injected(lambda: flipped, lambda: None)

    def _fsync_probe(self, node: Node) -> Probe:
        def probe() -> str | None:
            errors = effects.fault_hits(node.data_dirs["journal"]).get("fsync_errors", 0)
            if not errors:
                return None
            state = "stopped (fail-stop)" if not node.is_running() else "still running"
            return f"{errors} fsync(s) failed with EIO; bookie {state}"

        return probe

    def _full_probe(self, node: Node, offset: int) -> Probe:
        def probe() -> str | None:
            if effects.log_says(_log_path(node), offset, READ_ONLY_MARKER):
                return "the bookie turned read-only"
            refused = effects.fault_hits(node.data_dirs["journal"]).get("enospc_errors", 0)
            if refused and not node.is_running():
                return f"{refused} write(s) refused with ENOSPC; the bookie stopped (fail-stop)"
            return None

        return probe


def _heal_fsync(node: Node) -> None:
    """A bookie whose fsync failed stops (fail-stop): wait for it, then start it again.
    One still running long after is a defect the nemesis reports (a TimeoutError)."""
    failed = effects.fault_hits(node.data_dirs["journal"]).get("fsync_errors", 0)
    _clear_control(node)
    if failed:
        what = f"{node.id} to stop after {failed} failed fsync(s)"
        procs.wait_for(lambda: not node.is_running(), FAIL_STOP_TIMEOUT_S, what)
    if not node.is_running():
        node.restart()


def _pid(target: Target) -> int | None:
    if isinstance(target, Node):
        return target.pid if target.is_running() else None
    current = getattr(target, "current_pid", None)
    return current() if callable(current) else None


def _log_path(node: Node) -> Path:
    return Path(str(node.info.extra["log"]))


def _log_size(node: Node) -> int:
    with contextlib.suppress(FileNotFoundError):
        return _log_path(node).stat().st_size
    return 0


def _control_path(node: Node) -> Path:
    return node.data_dirs["journal"] / CONTROL_FILE


def _clear_control(node: Node) -> None:
    if node.kind == "bookie":
        _control_path(node).unlink(missing_ok=True)
        (node.data_dirs["journal"] / HITS_FILE).unlink(missing_ok=True)


def _has_cluster_args(cluster: ChaosCluster, node: Node) -> bool:
    return cluster.local.extra_args.get(node.id, []) == list(cluster.bookie_args)


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
