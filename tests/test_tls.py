"""TLS on every hop (issue 15, scope 7), with a CA generated at test time.

A cluster of real processes -- Debian's ZooKeeper on a ``secureClientPort`` only, three
bookies and a write and a read proxy -- all with ``BOOKLINE_TLS_*`` and mutual TLS
(``require_client_cert``): a thin-client write and read over https (and a tail over
wss), a core-library write and read (bookie protocol and ZooKeeper over TLS), and the
refusals: plain text to a bookie, a proxy and ZooKeeper; a server certificate from
another CA; a client certificate from another CA. Every process is stopped by pid.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen

import aiohttp
import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from bookie.client import BookieConnection, ClientOptions
from foundation import tls
from foundation.errors import ConfigError, ConnectionLostError
from foundation.tls import CertPaths, TlsConfig
from ops.cluster import procs
from ops.cluster.zookeeper import ZooKeeperServer, four_letter_word
from streams.config import NamespaceConfig
from streams.namespace import Namespace
from streams.records import LogRecord
from tests.values import values
from tests.waiting import wait_for, wait_until
from thinclient.proxy_client import ProxyClient

pytestmark = pytest.mark.integration

ROOT = "/bookline-tls"
READY_TIMEOUT_S = 60.0
SESSION_TIMEOUT_MS = 4_000
CORE = NamespaceConfig(session_timeout_ms=SESSION_TIMEOUT_MS, long_poll_timeout_ms=1000)


@dataclasses.dataclass
class Pki:
    ca: CertPaths
    server: CertPaths  # every service's certificate (localhost, 127.0.0.1)
    client: CertPaths  # a client's, same CA
    rogue: CertPaths  # same names, signed by another CA

    def client_config(self) -> TlsConfig:
        return self.client.config()

    def client_context(
        self, cert: CertPaths | None = None, ca: Path | None = None
    ) -> ssl.SSLContext:
        cert = cert or self.client
        return tls.build_client_context(
            dataclasses.replace(cert.config(), ca_file=str(ca or self.ca.cert_file))
        )


@dataclasses.dataclass
class TlsCluster:
    zk: ZooKeeperServer
    bookies: list[str]
    write_url: str
    read_url: str
    other_write_url: str  # a second write proxy (redirects)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("pki")
    ca = tls.make_ca(base / "ca", "Bookline test CA")
    other = tls.make_ca(base / "other-ca", "Some other CA")
    return Pki(
        ca=ca,
        server=tls.issue(ca, base / "certs", "server"),
        client=tls.issue(ca, base / "certs", "client"),
        rogue=tls.issue(other, base / "rogue", "server"),
    )


def _wait_line(proc: Popen[bytes], log: Path, line: bytes) -> None:

    def logged() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: exited {proc.returncode}: {log.read_text()[-3000:]}")
        return line in (log.read_bytes() if log.exists() else b"")

    wait_until(logged, lambda: f"{log.name} ready: {log.read_text()[-3000:]}",
               timeout_s=READY_TIMEOUT_S)  # fmt: skip


def _spawn(argv: list[str], log: Path, env: dict[str, str], started: list[Popen[bytes]]) -> None:
    proc = procs.spawn([sys.executable, "-m", "ops.cli", *argv], log_path=log, env=env)
    started.append(proc)
    _wait_line(proc, log, b"ready")


@pytest.fixture(scope="module")
def cluster(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    """ZooKeeper (TLS only) + 3 bookies + a write and a read proxy, mutual TLS."""
    base = tmp_path_factory.mktemp("tls-cluster")
    server_tls = pki.server.config(require_client_cert=True)
    zk = ZooKeeperServer(base / "zk", tls=server_tls)
    started: list[Popen[bytes]] = []
    env = dict(os.environ, **pki.server.environ(require_client_cert=True))
    try:
        zk.start()
        common = ["--zk", zk.connect_string, "--root", ROOT]
        session = ["--session-timeout-ms", str(SESSION_TIMEOUT_MS)]
        bookies = []
        for i in range(3):
            port, d = procs.free_port(), base / f"bookie-{i}"
            _spawn(
                ["bookie", *common, *session, "--port", str(port),
                 "--journal-dir", str(d / "j"), "--ledgers-dir", str(d / "l"),
                 "--index-dir", str(d / "i")],
                base / f"bookie-{i}.log", env, started,
            )  # fmt: skip
            bookies.append(f"127.0.0.1:{port}")
        urls = []
        for kind, n in (("writeproxy", 1), ("readproxy", 1), ("writeproxy", 2)):
            port = procs.free_port()
            _spawn(
                [kind, *common, *session, "--proxy-id", f"{kind}-{n}", "--port", str(port)],
                base / f"{kind}-{n}.log", env, started,
            )  # fmt: skip
            urls.append(f"https://127.0.0.1:{port}")
        yield TlsCluster(
            zk=zk, bookies=bookies, write_url=urls[0], read_url=urls[1], other_write_url=urls[2]
        )
    finally:
        for proc in reversed(started):
            procs.stop(proc, grace_s=5.0)
        zk.stop()


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect each test's garbage (closed TLS transports, sessions) here, at a safe
    point: collected later inside an ``ast.parse`` (pytest rewriting a module), a
    finalizer that formats a traceback re-enters the AST constructor, which CPython
    3.11.7 counts in shared state (python/cpython#106905) -- a SystemError in
    whatever test parses next."""
    yield
    gc.collect()


