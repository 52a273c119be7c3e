"""Network namespaces as hosts: one bridge per chaos cluster, one namespace per host.

Layout of cluster slot ``S`` (``0 <= S < SLOTS``, so clusters run side by side):

* bridge ``blcS-br`` in the root namespace with address ``10.77.S.1/24`` (clients in
  the root namespace reach every host through it);
* host ``NAME`` is namespace ``blc-S-NAME`` with ``eth0`` at ``10.77.S.<n>/24``, the
  peer of veth ``blcS-NAME`` on the bridge (taking that link down cuts the host off);
* partitions are nftables tables ``blc_<tag>`` inside a host's namespace, one per fault,
  so healing one fault deletes exactly its rules.

A slot is owned by whoever holds ``/run/bookline-chaos/slot-S.lock`` (flock, released
by the kernel when the owner dies). Taking a slot first removes what a crashed owner
left there: processes still in its namespaces (by pid), the namespaces, the links.
Everything is done with ``ip`` and ``nft``; a failing command raises
:class:`NetnsError` with the command and its stderr.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

PREFIX: Final = "blc"
# Clusters that can run at once on one machine (one /24 each under 10.77.0.0/16).
SLOTS: Final = 32
SUBNET_PREFIX: Final = "10.77"
LOCK_DIR: Final = Path("/run/bookline-chaos")
# The nftables table of a fault is named TABLE_PREFIX + its tag.
TABLE_PREFIX: Final = "blc_"
# One `ip`/`nft` command; they answer in milliseconds unless the machine is wedged.
COMMAND_TIMEOUT_S: Final = 20.0


class NetnsError(RuntimeError):
    """An ``ip``/``nft`` command failed (which one, and what it said)."""


def run(argv: Sequence[str]) -> str:
    """Run a network command; its stdout, or NetnsError naming it and its stderr."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"`{' '.join(argv)}` could not run: {exc}") from exc
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def in_ns(ns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside namespace ``ns`` (``ip netns exec`` execs it: same pid)."""
    return ["ip", "netns", "exec", ns, *argv]


@dataclass(frozen=True, slots=True)
class NetHost:
    """One host: its namespace, the root side of its veth, and its address."""

    name: str
    ns: str
    veth: str
    address: str

    @property
    def prefix(self) -> tuple[str, ...]:
        return tuple(in_ns(self.ns, []))


def _ns_prefix(slot: int) -> str:
    return f"{PREFIX}-{slot}-"


def _link_prefix(slot: int) -> str:
    return f"{PREFIX}{slot}-"


def namespaces() -> list[str]:
    """Every network namespace's name (``ip netns list``)."""
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def links() -> list[str]:
    """Every link's name in the root namespace (veths without their ``@peer``)."""
    out = []
    for line in run(["ip", "-o", "link", "show"]).splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0]
        out.append(name)
    return out


def _kill_pids_in(ns: str) -> None:
    """SIGKILL processes a crashed run left inside ``ns`` (by pid, as listed)."""
    for word in run(["ip", "netns", "pids", ns]).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(word), signal.SIGKILL)
            log.warning("killed pid %s left in namespace %s", word, ns)


