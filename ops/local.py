"""A local Bookline cluster: ZooKeeper, N bookies, write and read proxies, each its own
OS process.

``bookline local --dir DIR [--bookies 3] [--write-proxies 1] [--read-proxies 1]`` runs
it in the foreground until Ctrl-C; once ready it writes ``DIR/cluster.json`` (zk
connect string with chroot, root, and the pid and address/URL of every process). Ports
and bookie ids are chosen once and kept in ``DIR/ports.json`` so a restart on the same
DIR finds its data and cookies again.
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
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundation.cluster_file import read_cluster_file
from ops import procs
from ops.zookeeper import ZooKeeperServer

log = logging.getLogger(__name__)

# Chroot of a local cluster inside its ZooKeeper; clients get it in cluster.json's `zk`.
LOCAL_CHROOT = "/local"
CLUSTER_ROOT = "/bookline"
# A bookie process (Python start + journal replay) is ready within seconds.
BOOKIE_START_TIMEOUT_S = 60.0
# A proxy connects to ZooKeeper and listens: quick, but give a loaded machine room.
PROXY_START_TIMEOUT_S = 60.0
# Proxies' ZooKeeper session: how long a crashed write proxy keeps its streams.
PROXY_SESSION_TIMEOUT_MS = 4_000


@dataclass
class ProcessInfo:
    name: str
    proc: subprocess.Popen[bytes]
    address: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.name, "pid": self.proc.pid, "address": self.address, **self.extra}


class LocalCluster:
    """Start/stop ZooKeeper + bookies (+ proxies) under one directory."""

    def __init__(
        self,
        directory: Path,
        bookies: int = 3,
        write_proxies: int = 0,
        read_proxies: int = 0,
        proxy_args: dict[str, list[str]] | None = None,
    ) -> None:
        self.dir = directory.resolve()
        self.bookie_count = bookies
        self.write_proxy_count = write_proxies
        self.read_proxy_count = read_proxies
        # Extra flags per proxy kind ("writeproxy"/"readproxy"), e.g. fault hooks in tests.
        self.proxy_args = proxy_args or {}
        self.zk: ZooKeeperServer | None = None
        self.bookies: list[ProcessInfo] = []
        self.write_proxies: list[ProcessInfo] = []
        self.read_proxies: list[ProcessInfo] = []

    # -- ports kept across restarts ------------------------------------------------
    def _ports(self) -> dict[str, int]:
        path = self.dir / "ports.json"
        ports: dict[str, int] = {}
        if path.exists():
            ports = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        for key in (
            ["zookeeper"]
            + [f"bookie-{i}" for i in range(1, self.bookie_count + 1)]
            + [f"bookie-{i}-metrics" for i in range(1, self.bookie_count + 1)]
            + [f"writeproxy-{i}" for i in range(1, self.write_proxy_count + 1)]
            + [f"readproxy-{i}" for i in range(1, self.read_proxy_count + 1)]
        ):
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
            for i in range(1, self.write_proxy_count + 1):
                self.write_proxies.append(self._start_proxy("writeproxy", i, ports))
            for i in range(1, self.read_proxy_count + 1):
                self.read_proxies.append(self._start_proxy("readproxy", i, ports))
            for info in self.write_proxies + self.read_proxies:
                self._wait_ready(info, b"ready id=", PROXY_START_TIMEOUT_S)
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
            sys.executable,
            "-m",
            "ops.cli",
            "bookie",
            "--bookie-id",
            name,
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--zk",
            self.zk_connect,
            "--root",
            CLUSTER_ROOT,
            "--journal-dir",
            str(base / "journal"),
            "--ledgers-dir",
            str(base / "ledgers"),
            "--index-dir",
            str(base / "index"),
        ]
        log_path = base / "bookie.log"
        base.mkdir(parents=True, exist_ok=True)
        # Remember where this start's output begins, to look for its ready line.
        offset = log_path.stat().st_size if log_path.exists() else 0
        proc = procs.spawn(argv, log_path=log_path, env=dict(os.environ), cwd=Path.cwd())
        return ProcessInfo(
            name,
            proc,
            f"127.0.0.1:{port}",
            {
                "metrics": f"http://127.0.0.1:{metrics_port}/metrics",
                "log": str(log_path),
                "_log_offset": offset,
            },
        )

    def _start_proxy(self, kind: str, index: int, ports: dict[str, int]) -> ProcessInfo:
        """Start write/read proxy ``index`` (``kind`` is the CLI command)."""
        name = f"{kind}-{index}"
        short = "wp" if kind == "writeproxy" else "rp"
        port = ports[name]
        argv = [
            sys.executable,
            "-m",
            "ops.cli",
            kind,
            "--proxy-id",
            f"{short}-{index}",
            "--port",
            str(port),
            "--zk",
            self.zk_connect,
            "--root",
            CLUSTER_ROOT,
            "--session-timeout-ms",
            str(PROXY_SESSION_TIMEOUT_MS),
            *self.proxy_args.get(kind, []),
        ]
        log_path = self.dir / name / f"{kind}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = log_path.stat().st_size if log_path.exists() else 0
        proc = procs.spawn(argv, log_path=log_path, env=dict(os.environ), cwd=Path.cwd())
        url = f"http://127.0.0.1:{port}"
        return ProcessInfo(
            name,
            proc,
            f"127.0.0.1:{port}",
            {"url": url, "metrics": f"{url}/metrics", "log": str(log_path), "_log_offset": offset},
        )

    def restart_proxy(self, info: ProcessInfo) -> ProcessInfo:
        """Start a stopped/killed proxy again on its port (tests)."""
        kind, index = info.name.rsplit("-", 1)
        fresh = self._start_proxy(kind, int(index), self._ports())
        self._wait_ready(fresh, b"ready id=", PROXY_START_TIMEOUT_S)
        group = self.write_proxies if kind == "writeproxy" else self.read_proxies
        group[group.index(info)] = fresh
        self.write_cluster_json()
        return fresh

    def _wait_bookie_ready(self, info: ProcessInfo) -> None:
        self._wait_ready(info, b"bookie ready", BOOKIE_START_TIMEOUT_S)

    def _wait_ready(self, info: ProcessInfo, marker: bytes, timeout_s: float) -> None:
        log_path = Path(info.extra["log"])
        offset = int(info.extra.pop("_log_offset"))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if info.proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[offset:][-3000:]
                raise RuntimeError(
                    f"{info.name} exited with code {info.proc.returncode} at start:\n{tail}"
                )
            with contextlib.suppress(OSError), open(log_path, "rb") as fh:
                fh.seek(offset)
                if marker in fh.read():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{info.name} not ready within {timeout_s:.0f}s; see {log_path}")

    def describe(self) -> dict[str, Any]:
        assert self.zk is not None
        assert self.zk.pid is not None
        return {
            "zk": self.zk_connect,
            "root": CLUSTER_ROOT,
            "zookeeper": {"pid": self.zk.pid, "address": self.zk.connect_string},
            "bookies": [b.to_json() for b in self.bookies],
            "write_proxies": [p.to_json() for p in self.write_proxies],
            "read_proxies": [p.to_json() for p in self.read_proxies],
            "dir": str(self.dir),
        }

    def write_cluster_json(self) -> Path:
        path = self.dir / "cluster.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    def stop(self) -> None:
        for info in reversed(self.read_proxies + self.write_proxies):
            procs.stop(info.proc)
        self.read_proxies.clear()
        self.write_proxies.clear()
        for info in reversed(self.bookies):
            procs.stop(info.proc)
        self.bookies.clear()
        if self.zk is not None:
            self.zk.stop()
            self.zk = None
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "cluster.json").unlink()


@contextlib.contextmanager
def bench_cluster(
    args: argparse.Namespace, bookies: int = 3, prefix: str = "bl-bench-"
) -> Iterator[dict[str, Any]]:
    """The layout (as in ``cluster.json``) of the cluster a benchmark uses: the running
    one ``args.cluster`` names, or ZooKeeper + ``bookies`` started in ``args.dir``
    (default a temporary directory named ``prefix...``) and stopped afterwards."""
    if args.cluster:
        yield read_cluster_file(args.cluster).raw
        return
    with contextlib.ExitStack() as stack:
        base = args.dir or stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix))
        cluster = LocalCluster(Path(base), bookies=bookies)
        cluster.start()
        stack.callback(cluster.stop)
        yield cluster.describe()


def _wait_for_interrupt() -> None:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        pass


def _cluster_from_args(args: argparse.Namespace) -> LocalCluster:
    return LocalCluster(
        Path(args.dir),
        bookies=int(getattr(args, "bookies", 3)),
        write_proxies=int(getattr(args, "write_proxies", 1)),
        read_proxies=int(getattr(args, "read_proxies", 1)),
    )


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bookies", type=int, default=3, help="bookie processes (default 3)")
    parser.add_argument("--write-proxies", type=int, default=1, help="write proxies (default 1)")
    parser.add_argument("--read-proxies", type=int, default=1, help="read proxies (default 1)")


def run_local(args: argparse.Namespace) -> int:
    cluster = _cluster_from_args(args)
    cluster.start()
    try:
        print(json.dumps(cluster.describe(), indent=2), flush=True)
        print(
            f"local cluster ready; cluster file {cluster.dir / 'cluster.json'}; Ctrl-C stops it",
            flush=True,
        )
        _wait_for_interrupt()
    finally:
        cluster.stop()
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from ops import demo

    cluster = _cluster_from_args(args)
    cluster.start()
    try:
        demo.show(cluster.describe())
        demo.write_and_read(cluster.dir / "cluster.json")
        if getattr(args, "keep_running", False):
            print("cluster stays up; Ctrl-C stops it", flush=True)
            _wait_for_interrupt()
    finally:
        cluster.stop()
    return 0
