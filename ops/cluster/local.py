"""A local Bookline cluster: ZooKeeper (one server or an ensemble of 3), N bookies,
autorecovery, write and read proxies, each its own OS process.

:class:`LocalCluster` starts and stops the processes and writes ``DIR/cluster.json``
(zk connect string with chroot, root, and the pid, address, state and log of every
process). Ports and bookie ids are chosen once and kept in ``DIR/ports.json`` so a
restart on the same DIR finds its data and cookies again. Stopping keeps
``cluster.json``, marked ``"state": "stopped"``, so the next command says the cluster
was stopped instead of "no such file".

Children can be started again one at a time (:meth:`LocalCluster.respawn`,
non-blocking: :meth:`LocalCluster.is_ready` says when it serves) -- what
``bookline local``'s supervisor (:mod:`ops.cluster.supervisor`) does with a child that died.
Tests and benchmarks use the class directly (3 bookies, no autorecovery by default);
``bookline local`` defaults to settings that survive a lost bookie (see
:mod:`ops.cluster.supervisor`).

The children as data (quorums, placement, one child's entry, ready lines) are
:mod:`ops.cluster.children`; the files kept in DIR (ports, secret, certificates,
cluster.json) :mod:`ops.cluster.files`; this module starts, restarts and stops them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bookie.identity import write_credential
from foundation.auth import SERVICE_PRINCIPAL, TOKEN_ENV, load_secrets, sign_token
from foundation.cluster_file import read_cluster_file
from foundation.errors import ConfigError
from foundation.quorum import check_quorum
from foundation.tls import CertPaths, TlsConfig, build_client_context
from ledger.keys import SECRET_FILE_ENV, read_secret
from metadata.client import DIGEST_FILE_ENV
from metadata.layout import Layout
from metadata.zk import kazoo_digest, kazoo_tls
from ops.cluster import procs
from ops.cluster.auth import ADMIN_TOKEN_LIFETIME_S, LocalAuth, ensure_local_auth
from ops.cluster.children import (
    LOOPBACK,
    READY_MARKERS,
    Placement,
    ProcessInfo,
    Quorums,
    child_environ,
)
from ops.cluster.files import (
    ensure_ledger_secret,
    ensure_local_tls,
    ensure_zk_digest,
    kept_ports,
    make_private_dir,
    mark_stopped,
    now_iso,
    write_cluster_json,
)
from ops.cluster.zk_acl import prepare_chroot
from ops.cluster.zookeeper import QuorumMember, ZooKeeperServer, four_letter_word

if TYPE_CHECKING:
    from kazoo.client import KazooClient

__all__ = [
    "CLUSTER_ROOT",
    "LOCAL_CHROOT",
    "SERVICE_SESSION_TIMEOUT_MS",
    "LocalCluster",
    "Placement",
    "ProcessInfo",
    "Quorums",
    "bench_cluster",
]

log = logging.getLogger(__name__)

# Chroot of a local cluster inside its ZooKeeper; clients get it in cluster.json's `zk`.
LOCAL_CHROOT = "/local"
# The children's token (the services' principal, for the bookies) lasts as long as the
# admin token of ops.cluster.auth; each start signs a new one.
SERVICE_TOKEN_LIFETIME_S = ADMIN_TOKEN_LIFETIME_S
CLUSTER_ROOT = "/bookline"
# A bookie process (Python start + journal replay) is ready within seconds.
BOOKIE_START_TIMEOUT_S = 60.0
# A proxy connects to ZooKeeper and listens: quick, but give a loaded machine room.
PROXY_START_TIMEOUT_S = 60.0
# Proxies' ZooKeeper session: how long a crashed write proxy keeps its streams.
PROXY_SESSION_TIMEOUT_MS = 4_000
# Bookies' and autorecovery's session in a local cluster: a killed bookie leaves the
# registry (and `bookline status` shows it down) this soon.
SERVICE_SESSION_TIMEOUT_MS = 4_000
# ZooKeeper ensemble sizes `--zk-ensemble` accepts (an even size tolerates no more).
ZK_ENSEMBLE_SIZES = (1, 3, 5)


class LocalCluster:
    """Start/stop ZooKeeper + bookies (+ autorecovery, proxies) under one directory."""

    def __init__(
        self,
        directory: Path,
        bookies: int = 3,
        write_proxies: int = 0,
        read_proxies: int = 0,
        proxy_args: dict[str, list[str]] | None = None,
        *,
        autorecovery: bool = False,
        zk_ensemble: int = 1,
        quorums: Quorums | None = None,
        autorecovery_args: Sequence[str] = (),
        service_session_timeout_ms: int | None = None,
        placements: dict[str, Placement] | None = None,
        auth: bool = False,
        tls: bool = False,
        kafka: bool = False,
    ) -> None:
        if zk_ensemble not in ZK_ENSEMBLE_SIZES:
            raise ConfigError(f"--zk-ensemble must be one of {ZK_ENSEMBLE_SIZES}")
        if quorums is not None:
            check_quorum(
                quorums.ensemble_size, quorums.write_quorum, quorums.ack_quorum, "local cluster"
            )
            if quorums.ensemble_size > bookies:
                raise ConfigError(
                    f"--ensemble-size {quorums.ensemble_size} needs at least that many "
                    f"bookies; --bookies is {bookies}"
                )
        self.dir = directory.resolve()
        self.bookie_count = bookies
        self.write_proxy_count = write_proxies
        self.read_proxy_count = read_proxies
        # Extra flags per proxy kind ("writeproxy"/"readproxy"), e.g. fault hooks in tests.
        self.proxy_args = proxy_args or {}
        self.with_autorecovery = autorecovery
        self.autorecovery_args = list(autorecovery_args)
        self.zk_ensemble = zk_ensemble
        self.quorums = quorums
        self.service_session_timeout_ms = service_session_timeout_ms
        # Per child name (e.g. "bookie-2"): where it runs (loopback when absent), and
        # flags added to its command line at its next (re)start (the chaos nemesis).
        self.placements = placements or {}
        self.extra_args: dict[str, list[str]] = {}
        # Proxies require tokens (`bookline local` default; ops.cluster.auth): the
        # credentials are made at start, cluster.json names the admin token file.
        self.with_auth = auth
        self.auth: LocalAuth | None = None
        # The cluster's ledger secret (DIR/auth/ledger.secret) when auth is on.
        self.ledger_secret_file: Path | None = None
        # ZooKeeper digest credentials (DIR/auth/zk.digest) when auth is on: every znode
        # of the cluster admits that user alone (ops/cluster/zk_acl.py).
        self.zk_digest_file: Path | None = None
        # TLS on every hop (`bookline local --tls`): a CA and one certificate for the
        # services under DIR/tls, made at start; cluster.json names the CA.
        self.with_tls = tls
        # Every proxy also a Kafka broker (`bookline local` default; docs/kafka.md):
        # cluster.json's "kafka_bootstrap" lists them.
        self.with_kafka = kafka
        self.tls: TlsConfig | None = None
        self.tls_paths: CertPaths | None = None
        self.zk: ZooKeeperServer | None = None  # the first server (tests use it)
        self.zk_servers: list[ZooKeeperServer] = []
        self.zookeepers: list[ProcessInfo] = []
        self.bookies: list[ProcessInfo] = []
        self.autorecovery: list[ProcessInfo] = []
        self.write_proxies: list[ProcessInfo] = []
        self.read_proxies: list[ProcessInfo] = []

    # -- ports kept across restarts ------------------------------------------------
    def _ports(self) -> dict[str, int]:
        zk_keys = ["zookeeper"]
        if self.zk_ensemble > 1:
            zk_keys += [f"zookeeper-{i}" for i in range(2, self.zk_ensemble + 1)]
            zk_keys += [
                f"zookeeper-{i}-{what}"
                for i in range(1, self.zk_ensemble + 1)
                for what in ("peer", "election")
            ]
        return kept_ports(
            self.dir,
            zk_keys
            + [f"bookie-{i}" for i in range(1, self.bookie_count + 1)]
            + [f"bookie-{i}-metrics" for i in range(1, self.bookie_count + 1)]
            + [f"writeproxy-{i}" for i in range(1, self.write_proxy_count + 1)]
            + [f"readproxy-{i}" for i in range(1, self.read_proxy_count + 1)]
            + [f"{name}-kafka" for name in self._proxy_names() if self.with_kafka]
            + (["autorecovery-1"] if self.with_autorecovery else []),
        )

    def _proxy_names(self) -> list[str]:
        return [f"writeproxy-{i}" for i in range(1, self.write_proxy_count + 1)] + [
            f"readproxy-{i}" for i in range(1, self.read_proxy_count + 1)
        ]

    @property
    def zk_hosts(self) -> str:
        return ",".join(s.connect_string for s in self.zk_servers)

    @property
    def zk_connect(self) -> str:
        assert self.zk is not None
        return self.zk_hosts + LOCAL_CHROOT

    @property
    def process_count(self) -> int:
        """Processes :meth:`start` starts."""
        return (
            self.zk_ensemble
            + self.bookie_count
            + int(self.with_autorecovery)
            + self.write_proxy_count
            + self.read_proxy_count
        )

    def start(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Start every process and wait until each serves; ``on_ready(name)`` after each
        (a progress bar)."""
        ready = on_ready or (lambda _name: None)
        make_private_dir(self.dir)
        ports = self._ports()
        try:
            if self.with_tls:
                self.tls_paths = ensure_local_tls(self.dir, self._tls_hosts())
                self.tls = self.tls_paths.config()
            if self.with_auth:
                self.auth = ensure_local_auth(self.dir)
                self.ledger_secret_file = ensure_ledger_secret(self.dir)
                self.zk_digest_file = ensure_zk_digest(self.dir)
            self._start_zookeeper(ports)
            for info in self.zookeepers:
                ready(info.name)
            digest = self.zk_digest_file
            prepare_chroot(self.zk_hosts, LOCAL_CHROOT, tls=self.tls, digest_file=digest)
            retired = self._retired_bookies(range(1, self.bookie_count + 1))
            for i in range(1, self.bookie_count + 1):
                if i not in retired:
                    self.bookies.append(self._start_bookie(i, ports))
            for info in self.bookies:
                self._wait_ready(info, BOOKIE_START_TIMEOUT_S)
                ready(info.name)
            if self.with_autorecovery:
                self.autorecovery.append(self._start_autorecovery(1, ports))
            for i in range(1, self.write_proxy_count + 1):
                self.write_proxies.append(self._start_proxy("writeproxy", i, ports))
            for i in range(1, self.read_proxy_count + 1):
                self.read_proxies.append(self._start_proxy("readproxy", i, ports))
            for info in self.autorecovery + self.write_proxies + self.read_proxies:
                self._wait_ready(info, PROXY_START_TIMEOUT_S)
                ready(info.name)
            self.write_cluster_json()
        except BaseException:
            self.stop()
            raise

    # -- ZooKeeper -------------------------------------------------------------------
    def _start_zookeeper(self, ports: dict[str, int]) -> None:
        if self.zk_ensemble == 1:
            where = self.placement("zookeeper")
            self.zk_servers = [
                ZooKeeperServer(
                    self.dir / "zookeeper",
                    ports["zookeeper"],
                    where.host,
                    prefix=where.prefix,
                    tls=self.tls,
                )
            ]
        else:
            peers = {
                i: (ports[f"zookeeper-{i}-peer"], ports[f"zookeeper-{i}-election"])
                for i in range(1, self.zk_ensemble + 1)
            }
            hosts = {i: self.placement(f"zookeeper-{i}") for i in range(1, self.zk_ensemble + 1)}
            peer_hosts = {i: where.host for i, where in hosts.items()}
            self.zk_servers = [
                ZooKeeperServer(
                    self.dir / f"zookeeper-{i}",
                    port=ports["zookeeper" if i == 1 else f"zookeeper-{i}"],
                    host=where.host,
                    quorum=QuorumMember(i, peers, peer_hosts),
                    prefix=where.prefix,
                    tls=self.tls,
                )
                for i, where in hosts.items()
            ]
        self.zk = self.zk_servers[0]
        for server in self.zk_servers:
            server.start(wait=False)
        for server in self.zk_servers:
            server.wait_ready()
        self.zookeepers = [self._zk_info(i, s) for i, s in enumerate(self.zk_servers, 1)]

    def _zk_info(self, index: int, server: ZooKeeperServer) -> ProcessInfo:
        assert server.proc is not None
        name = "zookeeper" if self.zk_ensemble == 1 else f"zookeeper-{index}"
        return ProcessInfo(
            name, server.proc, server.connect_string, {"log": str(server.log_path)}, "zookeeper"
        )

    def _retired_bookies(self, indexes: Iterable[int]) -> set[int]:
        """Bookies of ours that were retired (`bookline bookie retire`): their
        directories hold a cookie, ZooKeeper none. Never started again; their ports stay
        reserved in ports.json, so a later bookie never takes over their ids."""
        joined = [i for i in indexes if (self.dir / f"bookie-{i}" / "journal" / "COOKIE").exists()]
        if not joined:
            return set()
        layout = Layout(CLUSTER_ROOT)
        client = self._kazoo()
        try:
            gone = {i for i in joined if client.exists(layout.cookie(f"bookie-{i}")) is None}
        finally:
            client.stop()
            client.close()
        for i in sorted(gone):
            log.info("bookie-%d was retired: not started", i)
        return gone

    def forget_retired(self) -> bool:
        """Drop bookies that are down and were retired from the children (cluster.json
        lists them no more, the supervisor never restarts them); True when one was."""
        down = {int(b.name.rsplit("-", 1)[1]): b for b in self.bookies if b.state == "down"}
        retired = self._retired_bookies(down) if down else set()
        for i in retired:
            self.bookies.remove(down[i])
        return bool(retired)

    def _kazoo(self) -> KazooClient:
        """A short-lived ZooKeeper client inside the local chroot."""
        from kazoo.client import KazooClient

        digest = kazoo_digest(str(self.zk_digest_file)) if self.zk_digest_file else {}
        client = KazooClient(hosts=self.zk_connect, timeout=10, **kazoo_tls(self.tls), **digest)
        client.start(timeout=15)
        return client

    # -- bookies, autorecovery, proxies ----------------------------------------------
    def placement(self, name: str) -> Placement:
        return self.placements.get(name, LOOPBACK)

    def _spawn(self, name: str, kind: str, argv: list[str], log_path: Path) -> ProcessInfo:
        where = self.placement(name)
        host_args = ["--host", where.host] if name in self.placements else []
        argv = [*where.prefix, *argv, *host_args, *self.extra_args.get(name, [])]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Remember where this start's output begins, to look for its ready line.
        offset = log_path.stat().st_size if log_path.exists() else 0
        env = {
            **child_environ(os.environ),
            **self._credentials_env(),
            **self._zk_digest_env(),
            **self._tls_env(),
        }
        proc = procs.spawn(argv, log_path=log_path, env=env, cwd=Path.cwd())
        info = ProcessInfo(name, proc, "", {"log": str(log_path), "_log_offset": offset}, kind)
        info.state = "starting"
        return info

    def _credentials_env(self) -> dict[str, str]:
        """With auth on, every child presents a token of the services' principal to the
        bookies (which want one: :meth:`_bookie_auth_args`) and derives ledger keys from
        the cluster's ledger secret (ledger/keys.py)."""
        if self.auth is None or self.ledger_secret_file is None:
            return {}
        secret = load_secrets(str(self.auth.secret_file))[0]
        expires = time.time() + SERVICE_TOKEN_LIFETIME_S
        return {
            TOKEN_ENV: sign_token(secret, SERVICE_PRINCIPAL, expires),
            SECRET_FILE_ENV: str(self.ledger_secret_file),
        }

    def _zk_digest_env(self) -> dict[str, str]:
        """Every child authenticates to ZooKeeper with the cluster's digest credentials
        (metadata/client.py reads the variable)."""
        return {} if self.zk_digest_file is None else {DIGEST_FILE_ENV: str(self.zk_digest_file)}

    def _tls_hosts(self) -> list[str]:
        """What clients dial: loopback and every placement's address (certificate SANs)."""
        hosts = {"localhost", "127.0.0.1", *(p.host for p in self.placements.values())}
        return sorted(hosts)

    def _tls_env(self) -> dict[str, str]:
        """With TLS on, every child serves and dials TLS with the services' certificate."""
        return {} if self.tls_paths is None else self.tls_paths.environ()

    def _bookie_auth_args(self) -> list[str]:
        """A bookie's (and autorecovery's, for its /health and /metrics) flags turning
        authentication on with the cluster's secret."""
        if self.auth is None:
            return []
        return [
            "--auth-enabled", "true",
            "--auth-secret-file", str(self.auth.secret_file),
            "--auth-grants-file", str(self.auth.grants_file),
        ]  # fmt: skip

    def _bookie_identity_args(self, name: str, base: Path) -> list[str]:
        """With a ledger secret, the bookie's credential (bookie/identity.py), issued
        anew at each start: clients holding the secret talk to no other bookie."""
        if self.ledger_secret_file is None:
            return []
        path = base / "identity"
        base.mkdir(parents=True, exist_ok=True)
        write_credential(str(path), read_secret(str(self.ledger_secret_file)).split(b"\n")[0], name)
        return ["--identity-file", str(path)]

    def _session_args(self) -> list[str]:
        ms = self.service_session_timeout_ms
        return [] if ms is None else ["--session-timeout-ms", str(ms)]

    def _start_bookie(self, index: int, ports: dict[str, int]) -> ProcessInfo:
        name = f"bookie-{index}"
        base = self.dir / name
        port = ports[name]
        metrics_port = ports[f"{name}-metrics"]
        argv = [
            sys.executable, "-m", "ops.cli", "bookie",
            "--bookie-id", name, "--port", str(port), "--metrics-port", str(metrics_port),
            "--zk", self.zk_connect, "--root", CLUSTER_ROOT,
            "--journal-dir", str(base / "journal"), "--ledgers-dir", str(base / "ledgers"),
            "--index-dir", str(base / "index"), *self._session_args(),
            *self._bookie_auth_args(), *self._bookie_identity_args(name, base),
        ]  # fmt: skip
        info = self._spawn(name, "bookie", argv, base / "bookie.log")
        host = self.placement(name).host
        info.address = f"{host}:{port}"
        info.extra["metrics"] = f"http://{host}:{metrics_port}/metrics"
        return info

    def _start_autorecovery(self, index: int, ports: dict[str, int]) -> ProcessInfo:
        name = f"autorecovery-{index}"
        port = ports[name]  # its /metrics and /health
        argv = [
            sys.executable, "-m", "ops.cli", "autorecovery",
            "--zk", self.zk_connect, "--root", CLUSTER_ROOT, *self._session_args(),
            "--http-port", str(port), "--id", name, *self._bookie_auth_args(),
            *self.autorecovery_args,
        ]  # fmt: skip
        info = self._spawn(name, "autorecovery", argv, self.dir / name / "autorecovery.log")
        info.address = f"{self.placement(name).host}:{port}"
        url = f"http://{info.address}"
        info.extra.update(url=url, metrics=f"{url}/metrics")
        return info

    def _start_proxy(self, kind: str, index: int, ports: dict[str, int]) -> ProcessInfo:
        """Start write/read proxy ``index`` (``kind`` is the CLI command)."""
        name = f"{kind}-{index}"  # also its proxy id: one id per process in every view
        port = ports[name]
        quorum_args = self.quorums.args() if self.quorums and kind == "writeproxy" else []
        argv = [
            sys.executable, "-m", "ops.cli", kind,
            "--proxy-id", name, "--port", str(port),
            "--zk", self.zk_connect, "--root", CLUSTER_ROOT,
            "--session-timeout-ms", str(PROXY_SESSION_TIMEOUT_MS),
            *quorum_args, *(self.auth.proxy_args() if self.auth else []),
            *self._kafka_args(name, ports),
            *self.proxy_args.get(kind, []),
        ]  # fmt: skip
        info = self._spawn(name, kind, argv, self.dir / name / f"{kind}.log")
        info.address = f"{self.placement(name).host}:{port}"
        url = f"{'https' if self.tls else 'http'}://{info.address}"
        info.extra.update(url=url, metrics=f"{url}/metrics")
        if self.with_kafka:
            info.extra["kafka"] = f"{self.placement(name).host}:{ports[f'{name}-kafka']}"
        return info

    def _kafka_args(self, name: str, ports: dict[str, int]) -> list[str]:
        if not self.with_kafka:
            return []
        host = self.placement(name).host
        port = str(ports[f"{name}-kafka"])
        return ["--kafka-enabled", "true", "--kafka-host", host, "--kafka-port", port]

    def kafka_bootstrap(self) -> str:
        """The proxies' Kafka listeners, ``host:port,...`` ("" without them)."""
        proxies = self.write_proxies + self.read_proxies
        return ",".join(str(p.extra["kafka"]) for p in proxies if "kafka" in p.extra)

    # -- children, one at a time (the supervisor) -------------------------------------
    def children(self) -> list[ProcessInfo]:
        """Every child, in start order."""
        return [
            *self.zookeepers,
            *self.bookies,
            *self.autorecovery,
            *self.write_proxies,
            *self.read_proxies,
        ]

    def _group_of(self, info: ProcessInfo) -> list[ProcessInfo]:
        return {
            "zookeeper": self.zookeepers,
            "bookie": self.bookies,
            "autorecovery": self.autorecovery,
            "writeproxy": self.write_proxies,
            "readproxy": self.read_proxies,
        }[info.kind]

    def respawn(self, info: ProcessInfo) -> ProcessInfo:
        """Start the child ``info`` describes again (same id, ports and directories);
        returns the new entry, which replaces ``info`` and is ``starting`` until
        :meth:`is_ready`. Does not wait."""
        index = int(info.name.rsplit("-", 1)[1]) if "-" in info.name else 1
        if info.kind == "zookeeper":
            server = self.zk_servers[index - 1]
            server.start(wait=False)
            fresh = self._zk_info(index, server)
            fresh.state = "starting"
        elif info.kind == "bookie":
            fresh = self._start_bookie(index, self._ports())
        elif info.kind == "autorecovery":
            fresh = self._start_autorecovery(index, self._ports())
        else:
            fresh = self._start_proxy(info.kind, index, self._ports())
        fresh.restarts = info.restarts + 1
        fresh.exit_status, fresh.exited_at = info.exit_status, info.exited_at
        group = self._group_of(info)
        group[group.index(info)] = fresh
        return fresh

    def is_ready(self, info: ProcessInfo) -> bool:
        """True once the child serves (ZooKeeper: ``srvr`` reports a mode; the others:
        their ready line in the log after this start's offset)."""
        if info.kind == "zookeeper":
            host, port = info.address.rsplit(":", 1)
            context = None if self.tls is None else build_client_context(self.tls)
            answer = four_letter_word(host, int(port), "srvr", timeout_s=0.5, ssl_context=context)
            return "Mode:" in answer
        log_path = Path(info.extra["log"])
        with contextlib.suppress(OSError), open(log_path, "rb") as fh:
            fh.seek(int(info.extra.get("_log_offset", 0)))
            return READY_MARKERS[info.kind] in fh.read()
        return False

    def note_exit(self, info: ProcessInfo) -> None:
        """Record that ``info``'s process has exited (its status, when)."""
        info.state = "down"
        info.exit_status = info.proc.returncode
        info.exited_at = now_iso()

    def restart_proxy(self, info: ProcessInfo) -> ProcessInfo:
        """Start a stopped/killed proxy again on its port and wait for it (tests)."""
        fresh = self.respawn(info)
        fresh.restarts = info.restarts  # a test's restart, not a crash's
        self._wait_ready(fresh, PROXY_START_TIMEOUT_S)
        self.write_cluster_json()
        return fresh

    def _wait_ready(self, info: ProcessInfo, timeout_s: float) -> None:
        log_path = Path(info.extra["log"])
        offset = int(info.extra.get("_log_offset", 0))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if info.proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[offset:][-3000:]
                raise RuntimeError(
                    f"{info.name} exited with code {info.proc.returncode} at start:\n{tail}"
                )
            if self.is_ready(info):
                info.state = "running"
                return
            time.sleep(0.1)
        raise RuntimeError(f"{info.name} not ready within {timeout_s:.0f}s; see {log_path}")

    # -- cluster.json ------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        assert self.zk is not None
        assert self.zk.pid is not None
        out: dict[str, Any] = {
            "zk": self.zk_connect,
            "root": CLUSTER_ROOT,
            "state": "running",
            "pid": os.getpid(),  # of the process that started (and supervises) it
            "zookeeper": {"pid": self.zk.pid, "address": self.zk.connect_string},
            "zookeepers": [z.to_json() for z in self.zookeepers],
            "bookies": [b.to_json() for b in self.bookies],
            "autorecovery": [a.to_json() for a in self.autorecovery],
            "write_proxies": [p.to_json() for p in self.write_proxies],
            "read_proxies": [p.to_json() for p in self.read_proxies],
            "dir": str(self.dir),
        }
        if self.with_kafka:  # Kafka clients' bootstrap.servers (docs/kafka.md)
            out["kafka_bootstrap"] = self.kafka_bootstrap()
        if self.read_proxies:  # README: the dashboard's URL is in cluster.json
            out["dashboard"] = f"{self.read_proxies[0].extra['url']}/dashboard"
        if self.auth is not None:  # the token's file (relative to this one), never the secret
            out["token_file"] = str(self.auth.token_file.relative_to(self.dir))
        if self.ledger_secret_file is not None:  # its name: the file is the owner's only
            out["ledger_secret_file"] = str(self.ledger_secret_file.relative_to(self.dir))
        if self.zk_digest_file is not None:  # its name; clients of ZooKeeper need it
            out["zk_digest_file"] = str(self.zk_digest_file.relative_to(self.dir))
        if self.tls is not None:  # clients verify the services against this CA
            out["tls"] = {"ca_file": self.tls.ca_file}
        if self.quorums is not None:
            out["quorums"] = {
                "ensemble_size": self.quorums.ensemble_size,
                "write_quorum": self.quorums.write_quorum,
                "ack_quorum": self.quorums.ack_quorum,
            }
        return out

    def write_cluster_json(self, doc: dict[str, Any] | None = None) -> Path:
        return write_cluster_json(self.dir, doc or self.describe())

    def stop(self) -> None:
        for info in reversed(self.read_proxies + self.write_proxies + self.autorecovery):
            procs.stop(info.proc)
        self.read_proxies.clear()
        self.write_proxies.clear()
        self.autorecovery.clear()
        for info in reversed(self.bookies):
            procs.stop(info.proc)
        self.bookies.clear()
        for server in reversed(self.zk_servers):
            server.stop()
        self.zk_servers.clear()
        self.zookeepers.clear()
        self.zk = None
        mark_stopped(self.dir)


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
