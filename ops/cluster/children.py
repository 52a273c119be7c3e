"""The children of a local cluster (:mod:`ops.cluster.local`), as data: the quorums the write
proxies are given, where a child runs (:class:`Placement`), one child's entry
(:class:`ProcessInfo`, what ``cluster.json`` lists), the log line that says it serves
and the environment it inherits (:func:`child_environ`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from foundation.auth import TOKEN_ENV
from foundation.tls import ENV_PREFIX as TLS_ENV_PREFIX
from ledger.keys import SECRET_FILE_ENV
from metadata.client import DIGEST_FILE_ENV
from ops.cluster.client_env import ENV_CLUSTER

# Ready lines each kind of child prints once it serves.
READY_MARKERS = {
    "bookie": b"bookie ready",
    "writeproxy": b"ready id=",
    "readproxy": b"ready id=",
    "autorecovery": b"autorecovery ready",
}

# A client's settings in the shell that starts a local cluster (the README exports
# BOOKLINE_CLUSTER): where a cluster is, who the client is, how it dials. A child gets
# each of them from the cluster itself (flags, or the variables ops.cluster.local sets), never
# from that shell: the autorecovery child took an inherited BOOKLINE_CLUSTER over its
# --zk and failed every start whose file was missing or marked stopped (issue 22).
CLIENT_ENV: Final = (ENV_CLUSTER, TOKEN_ENV, SECRET_FILE_ENV, DIGEST_FILE_ENV)
CLIENT_ENV_PREFIXES: Final = (TLS_ENV_PREFIX,)


def child_environ(parent: Mapping[str, str]) -> dict[str, str]:
    """``parent`` without the client settings a child must not inherit (log settings,
    ``BOOKLINE_<SERVICE>_*`` server settings and everything else stay)."""
    return {
        k: v
        for k, v in parent.items()
        if k not in CLIENT_ENV and not k.startswith(CLIENT_ENV_PREFIXES)
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
    state: str = "running"  # starting | running | down (cluster.json: stopped too)
    exit_status: int | None = None  # of the last exit
    exited_at: str = ""
    restarts: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.name}
        if self.state != "down":  # a reaped child's pid may be another process's by now
            out["pid"] = self.proc.pid
        out.update(address=self.address, state=self.state, restarts=self.restarts)
        if self.exit_status is not None:
            out["exit_status"] = self.exit_status
            out["exited_at"] = self.exited_at
        out.update({k: v for k, v in self.extra.items() if not k.startswith("_")})
        return out
