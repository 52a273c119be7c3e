"""`bookline topic ...`, `bookline produce` and `bookline stream list [--all]` end to
end against the shared proxy cluster (each command its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from foundation.partitioner import partition_for_key
from ops.cluster.local import LocalCluster
from tests.cli_support import run_cli
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def _cli(cluster: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return run_cli(*args, stdin=stdin, env={"BOOKLINE_CLUSTER": str(cluster)})


def _json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout.strip().splitlines()[-1])
    assert isinstance(obj, dict)
    return obj


def test_topic_commands_and_produce(proxy_cluster: LocalCluster) -> None:
    cluster = proxy_cluster.dir / "cluster.json"
    t = f"cli-{uuid.uuid4().hex[:8]}"
    created = _json(_cli(cluster, "topic", "create", t, "--partitions", "3",
                         "--retention-ms", "86400000", "--json"))  # fmt: skip
    assert created["partitions"] == 3
    assert created["options"] == {"retention_ms": 86_400_000}
    table = _cli(cluster, "topic", "list")
    assert table.returncode == 0 and t in table.stdout
    listed = _json(_cli(cluster, "topic", "list", "--json"))
    assert {"name": t, "partitions": 3, "options": {"retention_ms": 86_400_000}} in listed["topics"]

    lines = "".join(json.dumps({"user": f"u{i % 4}", "n": i}) + "\n" for i in range(40))
    produced = _json(_cli(cluster, "produce", t, "--key-field", "user", "--header", "src=cli",
                          "--json", stdin=lines))  # fmt: skip
    assert produced["records"] == 40 and produced["failed"] == 0
    per_key: dict[int, int] = {}
    for i in range(4):
        p = partition_for_key(f"u{i}".encode(), 3)
        per_key[p] = per_key.get(p, 0) + 10
    parts = produced["partitions"]
    assert isinstance(parts, dict)
    assert {int(p): v["records"] for p, v in parts.items()} == per_key
    assert all(v["first_offset"] == 0 for v in parts.values())
    fixed = _json(_cli(cluster, "produce", t, "--key", "k", "--json", stdin="a\nb\n"))
    assert list(fixed["partitions"]) == [str(partition_for_key(b"k", 3))]

    described = _json(_cli(cluster, "topic", "describe", t, "--json"))
    info = described["partition_info"]
    assert isinstance(info, list)
    assert sum(p["end_offset"] for p in info) == 42
    readable = _cli(cluster, "topic", "describe", t)
    assert readable.returncode == 0 and "42 records" in readable.stdout

    shrink = _cli(cluster, "topic", "alter", t, "--partitions", "2")
    assert shrink.returncode == 1 and "BAD_REQUEST (2)" in shrink.stderr
    assert (
        _json(_cli(cluster, "topic", "alter", t, "--partitions", "4", "--json"))["partitions"] == 4
    )
    zero = _cli(cluster, "topic", "create", f"z{t}", "--partitions", "0")
    # A usage error (exit 2, issue 22), caught before the cluster is asked.
    assert zero.returncode == 2 and "--partitions: 0 is below 1" in zero.stderr, zero.stderr
    bad = _cli(cluster, "produce", t, "--partition", "9", stdin="x\n")
    assert bad.returncode == 1 and "UNKNOWN_PARTITION (47)" in bad.stderr

    # `stream list` hides the partition streams unless --all.
    assert f"{t}~0" not in _cli(cluster, "stream", "list").stdout.split()
    assert f"{t}~0" in _cli(cluster, "stream", "list", "--all").stdout.split()

    assert _json(_cli(cluster, "topic", "delete", t, "--json")) == {"deleted": t}
    missing = _cli(cluster, "topic", "describe", t)
    assert missing.returncode == 1 and "NOT_FOUND (17)" in missing.stderr


def _interrupted_exit_status(cluster: Path, tmp_path: Path, *args: str) -> int:
    """Start ``bookline ARGS``, wait until it printed a record, send SIGINT (Ctrl-C) and
    return its exit status; the process is killed by its pid if it outlives the test."""
    import signal

    out_path = tmp_path / f"{args[0]}.out"
    # Unbuffered: a record printed reaches the file at once. Fault handler: a process
    # that outlives the SIGINT is made to print its threads' stacks (SIGABRT) for the report.
    env = {**os.environ, "BOOKLINE_CLUSTER": str(cluster), "PYTHONUNBUFFERED": "1",
           "PYTHONFAULTHANDLER": "1"}  # fmt: skip
    with out_path.open("wb") as out, (tmp_path / f"{args[0]}.err").open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ops.cli", *args], stdout=out,
                                stderr=err, env=env)  # fmt: skip
    try:
        wait_until(
            lambda: proc.poll() is not None or out_path.read_bytes().strip() != b"",
            f"`bookline {' '.join(args)}` printing a record",
            timeout_s=120,
        )
        assert proc.poll() is None, (tmp_path / f"{args[0]}.err").read_text()
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # the fault handler prints every thread's stack
            proc.wait(timeout=30)
            stacks = (tmp_path / f"{args[0]}.err").read_text()[-6000:]
            raise AssertionError(f"`bookline {' '.join(args)}` ignored SIGINT:\n{stacks}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_exits_130_in_consume_and_stream_read_follow(
    proxy_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Issue 22 (11): SIGINT exited 0 in `consume` (and 130 in `stream read --follow`);
    README's table says 130 for both: they wait for records until interrupted."""
    cluster = proxy_cluster.dir / "cluster.json"
    t = f"sigint-{uuid.uuid4().hex[:8]}"
    assert _cli(cluster, "topic", "create", t, "--partitions", "1").returncode == 0
    assert _cli(cluster, "produce", t, stdin="one\n").returncode == 0
    consume = ("consume", t, "--group", t, "--from", "earliest")
    assert _interrupted_exit_status(cluster, tmp_path, *consume) == 130
    s = f"sigint-{uuid.uuid4().hex[:8]}"
    assert _cli(cluster, "stream", "create", s).returncode == 0
    assert _cli(cluster, "stream", "write", s, stdin="one\n").returncode == 0
    assert _interrupted_exit_status(cluster, tmp_path, "stream", "read", s, "--follow") == 130
