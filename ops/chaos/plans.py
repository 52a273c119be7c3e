"""What the nemesis will do, chosen from the run's seed and the fixed topology only.

A :class:`Step` is one fault (``single``) or an overlap scenario: several faults whose
holds overlap, each started ``delay_s`` after the step began and healed on its own
clock. Every other step is an overlap (steps 2, 4, ...), so a run's share of
overlapping faults does not hang on luck; which scenario, on whom and for how long are
drawn from the ``random.Random``:

* ``bookies-down``: Qa (2) or E (3) bookies power-cut or ``kill -9``'d at once (every
  chaos bookie runs under the power-cut overlay, so both lose what was not fsynced);
* ``partition-during-kill``: a network fault, and a process killed while it holds;
* ``zk-minority-during-bookie-loss``: one ZooKeeper server cut off (or killed), and a
  bookie power-cut or killed meanwhile.

Never chosen from timing or state, so a seed replays the same kinds, targets, holds and
delays (how many steps fit in a run depends on the machine).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from ops.chaos.hosts import QUORUMS, SESSION_TIMEOUT_MS

__all__ = ["HOLD_S", "NETWORK_KINDS", "PROCESS_KINDS", "STORAGE_KINDS", "Plan", "Planner", "Step"]

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
    # A storage fault's hold includes waiting for it to take effect (a bookie's disk
    # check runs every 5 s).
    "storage": (2.0, 5.0),
    # The longer fault of an overlap scenario: the other one starts inside it.
    "outer": (3.0, 6.0),
}
# Every OVERLAP_EVERY-th step is an overlap scenario.
OVERLAP_EVERY: Final = 2
SCENARIOS: Final = ("bookies-down", "partition-during-kill", "zk-minority-during-bookie-loss")
# Bookies taken down at once by bookies-down: the ack quorum, sometimes a whole ensemble.
BOOKIES_DOWN: Final = (QUORUMS.ack_quorum, QUORUMS.ack_quorum, QUORUMS.ensemble_size)


@dataclass(frozen=True, slots=True)
class Plan:
    """A fault chosen but not started: what only the seed decides."""

    kind: str
    target: str  # e.g. "bookie-2"; "a|b,c" for a partition of sides a and b,c
    hold_s: float
    detail: str = ""  # kind-specific choice (e.g. which bit), also seeded
    delay_s: float = 0.0  # started this long after its step began (overlap scenarios)


@dataclass(frozen=True, slots=True)
class Step:
    scenario: str  # "single" or one of SCENARIOS
    plans: tuple[Plan, ...]


@dataclass(frozen=True, slots=True)
class Topology:
    """The fixed cast: host names by kind, registered writers, namespaces or not."""

    zookeepers: tuple[str, ...]
    bookies: tuple[str, ...]
    services: tuple[str, ...]  # proxies
    writers: tuple[str, ...]
    namespaces: bool

    @property
    def hosts(self) -> list[str]:
        return [*self.zookeepers, *self.bookies, *self.services]


class Planner:
    """Draws steps from ``rng`` (see the module docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.steps = 0

    def kinds(self, top: Topology) -> tuple[str, ...]:
        network = NETWORK_KINDS if top.namespaces else ()
        return (*PROCESS_KINDS, *network, *STORAGE_KINDS)

    def step(self, top: Topology) -> Step:
        self.steps += 1
        if self.steps % OVERLAP_EVERY:
            return Step("single", (self.plan(top),))
        scenarios = [s for s in SCENARIOS if top.namespaces or s != "partition-during-kill"]
        scenario = self.rng.choice(scenarios)
        make = {
            "bookies-down": self._bookies_down,
            "partition-during-kill": self._partition_during_kill,
            "zk-minority-during-bookie-loss": self._zk_minority_during_bookie_loss,
        }[scenario]
        return Step(scenario, make(top))

    def plan(self, top: Topology) -> Plan:
        """One fault of any kind."""
        kind = self.rng.choice(self.kinds(top))
        group = "network" if kind in NETWORK_KINDS else "storage" if kind in STORAGE_KINDS else kind
        target, detail = self._choose_target(top, kind)
        return Plan(kind, target, self._hold(group), detail)

    def _hold(self, group: str) -> float:
        return round(self.rng.uniform(*HOLD_S[group]), 3)

    def _inside(self, outer: Plan) -> float:
        """A delay that starts a fault while ``outer`` holds."""
        return round(self.rng.uniform(0.2, 0.5) * outer.hold_s, 3)

    def _bookie_loss(self, bookie: str, delay_s: float) -> Plan:
        kind = self.rng.choice(("power-cut", "kill"))
        return Plan(kind, bookie, self._hold("kill"), delay_s=delay_s)

    def _bookies_down(self, top: Topology) -> tuple[Plan, ...]:
        count = self.rng.choice(BOOKIES_DOWN)
        chosen = self.rng.sample(list(top.bookies), count)
        first = self._bookie_loss(chosen[0], 0.0)
        first = Plan(first.kind, first.target, self._hold("outer"))
        rest = [self._bookie_loss(b, self._inside(first)) for b in chosen[1:]]
        return (first, *rest)

    def _partition_during_kill(self, top: Topology) -> tuple[Plan, ...]:
        kind = self.rng.choice(NETWORK_KINDS)
        target, detail = self._choose_target(top, kind)
        net = Plan(kind, target, self._hold("outer"), detail)
        victim = self.rng.choice([*top.hosts, *top.writers])
        return net, Plan("kill", victim, self._hold("kill"), delay_s=self._inside(net))

    def _zk_minority_during_bookie_loss(self, top: Topology) -> tuple[Plan, ...]:
        kinds = ("partition-zk-minority", "kill") if top.namespaces else ("kill",)
        zk = Plan(self.rng.choice(kinds), self.rng.choice(top.zookeepers), self._hold("outer"))
        bookie = self.rng.choice(top.bookies)
        return zk, self._bookie_loss(bookie, self._inside(zk))

    def _choose_target(self, top: Topology, kind: str) -> tuple[str, str]:
        rng, names = self.rng, top.hosts
        if kind in PROCESS_KINDS:
            return rng.choice([*names, *top.writers]), ""
        if kind == "link-down":
            return rng.choice(names), ""
        if kind == "partition-zk-minority":
            return rng.choice(top.zookeepers), ""
        if kind == "partition-halves":
            lone = rng.choice(top.zookeepers)
            others = [*top.bookies, *top.services]
            side = sorted(rng.sample(others, len(others) // 2))
            minority = [lone, *side]
            majority = [n for n in names if n not in minority]
            return f"{','.join(minority)}|{','.join(majority)}", ""
        if kind == "one-way":
            receiver, sender = rng.sample(names, 2)
            return f"{receiver}<-{sender}", "receiver drops what the sender sends"
        bookie = rng.choice(top.bookies)
        if kind == "bit-flip":
            return bookie, f"position={rng.random():.6f} bit={rng.randrange(8)}"
        return bookie, ""