# -- settings and certificates (no processes) ---------------------------------------------


def test_tls_settings_are_checked(tmp_path: Path) -> None:
    assert tls.load_tls(environ={}) == TlsConfig()
    with pytest.raises(ConfigError, match=r"tls\.ca_file is required"):
        tls.load_tls(environ={"BOOKLINE_TLS_ENABLED": "true"})
    with pytest.raises(ConfigError, match="no such file"):
        TlsConfig(enabled=True, ca_file=str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="go together"):
        TlsConfig(enabled=True, ca_file=__file__, cert_file=__file__)
    config = tmp_path / "bookline.toml"
    config.write_text('[tls]\nenabled = true\nca_file = "nowhere.pem"\n')
    with pytest.raises(ConfigError, match=r"tls\.ca_file: no such file"):
        tls.load_tls(config)


def test_generated_certificates_verify_against_their_ca_only(pki: Pki) -> None:
    assert tls.build_server_context(pki.server.config()) is not None
    good = pki.client_context()
    stranger = pki.client_context(ca=pki.rogue.ca_file)
    assert good.get_ca_certs()[0]["subject"] == ((("commonName", "Bookline test CA"),),)
    assert stranger.get_ca_certs()[0]["subject"] == ((("commonName", "Some other CA"),),)
    with tls.configured(TlsConfig()):
        assert tls.server_context() is None and tls.scheme() == "http"
    with tls.configured(pki.server.config()):
        assert tls.server_context() is not None and tls.scheme() == "https"
        assert tls.zookeeper_tls(None) is not None and tls.zookeeper_tls(False) is None


# -- the cluster ------------------------------------------------------------------------


async def test_thin_client_writes_and_reads_over_https(cluster: TlsCluster, pki: Pki) -> None:
    client = ProxyClient(
        write_urls=[cluster.write_url], read_urls=[cluster.read_url], ssl=pki.client_context()
    )
    await client.start()
    try:
        first = await client.write("thin", b"one")
        await client.write("thin", b"two")
        await client.flush()
        assert await _read_all(client, "thin", 2) == [b"one", b"two"]
        # The owner proxies name (and redirect to) is its https URL.
        assert await client.owner("thin") == cluster.write_url
        tail = client.tail("thin", str(first))
        got = await asyncio.wait_for(tail.__anext__(), 20)  # a WebSocket over wss
        await tail.aclose()
        assert got.payload == b"one"
    finally:
        await client.close()


async def _read_all(client: ProxyClient, stream: str, count: int) -> list[bytes]:
    """``count`` records from the start: a read answers what the read proxy sees as
    committed, and the last entry becomes visible a moment after its write."""
    got: list[bytes] = []
    position = "earliest"

    async def read_all() -> bool:  # one turn: read the next page
        nonlocal position
        page = await client.read(stream, position, limit=10, wait_ms=1000)
        got.extend(values(page.records))
        position = page.next
        return len(got) >= count

    await wait_for(read_all, lambda: f"{count} records of {stream}, got {got}", timeout_s=20,
                   interval_s=0)  # fmt: skip
    return got


async def test_redirects_between_proxies_stay_on_https(cluster: TlsCluster, pki: Pki) -> None:
    """A stream owned by one write proxy, asked of the other: the 307 names the owner's
    https URL, and a client that only knows the other proxy follows it."""
    context = pki.client_context()
    owner, other = cluster.write_url, cluster.other_write_url
    async with ProxyClient(write_urls=[owner], ssl=context) as client:
        await client.write("moved", b"first")
        assert await client.owner("moved") == owner
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{other}/v1/streams/moved/records",
            json={"payload": "x"},
            allow_redirects=False,
            ssl=context,
        ) as resp,
    ):
        assert resp.status == 307
        assert resp.headers["Location"].startswith(owner + "/")
    async with ProxyClient(write_urls=[other], ssl=context) as lost:
        await lost.write("moved", b"via redirect")
        assert lost.redirects >= 1


async def test_core_library_writes_and_reads_over_tls(cluster: TlsCluster, pki: Pki) -> None:
    with tls.configured(pki.client_config()):
        ns = await Namespace.open(cluster.zk.connect_string, ROOT, "core", CORE)
        try:
            await ns.create_stream("core-stream")
            writer = await ns.open_writer("core-stream")
            for i in range(5):
                await writer.write(LogRecord(b"record-%d" % i))
            await writer.close()
            reader = await ns.open_reader("core-stream")
            records = await reader.read_many(10, timeout_s=20)
            await reader.close()
        finally:
            await ns.close()
    assert [r.payload for r in records] == [b"record-%d" % i for i in range(5)]


