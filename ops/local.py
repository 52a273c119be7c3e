"""A local Bookline cluster: ZooKeeper and N bookies, each its own OS process.

``bookline local --dir DIR`` runs it in the foreground until Ctrl-C; once ready it
writes ``DIR/cluster.json`` (zk connect string with chroot, root, and the pid and
address of every process). Ports and bookie ids are chosen once and kept in
``DIR/ports.json`` so a restart on the same DIR finds its data and cookies again.
``bookline demo`` starts the same cluster, shows what it holds, writes and reads a
little through the layers that exist, and stops it again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import procs
from ops.zookeeper import ZooKeeperServer

log = logging.getLogger(__name__)

# Chroot of a local cluster inside its ZooKeeper; clients get it in cluster.json's `zk`.
LOCAL_CHROOT = "/local"
CLUSTER_ROOT = "/bookline"
# A bookie process (Python start + journal replay) is ready within seconds.
BOOKIE_START_TIMEOUT_S = 60.0


@dataclass
class ProcessInfo:
    name: str
    proc: subprocess.Popen[bytes]
    address: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.name, "pid": self.proc.pid, "address": self.address, **self.extra}


class LocalCluster:
    """Start/stop ZooKeeper + bookies under one directory."""

    def __init__(self, directory: Path, bookies: int = 3) -> None:
        self.dir = directory.resolve()
        self.bookie_count = bookies
        self.zk: ZooKeeperServer | None = None
        self.bookies: list[ProcessInfo] = []

    # -- ports kept across restarts ------------------------------------------------
    def _ports(self) -> dict[str, int]:
        path = self.dir / "ports.json"
        ports: dict[str, int] = {}
        if path.exists():
            ports = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        for key in ["zookeeper"] + [f"bookie-{i}" for i in range(1, self.bookie_count + 1)] + [
            f"bookie-{i}-metrics" for i in range(1, self.bookie_count + 1)
        ]:
            if key not in ports:
                ports[key] = procs.free_port()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ports, indent=2))
        os.replace(tmp, path)
        return ports

    @property
    def zk_connect(self) -> str:
        assert self.zk is not None
        return self.zk.connect_string + LOCAL_CHROOT

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ports = self._ports()
        try:
            self.zk = ZooKeeperServer(self.dir / "zookeeper", port=ports["zookeeper"]).start()
            self._ensure_chroot()
            for i in range(1, self.bookie_count + 1):
                self.bookies.append(self._start_bookie(i, ports))
            for info in self.bookies:
                self._wait_bookie_ready(info)
            self.write_cluster_json()
        except BaseException:
            self.stop()
            raise

    def _ensure_chroot(self) -> None:
        from kazoo.client import KazooClient

        assert self.zk is not None
        client = KazooClient(hosts=self.zk.connect_string, timeout=10)
        client.start(timeout=15)
        try:
            client.ensure_path(LOCAL_CHROOT)
        finally:
            client.stop()
            client.close()

    def _start_bookie(self, index: int, ports: dict[str, int]) -> ProcessInfo:
        name = f"bookie-{index}"
        base = self.dir / name
        port = ports[name]
        metrics_port = ports[f"{name}-metrics"]
        argv = [
            sys.executable, "-m", "ops.cli", "bookie",
            "--bookie-id", name,
            "--port", str(port),
            "--metrics-port", str(metrics_port),
            "--zk", self.zk_connect,
            "--root", CLUSTER_ROOT,
            "--journal-dir", str(base / "journal"),
            "--ledgers-dir", str(base / "ledgers"),
            "--index-dir", str(base / "index"),
        ]
        log_path = base / "bookie.log"
        base.mkdir(parents=True, exist_ok=True)
        # Remember where this start's output begins, to look for its ready line.
        offset = log_path.stat().st_size if log_path.exists() else 0
        proc = procs.spawn(argv, log_path=log_path, env=dict(os.environ), cwd=Path.cwd())
        return ProcessInfo(
            name, proc, f"127.0.0.1:{port}",
            {"metrics": f"http://127.0.0.1:{metrics_port}/metrics", "log": str(log_path),
             "_log_offset": offset},
        )

    def _wait_bookie_ready(self, info: ProcessInfo) -> None:
        log_path = Path(info.extra["log"])
        offset = int(info.extra.pop("_log_offset"))
        deadline = time.monotonic() + BOOKIE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if info.proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[offset:][-3000:]
                raise RuntimeError(
                    f"{info.name} exited with code {info.proc.returncode} at start:\n{tail}"
                )
            with contextlib.suppress(OSError), open(log_path, "rb") as fh:
                fh.seek(offset)
                if b"bookie ready" in fh.read():
                    return
            time.sleep(0.1)
        raise RuntimeError(
            f"{info.name} not ready within {BOOKIE_START_TIMEOUT_S:.0f}s; see {log_path}"
        )

    def describe(self) -> dict[str, Any]:
        assert self.zk is not None and self.zk.pid is not None
        return {
            "zk": self.zk_connect,
            "root": CLUSTER_ROOT,
            "zookeeper": {"pid": self.zk.pid, "address": self.zk.connect_string},
            "bookies": [b.to_json() for b in self.bookies],
            "write_proxies": [],
            "read_proxies": [],
            "dir": str(self.dir),
        }

    def write_cluster_json(self) -> Path:
        path = self.dir / "cluster.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    def stop(self) -> None:
        for info in reversed(self.bookies):
            procs.stop(info.proc)
        self.bookies.clear()
        if self.zk is not None:
            self.zk.stop()
            self.zk = None
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "cluster.json").unlink()


def _wait_for_interrupt() -> None:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        pass


def run_local(args: argparse.Namespace) -> int:
    cluster = LocalCluster(Path(args.dir), bookies=int(getattr(args, "bookies", 3)))
    cluster.start()
    try:
        print(json.dumps(cluster.describe(), indent=2), flush=True)
        print(f"local cluster ready; cluster file {cluster.dir / 'cluster.json'}; Ctrl-C stops it",
              flush=True)
        _wait_for_interrupt()
    finally:
        cluster.stop()
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from ops import demo

    cluster = LocalCluster(Path(args.dir), bookies=int(getattr(args, "bookies", 3)))
    cluster.start()
    try:
        demo.show(cluster.describe())
        if getattr(args, "keep_running", False):
            print("cluster stays up; Ctrl-C stops it", flush=True)
            _wait_for_interrupt()
    finally:
        cluster.stop()
    return 0
