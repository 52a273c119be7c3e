"""``bookline local`` watches its children (issue 16's acceptance).

On a running ``bookline local`` (its defaults: 4 bookies, E=Qw=3, Qa=2, autorecovery):
``kill -9`` of a bookie is logged with its status, ``cluster.json`` shows it down,
``bookline status`` shows it down and the under-replicated ledgers within seconds, the
count goes back to 0 as autorecovery copies the entries to the spare bookie, and a
writer writing all along never saw a write fail. Stopping keeps ``cluster.json``
marked stopped, and the next command says so.

Before: the dead bookie stayed a zombie, nothing was logged, ``cluster.json`` kept
listing it as it was, no autorecovery ran, and with the old defaults (3 bookies) every
write failed with NOT_ENOUGH_BOOKIES after ~30 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ops.cluster import procs
from tests.cli_support import cli_json, run_cli
from tests.cluster_support import cluster_doc
from tests.waiting import scaled, wait_until

pytestmark = pytest.mark.integration

# Writes are acknowledged within this long even while a bookie is swapped out (the
# add timeout is 5 s; recovery of a fenced segment takes a second or two).
WRITE_GAP_S_MAX = 15.0


def _status(cluster: Path) -> dict[str, Any]:
    status: dict[str, Any] = cli_json("status", cluster=cluster)
    return status


def _gone(pid: int) -> bool:
    """Exited and reaped: no /proc entry (a zombie still has one)."""
    return not Path(f"/proc/{pid}").exists()


class Writer(threading.Thread):
    """Writes a record every 20 ms through the thin client; remembers every failure
    and the longest wait between two acknowledgements."""

    def __init__(self, cluster: Path) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stop = threading.Event()
        self.acked = 0
        self.failures: list[str] = []
        self.gap_s = 0.0

    def run(self) -> None:
        from thinclient.sync import SyncProxyClient

        with SyncProxyClient.from_cluster_file(self.cluster) as client:
            last = time.monotonic()
            while not self.stop.is_set():
                try:
                    client.write("acceptance", f"record {self.acked}")
                except Exception as exc:  # noqa: BLE001 - every failure is the finding
                    self.failures.append(repr(exc))
                else:
                    self.acked += 1
                    now = time.monotonic()
                    self.gap_s = max(self.gap_s, now - last)
                    last = now
                time.sleep(0.02)  # pacing: a steady writer, not a flood


def test_kill_9_of_a_bookie_is_seen_logged_and_repaired_while_writes_go_on(
    tmp_path: Path,
) -> None:
    cluster = tmp_path / "c" / "cluster.json"
    local_log = tmp_path / "local.log"
    argv = [sys.executable, "-m", "ops.cli", "local", "--dir", str(tmp_path / "c")]
    proc = procs.spawn(argv, log_path=local_log)
    writer: Writer | None = None
    try:
        wait_until(
            lambda: cluster_doc(cluster).get("state") == "running" or proc.poll() is not None,
            "cluster.json",
            timeout_s=120,
        )
        assert proc.poll() is None, f"bookline local exited:\n{local_log.read_text()[-3000:]}"
        layout = cluster_doc(cluster)
        assert len(layout["bookies"]) == 4, layout
        writer = Writer(cluster)
        writer.start()
        wait_until(lambda: writer is not None and writer.acked >= 20, "first writes", timeout_s=60)

        # A bookie holding the stream's entries (4 bookies, ensembles of 3).
        ledgers = cli_json("ledger", "list", "--stream", "acceptance", cluster=cluster)
        holder = ledgers["ledgers"][0]["ensembles"][-1]["bookies"][0]
        victim = next(b for b in layout["bookies"] if b["id"] == holder)
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()

        def shown_down() -> bool:
            entry = next(b for b in cluster_doc(cluster)["bookies"] if b["id"] == victim["id"])
            return bool(entry["state"] == "down")

        wait_until(shown_down, "cluster.json to show the bookie down", timeout_s=5)
        entry = next(b for b in cluster_doc(cluster)["bookies"] if b["id"] == victim["id"])
        assert entry["exit_status"] == -9, entry
        assert _gone(victim["pid"]), "the dead bookie is still a zombie"
        text = local_log.read_text()
        assert f"{victim['id']} (pid {victim['pid']}) exited: killed by SIGKILL" in text, text

        # A writer that already swapped the dead bookie out lets autorecovery re-copy
        # the earlier segments without fencing it: marked and repaired can both happen
        # between two looks at `status`, so the auditor's log is asked as well.
        recovery_log = next((tmp_path / "c" / "autorecovery-1").glob("*.log"))
        lost = f"under-replicated: lost ['{victim['id']}']"

        def status_sees_it() -> bool:
            status = _status(cluster)
            row = next(b for b in status["bookies"] if b["id"] == victim["id"])
            marked = status["underreplicated"] > 0 or lost in recovery_log.read_text()
            return bool(row["state"] == "down" and marked)

        wait_until(status_sees_it, "status: bookie down, ledgers under-replicated", timeout_s=30)
        seen_s = time.monotonic() - killed_at
        wait_until(
            lambda: _status(cluster)["underreplicated"] == 0, "re-replication", timeout_s=120
        )
        assert " repaired (lost " in recovery_log.read_text()
        writer.stop.set()
        writer.join(30)
        assert not writer.failures, writer.failures[:5]
        assert writer.gap_s < scaled(WRITE_GAP_S_MAX), f"writes stalled {writer.gap_s:.1f} s"
        print(f"seen down + under-replicated after {seen_s:.1f} s; {writer.acked} writes")
        status = _status(cluster)
        assert status["autorecovery"]["auditor"], status["autorecovery"]
        process = status["autorecovery"]["processes"][0]
        assert process["state"] == "running" and process["health"] == "ok", process
        assert {b["id"]: b["state"] for b in status["bookies"]}[victim["id"]] == "down"
    finally:
        if writer is not None:
            writer.stop.set()
        if proc.poll() is None:  # (one that exited early is reported above, not masked)
            os.killpg(proc.pid, signal.SIGINT)
        wait_until(lambda: proc.poll() is not None, "bookline local to stop", timeout_s=60)
        procs.stop(proc)
    # Stopped: cluster.json stays, says so, and a command says how to start it again.
    assert cluster_doc(cluster)["state"] == "stopped"
    out = run_cli("stream", "list", cluster=cluster)
    assert out.returncode == 4 and "was stopped" in out.stderr, out.stderr
    assert "bookline local --dir" in out.stderr, out.stderr


def test_restart_and_a_zookeeper_ensemble(tmp_path: Path) -> None:
    """`--restart --zk-ensemble 3`: kill -9 of a ZooKeeper server and of the write proxy;
    both come back (restarts 1, running), the metadata store served throughout (a
    quorum of 2), and writes work again."""
    cluster = tmp_path / "c" / "cluster.json"
    argv = [sys.executable, "-m", "ops.cli", "local", "--dir", str(tmp_path / "c"),
            "--restart", "--zk-ensemble", "3", "--read-proxies", "0"]  # fmt: skip
    proc = procs.spawn(argv, log_path=tmp_path / "local.log")
    try:
        wait_until(
            lambda: cluster_doc(cluster).get("state") == "running" or proc.poll() is not None,
            "cluster.json",
            timeout_s=180,
        )
        layout = cluster_doc(cluster)
        modes = sorted(z["mode"] for z in _status(cluster)["zookeeper"])
        assert modes == ["follower", "follower", "leader"], modes
        victims = [layout["zookeepers"][0], layout["write_proxies"][0]]
        for victim in victims:
            os.kill(victim["pid"], signal.SIGKILL)

        def back() -> bool:
            doc = cluster_doc(cluster)
            now = [doc["zookeepers"][0], doc["write_proxies"][0]]
            return all(e["state"] == "running" and e["restarts"] == 1 for e in now)

        wait_until(back, "the killed children to run again", timeout_s=90)
        doc = cluster_doc(cluster)
        assert doc["zookeepers"][0]["exit_status"] == -9
        assert doc["write_proxies"][0]["pid"] != victims[1]["pid"]
        out = subprocess.run(
            [sys.executable, "-m", "ops.cli", "stream", "write", "after", "--cluster",
             str(cluster)],
            input="one\n", capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        wait_until(lambda: proc.poll() is not None, "bookline local to stop", timeout_s=60)
        procs.stop(proc)
