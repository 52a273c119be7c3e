"""A decommissioned bookie can be retired and then leaves every view (issue 22, defect 2).

After ``bookline bookie decommission`` had moved everything off bookie-2, ``bookie
list`` kept it ``down`` and ``bookline status`` exited 3 forever: its cookie stayed in
ZooKeeper and no command deleted it. ``bookline bookie retire ID`` does, refusing while
the bookie is up or a ledger names it; the local cluster then drops it from
``cluster.json`` and does not start it again, and the bookie itself refuses to rejoin
on its old disks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from metadata.layout import Layout
from ops.cluster import procs
from ops.cluster.local import CLUSTER_ROOT, LocalCluster, Quorums
from tests.cli_support import cli_json, run_cli
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# A stopped bookie's session expires within the local cluster's 4 s; room for a loaded
# machine.
UNREGISTERED_S = 60.0


# Decommissioning copies a ledger's entries: more than the commands' usual deadline.
COMMAND_TIMEOUT_S = 180.0


def _cli(cluster: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cluster=cluster, timeout_s=COMMAND_TIMEOUT_S)


def _json(cluster: Path, *args: str) -> Any:
    return cli_json(*args, cluster=cluster, timeout_s=COMMAND_TIMEOUT_S)


def test_decommission_then_retire_leaves_no_trace(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "c",
        bookies=4,
        write_proxies=1,
        autorecovery=True,
        autorecovery_args=["--grace-ms", "600000"],  # the test decommissions by hand
        quorums=Quorums(3, 3, 2),
        service_session_timeout_ms=4_000,
    )
    cluster.start()
    try:
        file = cluster.dir / "cluster.json"
        wrote = run_cli(
            "stream", "write", "s", cluster=file, stdin="".join(f"r{i}\n" for i in range(20))
        )
        assert wrote.returncode == 0, wrote.stderr
        ledgers = _json(file, "ledger", "list", "--stream", "s")["ledgers"]
        victim = ledgers[0]["ensembles"][-1]["bookies"][0]
        info = next(b for b in cluster.bookies if b.name == victim)
        assert _cli(file, "bookie", "readonly", victim).returncode == 0

        up = _cli(file, "bookie", "retire", victim)
        assert up.returncode == 1 and "decommission it" in up.stderr, up.stderr
        procs.stop(info.proc)
        cluster.note_exit(info)
        cluster.write_cluster_json()
        wait_until(
            lambda: _json(file, "bookie", "info", victim)["state"] == "down",
            "the stopped bookie to leave the registry",
            timeout_s=UNREGISTERED_S,
        )
        needed = _cli(file, "bookie", "retire", victim)
        assert needed.returncode == 1 and "ledgers name it" in needed.stderr, needed.stderr

        drained = _cli(file, "bookie", "decommission", victim, "--open-ledger-grace-ms", "0")
        assert drained.returncode == 0, drained.stderr
        retired = _cli(file, "bookie", "retire", victim)
        assert retired.returncode == 0, retired.stderr

        # Its old disks do not rejoin: the bookie refuses to start.
        again = cluster.respawn(info)
        wait_until(
            lambda: again.proc.poll() is not None, "the retired bookie to exit", timeout_s=60
        )
        assert again.proc.returncode != 0
        assert "was retired" in Path(again.extra["log"]).read_text()
        cluster.note_exit(again)
        # The local cluster drops it (what its supervisor does while a bookie is down).
        assert cluster.forget_retired()
        cluster.write_cluster_json()
        assert victim not in [b["id"] for b in json.loads(file.read_text())["bookies"]]
        assert victim not in [b["id"] for b in _json(file, "bookie", "list")["bookies"]]
        status = _cli(file, "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        assert victim not in [b["id"] for b in json.loads(status.stdout)["bookies"]]
        assert _no_znode_names(cluster, victim)
    finally:
        cluster.stop()


def _no_znode_names(cluster: LocalCluster, bookie_id: str) -> bool:
    """No znode under the cluster's bookies (registrations, cookies, holds) names it."""
    client = KazooClient(hosts=cluster.zk_connect, timeout=10)
    client.start(timeout=15)
    try:
        base = f"{Layout(CLUSTER_ROOT).root}/bookies"
        found = [
            f"{base}/{d}/{bookie_id}"
            for d in client.get_children(base)
            if client.exists(f"{base}/{d}/{bookie_id}") is not None
        ]
    finally:
        client.stop()
        client.close()
    assert not found, found
    return True
