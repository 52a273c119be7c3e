"""The replicated KV example (streams/rsm.py): three node processes on one stream; the
leader is kill -9'd during a stream of commands; another node takes over; every
acknowledged command is applied exactly once, in order, on every replica."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.cluster import procs
from tests.conftest import BookieCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = 300
KILL_AFTER = 100


class Node:
    def __init__(self, node_id: str, cluster_file: Path, directory: Path) -> None:
        self.node_id = node_id
        self.port = procs.free_port()
        argv = [sys.executable, "-m", "streams.rsm", "--cluster", str(cluster_file),
                "--namespace", "rsm", "--stream", "kv", "--node-id", node_id,
                "--port", str(self.port), "--dir", str(directory),
                "--snapshot-every", "50"]  # fmt: skip
        self.log = directory / f"{node_id}.log"
        self.proc = procs.spawn(argv, log_path=self.log, cwd=ROOT)

    def call(self, line: str, timeout_s: float = 30.0) -> str:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as s:
            s.sendall(line.encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            return buf.decode().strip()

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            return b"READY" in (self.log.read_bytes() if self.log.exists() else b"")

        wait_until(ready, f"node {self.node_id} ready", timeout_s=60, interval_s=0.1)


@pytest.fixture
def nodes(bookie_cluster: BookieCluster, tmp_path: Path) -> Iterator[list[Node]]:
    cluster_file = bookie_cluster.cluster_file()
    started: list[Node] = []
    try:
        for i in range(3):
            started.append(Node(f"n{i}", cluster_file, tmp_path))
        for n in started:
            n.wait_ready()
        yield started
    finally:
        for n in started:
            procs.stop(n.proc, grace_s=5.0)


def put(nodes: list[Node], seq: int, alive: set[str]) -> str:
    """Send command ``seq`` until a leader acknowledges it (retries keep (client, seq))."""
    by_id = {n.node_id: n for n in nodes}
    target = next(n for n in nodes if n.node_id in alive)

    def acknowledged() -> str | None:  # one turn: send, then follow a redirect or move on
        nonlocal target
        try:
            answer = target.call(f"PUT c1 {seq} k{seq % 17} v{seq}")
        except OSError:
            answer = "ERR unreachable"
        if answer.startswith("OK "):
            return answer
        owner = answer.split()[1] if answer.startswith("REDIRECT ") else "-"
        if owner in alive:
            target = by_id[owner]
        else:  # no leader yet (takeover in progress) or it died: try the others in turn
            candidates = [n for n in nodes if n.node_id in alive]
            target = candidates[(candidates.index(target) + 1) % len(candidates)
                                if target in candidates else 0]  # fmt: skip
        return None

    return wait_until(acknowledged, f"a leader to acknowledge command {seq}",
                      timeout_s=60, interval_s=0.1)  # fmt: skip


def applied(directory: Path, node_id: str) -> list[tuple[str, int]]:
    lines = (directory / f"{node_id}.applied").read_text().splitlines()
    return [(x.split()[0], int(x.split()[1])) for x in lines]


def test_leader_killed_another_takes_over_exactly_once_in_order(
    nodes: list[Node], tmp_path: Path
) -> None:
    alive = {n.node_id for n in nodes}
    killed: Node | None = None
    for seq in range(COMMANDS):
        put(nodes, seq, alive)
        if seq == KILL_AFTER:
            leader = next(n for n in nodes if '"leader": true' in n.call("STATE"))
            os.kill(leader.proc.pid, signal.SIGKILL)
            leader.proc.wait(10)
            alive.discard(leader.node_id)
            killed = leader
    assert killed is not None
    survivors = [n for n in nodes if n.node_id in alive]
    assert any('"leader": true' in n.call("STATE") for n in survivors)
    want = [("c1", s) for s in range(COMMANDS)]

    def caught_up() -> bool:
        for n in survivors:
            assert n.proc.poll() is None, f"{n.node_id} exited:\n{n.log.read_text()[-3000:]}"
        return all(applied(tmp_path, n.node_id) == want for n in survivors)

    def behind() -> str:
        return "every survivor to apply each command once, in order: " + "; ".join(
            f"{n.node_id} applied {len(applied(tmp_path, n.node_id))} of {len(want)}:\n"
            f"{n.log.read_text()[-3000:]}" for n in survivors
        )  # fmt: skip

    wait_until(caught_up, behind, timeout_s=30, interval_s=0.2)
    for n in survivors:
        log_tail = n.log.read_text()[-3000:]
        assert n.proc.poll() is None, f"{n.node_id} exited:\n{log_tail}"
        assert applied(tmp_path, n.node_id) == want, f"{n.node_id}:\n{log_tail}"  # exactly once
        assert n.call("GET k5") == f"VALUE v{max(s for s in range(COMMANDS) if s % 17 == 5)}"
    dead = applied(tmp_path, killed.node_id)
    assert dead == want[: len(dead)]  # the killed replica saw a prefix
    snapshots = list(tmp_path.glob("*.snapshot.json"))
    assert snapshots, "nodes take snapshots"


async def test_a_node_started_before_its_stream_exists_leads_once_it_does(
    bookie_cluster: BookieCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nodes start together and each creates the stream; one may look for it while
    another is still creating it. Seen in a full run: that node's leader task died with
    NOT_FOUND and the node exited. It waits for the stream instead."""
    import asyncio
    import contextlib
    import logging

    from streams.namespace import Namespace
    from streams.rsm import KVNode
    from tests.waiting import wait_for

    caplog.set_level(logging.INFO, logger="streams.rsm")
    ns = await Namespace.from_cluster_file(bookie_cluster.cluster_file(), "rsm-late")
    node = KVNode(ns, "kv", "n0", tmp_path, 50)
    try:
        await node.start()
        await wait_for(lambda: "reading the log failed" in caplog.text, "a node, no stream")
        await ns.create_stream("kv")
        await wait_for(lambda: node.writer is not None, "the node leading", timeout_s=60.0)
    finally:
        for task in node._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await ns.close()