def _try_lock(slot: int) -> int | None:
    """The slot's lock file descriptor, held; None when another process holds it."""
    fd = os.open(LOCK_DIR / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def remove_slot(slot: int) -> list[str]:
    """Remove this slot's links and namespaces (and what runs in them); their names.
    Links first: deleting a veth takes its peer along at once, while a deleted
    namespace's veths disappear only later (the kernel cleans up asynchronously)."""
    gone = []
    for link in links():
        if link.startswith(_link_prefix(slot)):
            _delete_link(link)
            gone.append(link)
    for ns in namespaces():
        if ns.startswith(_ns_prefix(slot)):
            _kill_pids_in(ns)
            run(["ip", "netns", "del", ns])
            gone.append(ns)
    return gone


def _delete_link(link: str) -> None:
    """Delete a link; one already gone (its veth peer was deleted) is fine."""
    try:
        run(["ip", "link", "del", link])
    except NetnsError as exc:
        if "Cannot find device" not in str(exc):
            raise


class Network:
    """A slot's bridge and hosts (see the module docstring). ``open()`` takes a free
    slot and cleans it; ``add_host()``; ``close()`` removes all and frees the slot."""

    def __init__(self) -> None:
        self.slot = -1
        self._lock_fd: int | None = None
        self.hosts: dict[str, NetHost] = {}

    @property
    def bridge(self) -> str:
        return f"{_link_prefix(self.slot)}br"

    @property
    def gateway(self) -> str:
        return f"{SUBNET_PREFIX}.{self.slot}.1"

    def open(self) -> Network:
        """Take a free slot and create its bridge. Every slot nobody holds is cleaned
        first: what a crashed run left there (processes, namespaces, links) goes."""
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        for slot in range(SLOTS):
            fd = _try_lock(slot)
            if fd is None:
                continue  # a live cluster's
            stale = remove_slot(slot)
            if stale:
                log.warning("removed %s left by a previous run in slot %d", stale, slot)
            if self._lock_fd is None:
                self.slot, self._lock_fd = slot, fd
            else:
                os.close(fd)
        if self._lock_fd is None:
            raise NetnsError(f"all {SLOTS} chaos network slots are taken")
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        return self

    def add_host(self, name: str) -> NetHost:
        """A namespace with its veth on the bridge and the next address."""
        number = len(self.hosts) + 11  # .1 is the bridge
        host = NetHost(
            name,
            f"{_ns_prefix(self.slot)}{name}",
            f"{_link_prefix(self.slot)}{name}",
            f"{SUBNET_PREFIX}.{self.slot}.{number}",
        )
        self.hosts[name] = host
        run(["ip", "netns", "add", host.ns])
        run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
             "netns", host.ns])  # fmt: skip
        run(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
        run(in_ns(host.ns, ["ip", "addr", "add", f"{host.address}/24", "dev", "eth0"]))
        run(in_ns(host.ns, ["ip", "link", "set", "eth0", "up"]))
        run(in_ns(host.ns, ["ip", "link", "set", "lo", "up"]))
        return host

    def close(self) -> list[str]:
        """Remove every namespace and link of this slot, release it; what was removed."""
        if self._lock_fd is None:
            return []
        try:
            return remove_slot(self.slot)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None
            self.hosts.clear()

    # -- faults ------------------------------------------------------------------------
    def set_link(self, host: NetHost, up: bool) -> None:
        run(["ip", "link", "set", host.veth, "up" if up else "down"])

    def block(self, host: NetHost, tag: str, peers: Iterable[NetHost], *, both: bool) -> None:
        """In ``host``, drop packets from ``peers`` (and to them when ``both``)."""
        addresses = ", ".join(p.address for p in peers)
        table = TABLE_PREFIX + tag
        rules = [
            f"add table inet {table}",
            f"add chain inet {table} in {{ type filter hook input priority 0; }}",
            f"add rule inet {table} in ip saddr {{ {addresses} }} drop",
        ]
        if both:
            rules += [
                f"add chain inet {table} out {{ type filter hook output priority 0; }}",
                f"add rule inet {table} out ip daddr {{ {addresses} }} drop",
            ]
        run(in_ns(host.ns, ["nft", "; ".join(rules)]))

    def unblock(self, host: NetHost, tag: str | None = None) -> None:
        """Delete fault ``tag``'s table in ``host`` (every fault table when None)."""
        tables = run(in_ns(host.ns, ["nft", "list", "tables"])).split()
        for word in tables:
            if word.startswith(TABLE_PREFIX) and (tag is None or word == TABLE_PREFIX + tag):
                run(in_ns(host.ns, ["nft", "delete", "table", "inet", word]))
