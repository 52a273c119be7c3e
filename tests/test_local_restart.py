"""``bookline local`` stops and starts again in the shell the README sets up (issue 22,
defects 1 and 10).

The README exports ``BOOKLINE_CLUSTER=DIR/cluster.json`` for the client commands. The
children of ``bookline local`` inherited it, and the autorecovery child took the
variable over the ``--zk`` the supervisor gave it: with no file yet it failed the first
start, and with the file of a stopped cluster every later one (``autorecovery-1 exited
with code 4``). And a stopped cluster's ``cluster.json`` kept every dead child as
``running`` with its old pid, which a tool signalling it could find reused.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from ops.cluster import procs
from ops.cluster.local import LocalCluster, Quorums
from tests.cli_support import run_cli
from tests.cluster_support import cluster_doc
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# A whole `bookline local` (ZooKeeper, 4 bookies, autorecovery, 2 proxies) is up well
# within this on a loaded machine.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
CHILD_LISTS = ("zookeepers", "bookies", "autorecovery", "write_proxies", "read_proxies")


def _assert_stopped(cluster: Path) -> None:
    """Defect 10: after a stop no child is shown running or with a pid."""
    doc = cluster_doc(cluster)
    assert doc["state"] == "stopped", doc
    assert "pid" not in doc and "pid" not in doc["zookeeper"], doc
    for key in CHILD_LISTS:
        for child in doc[key]:
            assert child["state"] == "stopped" and "pid" not in child, (key, child)


def _start(directory: Path, log_path: Path, env: dict[str, str]) -> Any:
    """`bookline local --dir DIR &` as the README has it; waits until it serves."""
    cluster = directory / "cluster.json"
    argv = [sys.executable, "-m", "ops.cli", "local", "--dir", str(directory)]
    proc = procs.spawn(argv, log_path=log_path, env=env)

    def up_or_dead() -> bool:
        doc = cluster_doc(cluster)
        return (doc.get("state") == "running" and doc.get("pid") == proc.pid) or (
            proc.poll() is not None
        )

    try:
        wait_until(up_or_dead, "bookline local to serve", timeout_s=START_TIMEOUT_S)
    except BaseException:
        _stop(proc)
        raise
    if proc.poll() is not None:
        raise AssertionError(f"bookline local exited {proc.returncode}:\n{log_path.read_text()}")
    return proc


def _stop(proc: Any) -> None:
    """Ctrl-C, as in a terminal; by pid, also when the test failed."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            wait_until(lambda: proc.poll() is not None, "bookline local to stop",
                       timeout_s=STOP_TIMEOUT_S)  # fmt: skip
        finally:
            procs.stop(proc)


def test_readme_commands_through_two_stop_start_cycles_with_bookline_cluster_exported(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "bl"
    cluster = directory / "cluster.json"
    # The README's shell: the variable is exported before the file exists.
    env = {**os.environ, "BOOKLINE_CLUSTER": str(cluster)}
    written: list[str] = []
    for cycle in range(3):  # a start, then two stop/start cycles
        proc = _start(directory, tmp_path / f"local-{cycle}.log", env)
        try:
            status = run_cli("status", env=env)
            assert status.returncode == 0, status.stdout + status.stderr
            if cycle == 0:
                created = run_cli("stream", "create", "orders", env=env)
                assert created.returncode == 0, created.stderr
            lines = [f"cycle {cycle} record {i}" for i in range(3)]
            wrote = run_cli(
                "stream", "write", "orders", stdin="".join(f"{x}\n" for x in lines), env=env
            )
            assert wrote.returncode == 0, wrote.stderr
            written += lines
            read = run_cli("stream", "read", "orders", "--from", "earliest", env=env)
            assert read.returncode == 0, read.stderr
            assert read.stdout.splitlines() == written
        finally:
            _stop(proc)
        _assert_stopped(cluster)


def test_a_stopped_cluster_shows_no_child_running_and_no_pid(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", bookies=1, write_proxies=1, quorums=Quorums(1, 1, 1))
    cluster.start()
    try:
        doc = cluster_doc(cluster.dir / "cluster.json")
        pids = [c["pid"] for key in CHILD_LISTS for c in doc[key]]
        assert len(pids) == 3 and all(p > 0 for p in pids), doc
    finally:
        cluster.stop()
    _assert_stopped(cluster.dir / "cluster.json")
