"""`bookline stream ...` end to end against the shared proxy cluster, and
`bookline local` with proxies: cluster.json, one process each, stop by Ctrl-C."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ops.cluster import procs
from ops.cluster.local import LocalCluster
from tests.cli_support import run_cli
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def _cli(cluster: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return run_cli("stream", *args, stdin=stdin, env={"BOOKLINE_CLUSTER": str(cluster)})


def test_stream_commands_end_to_end(proxy_cluster: LocalCluster) -> None:
    cluster = proxy_cluster.dir / "cluster.json"
    name = f"cli-{uuid.uuid4().hex[:8]}"
    assert _cli(cluster, "create", name).returncode == 0
    assert name in _cli(cluster, "list").stdout.split()
    out = _cli(cluster, "write", name, stdin="".join(f"line {i}\n" for i in range(500)))
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip()
    assert last.count(":") == 2
    read = _cli(cluster, "read", name)
    assert read.stdout.splitlines() == [f"line {i}" for i in range(500)]
    assert _cli(cluster, "read", name, "--from", "seq:498").stdout.splitlines() == [
        "line 498",
        "line 499",
    ]
    assert _cli(cluster, "read", name, "--from", last, "--limit", "5").stdout.splitlines() == [
        "line 499"
    ]
    desc = json.loads(_cli(cluster, "describe", name, "--json").stdout)
    assert desc["record_count"] == 500
    assert desc["owner"]
    follow = _cli(cluster, "read", name, "--from", "seq:499", "--follow", "--limit", "1")
    assert follow.stdout.splitlines() == ["line 499"]
    bad = _cli(cluster, "write", "bad/name", stdin="x\n")
    assert bad.returncode == 1
    assert "INVALID_NAME (13)" in bad.stderr
    assert _cli(cluster, "delete", name).returncode == 0
    assert name not in _cli(cluster, "list").stdout.split()


def test_stream_write_fails_nonzero_when_writes_fail(proxy_cluster: LocalCluster) -> None:
    cluster = proxy_cluster.dir / "cluster.json"
    out = _cli(
        cluster, "write", f"big-{uuid.uuid4().hex[:6]}", stdin="ok\n" + "z" * (2 << 20) + "\n"
    )
    assert out.returncode == 1
    assert "TOO_LARGE" in out.stderr


def _start_local(tmp_path: Path) -> subprocess.Popen[bytes]:
    return procs.spawn(
        [
            sys.executable,
            "-m",
            "ops.cli",
            "local",
            "--dir",
            str(tmp_path / "c"),
            "--bookies",
            "3",
            "--write-proxies",
            "1",
            "--read-proxies",
            "1",
        ],
        log_path=tmp_path / "local.log",
    )


def _gone(pid: int) -> bool:
    """Exited (or a zombie): the process may vanish between any two looks at /proc."""
    try:
        return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return True


def test_bookline_local_runs_every_process_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    proc = _start_local(tmp_path)
    try:
        cluster = tmp_path / "c" / "cluster.json"
        wait_until(
            lambda: cluster.exists() or proc.poll() is not None, "cluster.json", timeout_s=90
        )
        layout = json.loads(cluster.read_text())
        assert "/" in layout["zk"]
        assert layout["zookeeper"]["pid"] > 0
        pids = [layout["zookeeper"]["pid"]] + [
            p["pid"] for k in ("bookies", "write_proxies", "read_proxies") for p in layout[k]
        ]
        assert len(set(pids)) == 6
        assert proc.pid not in pids
        assert layout["write_proxies"][0]["url"].startswith("http://")
        assert layout["read_proxies"][0]["url"].startswith("http://")
        out = _cli(cluster, "write", "kept", stdin="survives a restart\n")
        assert out.returncode == 0, out.stderr
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        for pid in pids:
            wait_until(functools.partial(_gone, pid), f"pid {pid} to exit", timeout_s=30)
        # Stopped: cluster.json stays, marked stopped (commands say so).
        assert json.loads(cluster.read_text())["state"] == "stopped"
        # Restart on the same directory: the data is still there.
        proc = _start_local(tmp_path)
        wait_until(
            lambda: (
                json.loads(cluster.read_text())["state"] == "running" or proc.poll() is not None
            ),
            "cluster.json",
            timeout_s=90,
        )
        read = _cli(cluster, "read", "kept")
        assert read.stdout.splitlines() == ["survives a restart"], read.stderr
    finally:
        procs.stop(proc)