async def test_plain_text_is_refused_everywhere(cluster: TlsCluster) -> None:
    # A bookie: the bytes of a request are not a TLS ClientHello; the bookie hangs up.
    host, port = cluster.bookies[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"\x00\x00\x00\x10" + bytes(16))
    try:
        answer = await asyncio.wait_for(reader.read(), 15)
    finally:
        writer.close()
        await writer.wait_closed()
    assert answer == b"" or answer.startswith(b"\x15")  # EOF or a TLS alert, no answer
    with tls.configured(TlsConfig()):
        plain = BookieConnection(cluster.bookies[0])
        with pytest.raises(ConnectionLostError):
            await plain.info(timeout_s=5)
        await plain.close()
    # A proxy: HTTP to the https port gets no HTTP answer.
    url = cluster.write_url.replace("https", "http")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        with pytest.raises(aiohttp.ClientError):
            await session.get(f"{url}/health")
    # ZooKeeper: only its secureClientPort listens.
    assert four_letter_word(cluster.zk.host, cluster.zk.port or 0, "ruok") == ""
    plain_zk = KazooClient(hosts=cluster.zk.connect_string, timeout=2)
    with pytest.raises(KazooTimeoutError):
        plain_zk.start(timeout=3)
    plain_zk.stop()
    plain_zk.close()


async def test_a_server_certificate_from_another_ca_is_refused(
    cluster: TlsCluster, pki: Pki
) -> None:
    stranger = pki.client_context(ca=pki.rogue.ca_file)  # trusts the other CA only
    conn = BookieConnection(cluster.bookies[0], ClientOptions(ssl=stranger))
    with pytest.raises(ConnectionLostError, match="certificate verify failed"):
        await conn.info(timeout_s=5)
    await conn.close()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with session.get(f"{cluster.write_url}/health", ssl=stranger):
                pass
    # ZooKeeper's certificate is refused the same way (kazoo builds its context like
    # this: metadata.zk.kazoo_tls; kazoo itself leaks the socket of a failed handshake).
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(stranger, cluster.zk.host, cluster.zk.port or 0)
    _handshake(pki.client_context(), cluster.zk.host, cluster.zk.port or 0)  # the right CA


def _handshake(context: ssl.SSLContext, host: str, port: int) -> None:
    with (
        socket.create_connection((host, port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname=host),
    ):
        pass


async def test_a_client_certificate_from_another_ca_is_refused(
    cluster: TlsCluster, pki: Pki
) -> None:
    """Mutual TLS: the servers are trusted, but the client presents a stranger's cert."""
    impostor = pki.client_context(cert=pki.rogue, ca=pki.ca.cert_file)
    conn = BookieConnection(cluster.bookies[0], ClientOptions(ssl=impostor))
    with pytest.raises(ConnectionLostError):
        await conn.info(timeout_s=5)
    await conn.close()
    no_cert = tls.build_client_context(TlsConfig(enabled=True, ca_file=str(pki.ca.cert_file)))
    async with aiohttp.ClientSession() as session:
        for context in (impostor, no_cert):
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"{cluster.write_url}/health", ssl=context) as resp:
                    await resp.read()
    # The same client with the CA's own certificate is let in.
    good = BookieConnection(cluster.bookies[0], ClientOptions(ssl=pki.client_context()))
    try:
        assert (await good.info(timeout_s=10)) is not None
    finally:
        await good.close()


# -- bookline local --tls -----------------------------------------------------------------


@pytest.mark.slow
def test_bookline_local_tls(tmp_path: Path) -> None:
    """``bookline local --tls``: a CA under DIR/tls, ZooKeeper on a TLS port, https
    proxies; cluster.json names the CA, and a thin client and ``bookline status`` that
    read it work; the plain ZooKeeper port does not exist (~20 s)."""
    from ops.cluster.local import LocalCluster
    from thinclient.sync import SyncProxyClient

    cluster = LocalCluster(
        tmp_path / "local", bookies=3, write_proxies=1, read_proxies=1, autorecovery=True, tls=True
    )
    cluster.start()
    try:
        doc = json.loads((tmp_path / "local" / "cluster.json").read_text())
        assert doc["tls"]["ca_file"].endswith("tls/ca.pem")
        assert doc["write_proxies"][0]["url"].startswith("https://")
        assert cluster.zk is not None and cluster.zk.port is not None
        assert four_letter_word(cluster.zk.host, cluster.zk.port, "ruok") == ""  # TLS only
        with SyncProxyClient.from_cluster_file(tmp_path / "local") as client:
            client.write("local-tls", b"over https")
            client.flush()
            records = wait_until(  # visible a moment later
                lambda: client.read("local-tls", "earliest", limit=10, wait_ms=1000).records,
                "the record readable over https", interval_s=0,
            )  # fmt: skip
        assert [r.payload for r in records] == [b"over https"]
        status = subprocess.run(
            [sys.executable, "-m", "ops.cli", "status", "--cluster", str(tmp_path / "local"),
             "--json"],
            check=False, capture_output=True, text=True, timeout=60, env=dict(os.environ),
        )  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr
        body = json.loads(status.stdout)
        assert all(p["state"] == "ok" for p in body["proxies"]), body["proxies"]
    finally:
        cluster.stop()
