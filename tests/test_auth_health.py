"""Issue 21 (9), the bookies' and autorecovery's side: with auth on their open
``/health`` and ``/metrics`` tell a caller without a token allowed more (a token allowed
``consume`` on the cluster) only whether the service is up -- no details, no recent log
lines (which can name streams) -- and show the detail to an admin token and to the
services' own token, which the dashboard's cluster view polls with.

Against a ``bookline local``-style cluster (``LocalCluster(auth=True)``: ZooKeeper,
3 bookies, autorecovery, a read proxy), and, for a warning that names a stream, the
bookie's HTTP server and autorecovery's endpoints in this process over the same
cluster's credentials (their recent log lines are this process's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from bookie.metrics import BookieMetrics, MetricsHttpServer
from foundation.auth import SERVICE_PRINCIPAL, AuthConfig, load_authority
from foundation.config import MetadataConfig
from foundation.health import PUBLIC_FIELDS, State, health_body
from ledger.autorecovery import Autorecovery
from ledger.autorecovery_config import AutorecoveryConfig
from ops.cluster.autorecovery_http import AutorecoveryHttp
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from tests.cli_support import run_cli
from tests.cluster_support import bearer, cluster_secret, started_cluster, token
from tests.metadata_support import wait_for

pytestmark = pytest.mark.integration

# A warning reaches another process's /health within its next poll; generous for a
# loaded machine (a condition is awaited, never this long when all is well).
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("auth-health")
    with started_cluster(directory, bookies=3, read_proxies=1, autorecovery=True, auth=True) as c:
        yield c


@pytest.fixture(scope="module")
def secret(cluster: LocalCluster) -> bytes:
    return cluster_secret(cluster)


def _bearer(secret: bytes, principal: str) -> dict[str, str]:
    return bearer(token(secret, principal))


def _strangers(secret: bytes) -> list[dict[str, str]]:
    """No token, a token that does not check out, a valid token granted nothing."""
    return [{}, {"Authorization": "Bearer garbage"}, _bearer(secret, "nobody")]


async def _get(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    async with http.get(url, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def _text(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> str:
    async with http.get(url, headers=headers) as resp:
        assert resp.status == 200, resp.status
        return await resp.text()


def _bookie_url(cluster: LocalCluster, index: int = 0) -> str:
    return str(cluster.bookies[index].extra["metrics"]).removesuffix("/metrics")


def _send_garbage(address: str) -> None:
    """A frame no bookie can decode: it closes the connection with a WARNING."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\xff" * 256)  # no magic, no version: fatal for the connection
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(4096):  # until the bookie closes it
                pass


def _pause_autorecovery(cluster: LocalCluster, op: str) -> None:
    """``bookline autorecovery disable|enable``: the worker logs a WARNING."""
    out = run_cli("autorecovery", op, cluster=cluster.dir / "cluster.json")
    assert out.returncode == 0, out.stderr


async def test_bookies_and_autorecovery_answer_strangers_only_whether_they_are_up(
    cluster: LocalCluster, secret: bytes, http: aiohttp.ClientSession
) -> None:
    await asyncio.to_thread(_send_garbage, cluster.bookies[0].address)
    await asyncio.to_thread(_pause_autorecovery, cluster, "disable")
    try:
        admin = _bearer(secret, "admin")
        services = {
            "bookie": _bookie_url(cluster),
            "autorecovery": str(cluster.autorecovery[0].extra["url"]),
        }

        async def logged(base: str, words: str) -> bool:
            _status, body = await _get(http, f"{base}/health", admin)
            return any(words in e["message"] for e in body.get("recent_errors", []))

        await wait_for(
            lambda: logged(services["bookie"], "closing connection"), "the bookie's warning"
        )
        await wait_for(lambda: logged(services["autorecovery"], "paused"), "autorecovery's warning")
        for service, base in services.items():
            for headers in _strangers(secret):
                status, body = await _get(http, f"{base}/health", headers)
                assert status == 200 and body["state"] == "ok", body
                assert body["service"] == service
                assert set(body) <= set(PUBLIC_FIELDS), body  # no details, no log lines
                text = await _text(http, f"{base}/metrics", headers)
                assert "process_cpu_seconds_total" in text  # how it performs: open
            _status, body = await _get(http, f"{base}/health", admin)
            assert body["recent_errors"], body
        _status, body = await _get(http, f"{services['bookie']}/health", admin)
        assert "disk" in body and "requests" in body, body
        _status, body = await _get(http, f"{services['autorecovery']}/health", admin)
        assert "auditor_leader" in body and "underreplicated_ledgers" in body, body
        # the dashboard reads every bookie's details with the services' own token
        rp = str(cluster.read_proxies[0].extra["url"])
        status, view = await _get(http, f"{rp}/v1/cluster", admin)
        assert status == 200, view
        assert all(b["state"] == "ok" and b["disk"] for b in view["bookies"]), view["bookies"]
        assert any("closing connection" in e["message"] for e in view["recent_errors"]), view
        # the services' own token sees the detail (what the dashboard presents)
        own = _bearer(secret, SERVICE_PRINCIPAL)
        _status, body = await _get(http, f"{services['autorecovery']}/health", own)
        assert "recent_errors" in body and "auditor_leader" in body, body
    finally:
        await asyncio.to_thread(_pause_autorecovery, cluster, "enable")


async def test_a_warning_naming_a_stream_reaches_only_a_token_allowed_it(
    cluster: LocalCluster, secret: bytes, http: aiohttp.ClientSession
) -> None:
    auth = cluster.auth
    assert auth is not None and cluster.zk_digest_file is not None
    secret_file, grants_file = str(auth.secret_file), str(auth.grants_file)
    metrics = BookieMetrics()
    authority = load_authority(AuthConfig(True, secret_file, grants_file))
    bookie = MetricsHttpServer(metrics, "127.0.0.1", 0, authority)
    ar = await Autorecovery.connect(
        MetadataConfig(
            zk=cluster.zk_connect, root=CLUSTER_ROOT, digest_file=str(cluster.zk_digest_file)
        ),
        AutorecoveryConfig(
            auth_enabled=True, auth_secret_file=secret_file, auth_grants_file=grants_file
        ),
    )
    endpoints = AutorecoveryHttp(ar)
    try:
        ar_url = await endpoints.start("127.0.0.1", 0)
        stream = f"orders-{uuid.uuid4().hex[:8]}"
        # what ledger/orphans.py and ledgers' custom metadata bring into log lines
        logging.getLogger("ledger.orphans").warning("ledger 7 of stream default/%s", stream)
        metrics.publish_health(health_body("bookie", "bookie-x", State.OK, "writable"))
        for base in (bookie.base_url, ar_url):
            for headers in _strangers(secret):
                async with http.get(f"{base}/health", headers=headers) as resp:
                    text = await resp.text()
                    assert resp.status == 200, text
                assert stream not in text and "recent_errors" not in text, text
            async with http.get(f"{base}/health", headers=_bearer(secret, "admin")) as resp:
                text = await resp.text()
                assert stream in text and "recent_errors" in text, text
    finally:
        await endpoints.stop()
        await ar.stop()
        bookie.close()
