"""Launch a real standalone ZooKeeper server from Debian's ``zookeeper`` package.

The server runs as a child JVM (``ZooKeeperServerMain``) with its own config, data
directory and log file under ``data_dir``, listening on a loopback port; or, as a member
of an ensemble (``quorum=``), ``QuorumPeerMain`` with its peers in ``zoo.cfg``
(``bookline local --zk-ensemble 3``: the metadata store survives a lost server). Its own
log (SLF4J through slf4j-simple) goes to ``zookeeper.log``. ``start()``
returns once the server answers ``ruok`` with ``imok`` and ``srvr`` with its mode
(serving requests, not just listening); ``stop()``
terminates it by pid (SIGTERM, then SIGKILL). Nothing here fakes ZooKeeper.

With ``tls=`` the server takes clients only over TLS (``secureClientPort`` through
Netty, PEM key and trust stores; ``ssl.clientAuth=need`` for mutual TLS), and the
readiness check speaks TLS too. Traffic between an ensemble's members stays plain.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from foundation.tls import TlsConfig, build_client_context
from ops.cluster import procs

log = logging.getLogger(__name__)

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
# ZooKeeper's log goes through SLF4J; this binding writes it to the server's log file.
SLF4J_SIMPLE_JAR = Path("/usr/share/java/slf4j-simple.jar")
NETTY_CODEC_JAR = Path("/usr/share/java/netty-codec.jar")
# A JVM plus ZooKeeper take 1-5 s to answer on this class of machine; be generous.
START_TIMEOUT_S = 60.0
# Small heap: tests and local clusters hold little metadata.
JVM_HEAP = "-Xmx256m"


def log_binding() -> list[str]:
    """The classpath entry that gives ZooKeeper's SLF4J a logger: without one it falls
    back to a no-op logger and the server logs nothing at all. Debian's libslf4j-java
    (a dependency of its zookeeper package) ships ``slf4j-simple``."""
    return [str(SLF4J_SIMPLE_JAR)] if SLF4J_SIMPLE_JAR.exists() else []


def log_properties() -> list[str]:
    """slf4j-simple's settings: INFO and up, with timestamps, to stdout (the log file)."""
    return [
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
        "-Dorg.slf4j.simpleLogger.showDateTime=true",
        "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss,SSS",
        "-Dorg.slf4j.simpleLogger.logFile=System.out",
        "-Dorg.slf4j.simpleLogger.showShortLogName=true",
    ]


@dataclass(frozen=True, slots=True)
class QuorumMember:
    """This server's place in an ensemble: its id and every member's peer and
    leader-election ports (``server.<id>=host:peer:election`` in zoo.cfg)."""

    myid: int
    peers: dict[int, tuple[int, int]]
    # Each member's address when they differ (hosts of their own: ops/chaos/hosts.py);
    # a member missing here is on this server's ``host``.
    peer_hosts: dict[int, str] = field(default_factory=dict)


class ZooKeeperError(RuntimeError):
    """ZooKeeper could not be started (missing package, died at start, no answer)."""


def find_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperError(
            "no `java` on PATH: install a JRE (apt-get install default-jre-headless)"
        )
    return java


def four_letter_word(
    host: str,
    port: int,
    word: str = "ruok",
    timeout_s: float = 2.0,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> str:
    """Send a ZooKeeper four-letter command and return the answer ('' on failure);
    over TLS with ``ssl_context`` (a server with only a secureClientPort)."""
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout_s))
            if ssl_context is not None:
                sock = stack.enter_context(ssl_context.wrap_socket(sock, server_hostname=host))
            sock.sendall(word.encode("ascii"))
            chunks = []
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode("ascii", "replace")
    except OSError:  # ssl.SSLError is one
        return ""


