"""The children of a local cluster (:mod:`ops.local`), as data: the quorums the write
proxies are given, where a child runs (:class:`Placement`), one child's entry
(:class:`ProcessInfo`, what ``cluster.json`` lists) and the log line that says it serves.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

# Ready lines each kind of child prints once it serves.
READY_MARKERS = {
    "bookie": b"bookie ready",
    "writeproxy": b"ready id=",
    "readproxy": b"ready id=",
    "autorecovery": b"autorecovery ready",
}


@dataclass(frozen=True, slots=True)
class Quorums:
    """E, Qw, Qa of the ledgers the write proxies create (their `--ensemble-size` ...)."""

    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2

    def args(self) -> list[str]:
        return [
            "--ensemble-size",
            str(self.ensemble_size),
            "--write-quorum",
            str(self.write_quorum),
            "--ack-quorum",
            str(self.ack_quorum),
        ]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a child runs: the address it binds and the command prefix that puts it
    there (``ip netns exec NS`` for a host of its own, :mod:`ops.chaos.hosts`)."""

    host: str = "127.0.0.1"
    prefix: tuple[str, ...] = ()


LOOPBACK = Placement()


@dataclass
class ProcessInfo:
    """One child: what it is, its process, and what the supervisor knows of it."""

    name: str
    proc: subprocess.Popen[bytes]
    address: str
    extra: dict[str, Any] = field(default_factory=dict)
    kind: str = ""
    state: str = "running"  # starting | running | down
    exit_status: int | None = None  # of the last exit
    exited_at: str = ""
    restarts: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.name,
            "pid": self.proc.pid,
            "address": self.address,
            "state": self.state,
            "restarts": self.restarts,
        }
        if self.exit_status is not None:
            out["exit_status"] = self.exit_status
            out["exited_at"] = self.exited_at
        out.update({k: v for k, v in self.extra.items() if not k.startswith("_")})
        return out