class ZooKeeperServer:
    """A standalone ZooKeeper child process. Use as a context manager or start/stop."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        tick_time_ms: int = 500,
        *,
        quorum: QuorumMember | None = None,
        tls: TlsConfig | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        # With tickTime 500 ms, sessions can be 1 s .. 20 s (2x and 40x the tick).
        self.tick_time_ms = tick_time_ms
        self.proc: subprocess.Popen[bytes] | None = None
        # A member of an ensemble runs QuorumPeerMain with the peers in its zoo.cfg.
        self.quorum = quorum
        self.main_class = QUORUM_MAIN_CLASS if quorum is not None else MAIN_CLASS
        # Serve clients over TLS only (secureClientPort), presenting tls's certificate.
        self.tls = tls
        # Put before the java command line, e.g. ``ip netns exec NS`` (a host of its own).
        self.prefix = list(prefix)

    @property
    def connect_string(self) -> str:
        if self.port is None:
            raise ZooKeeperError("ZooKeeper has not been started")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    def _write_config(self) -> Path:
        assert self.port is not None
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_time_ms}",
                    f"dataDir={self.data_dir / 'data'}",
                    *self._client_port_lines(),
                    "maxClientCnxns=0",
                    f"minSessionTimeout={2 * self.tick_time_ms}",
                    f"maxSessionTimeout={120 * self.tick_time_ms}",
                    "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons",
                    "admin.enableServer=false",
                    "autopurge.snapRetainCount=3",
                    "autopurge.purgeInterval=1",
                    # A local cluster on one disk: don't stall clients on slow fsyncs.
                    "forceSync=yes",
                    *self._quorum_lines(),
                    "",
                ]
            )
        )
        return cfg

    def _client_port_lines(self) -> list[str]:
        if self.tls is None:
            return [f"clientPort={self.port}", f"clientPortAddress={self.host}"]
        # ZooKeeper's PEM key store is one file holding the key and its certificate.
        keystore = self.data_dir / "tls-keystore.pem"
        keystore.touch(mode=0o600)
        keystore.write_text(
            Path(self.tls.key_file).read_text() + Path(self.tls.cert_file).read_text()
        )
        client_auth = "need" if self.tls.require_client_cert else "none"
        return [
            f"secureClientPort={self.port}",
            f"secureClientPortAddress={self.host}",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.tls.ca_file}",
            "ssl.trustStore.type=PEM",
            f"ssl.clientAuth={client_auth}",
        ]

    def _quorum_lines(self) -> list[str]:
        if self.quorum is None:
            return []
        (self.data_dir / "data" / "myid").write_text(f"{self.quorum.myid}\n")
        return [
            "initLimit=20",  # ticks a follower may take to connect and sync
            "syncLimit=10",  # ticks a follower may lag behind the leader
            *(
                f"server.{i}={self.quorum.peer_hosts.get(i, self.host)}:{peer}:{election}"
                for i, (peer, election) in sorted(self.quorum.peers.items())
            ),
        ]

    def start(self, *, wait: bool = True) -> ZooKeeperServer:
        """Start the JVM; with ``wait`` return once it serves (an ensemble member
        serves only once a quorum runs: start them all, then :meth:`wait_ready`)."""
        if not ZOOKEEPER_JAR.exists():
            raise ZooKeeperError(
                f"{ZOOKEEPER_JAR} is missing: install Debian's zookeeper package "
                "(./run.sh and ./test.sh do this)"
            )
        java = find_java()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = procs.free_port(self.host)
        cfg = self._write_config()
        argv = [
            *self.prefix,
            java,
            JVM_HEAP,
            "-XX:+UseSerialGC",
            "-Dzookeeper.log.dir=" + str(self.data_dir),
            "-Dzookeeper.admin.enableServer=false",
            *log_properties(),
            "-cp",
            ":".join(
                ["/etc/zookeeper/conf", str(ZOOKEEPER_JAR), *log_binding(), *self._tls_jars()]
            ),
            self.main_class,
            str(cfg),
        ]
        env = dict(os.environ)
        self.proc = procs.spawn(argv, log_path=self.log_path, env=env)
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def _tls_jars(self) -> list[str]:
        """Netty's codec jar: the TLS server (NettyServerCnxnFactory) needs it, and the
        Class-Path of Debian's zookeeper.jar lists netty's buffer, common, handler and
        transport jars but not this one (libnetty-java ships it)."""
        if self.tls is None:
            return []
        if not NETTY_CODEC_JAR.exists():
            raise ZooKeeperError(f"{NETTY_CODEC_JAR} is missing: install libnetty-java")
        return [str(NETTY_CODEC_JAR)]

    def wait_ready(self) -> None:
        """Until ``srvr`` reports a mode (ZooKeeperError if it exits or times out)."""
        self._wait_ready()
        assert self.proc is not None
        log.info("ZooKeeper pid %d answering on %s", self.proc.pid, self.connect_string)

    def _wait_ready(self) -> None:
        assert self.proc is not None
        assert self.port is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = ""
                with contextlib.suppress(OSError):
                    tail = self.log_path.read_text(errors="replace")[-2000:]
                raise ZooKeeperError(
                    f"ZooKeeper exited with code {self.proc.returncode} at start; log tail:\n{tail}"
                )
            # `ruok` says imok as soon as the port is open, even while the data tree is
            # still loading; `srvr` reports a Mode only once requests are served.
            if self.four_letter_word("ruok") == "imok" and "Mode:" in (
                self.four_letter_word("srvr")
            ):
                return
            time.sleep(0.1)
        raise ZooKeeperError(
            f"ZooKeeper did not answer ruok on port {self.port} within {START_TIMEOUT_S:.0f}s"
        )

    def four_letter_word(self, word: str) -> str:
        """``word``'s answer from this server ('' on failure), over TLS when it serves TLS."""
        assert self.port is not None
        context = None if self.tls is None else build_client_context(self.tls)
        return four_letter_word(self.host, self.port, word, ssl_context=context)

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
            log.info("ZooKeeper pid %d stopped", self.proc.pid)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
