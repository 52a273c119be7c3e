"""Authentication and authorization on the proxies, real processes (ZooKeeper, 3
bookies, 2 write proxies, 1 read proxy; ``LocalCluster(auth=True)``, as ``bookline
local`` runs by default):

* every route of the OpenAPI document refuses a request without a token and with a
  wrong one: 401 UNAUTHENTICATED, the documented body, ``WWW-Authenticate: Bearer``;
  ``/health``, ``/metrics``, ``/openapi.json`` and the dashboard page stay open;
* grants hold per prefix: produce on ``app-`` writes ``app-x``, not ``other-x`` (403),
  and cannot truncate (admin); consume reads, tails (a WebSocket without a token is
  refused) and joins a group (the group and its topics are both checked);
* an expired token is refused; a redirect to the owning proxy stays authorized.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from foundation.auth import sign_token
from foundation.errors import ForbiddenError, UnauthenticatedError
from groups import wire as group_wire
from httpapi.openapi import build_document
from ops.cluster.local import LocalCluster
from tests.cluster_support import bearer, cluster_secret, started_cluster, token
from tests.waiting import wait_for
from thinclient.client import ClientConfig, ProxyClient

pytestmark = pytest.mark.integration

GRANTS = """
superusers = ["admin"]
[[grants]]
principal = "alice"
permission = "produce"
kind = "stream"
prefix = "app-"
[[grants]]
principal = "alice"
permission = "consume"
kind = "stream"
prefix = "app-"
[[grants]]
principal = "bob"
permission = "consume"
kind = "topic"
prefix = "orders"
[[grants]]
principal = "bob"
permission = "consume"
kind = "group"
prefix = "billing"
"""
CLIENT = ClientConfig(retry_deadline_ms=15_000)
# Values for the path parameters of the OpenAPI document's routes.
PATH_VALUES = {
    "name": "app-any",
    "topic": "orders-any",
    "group": "billing-any",
    "partition": "0",
    "sub": "s1",
}
OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json", "/dashboard"})


def _uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("auth-cluster")
    (directory / "auth").mkdir(mode=0o700)
    (directory / "auth" / "grants.toml").write_text(GRANTS)
    with started_cluster(directory, bookies=3, write_proxies=2, read_proxies=1, auth=True) as c:
        yield c


@pytest.fixture(scope="module")
def secret(cluster: LocalCluster) -> bytes:
    return cluster_secret(cluster)


def _wurls(cluster: LocalCluster) -> list[str]:
    return [p.extra["url"] for p in cluster.write_proxies]


def _rurl(cluster: LocalCluster) -> str:
    return str(cluster.read_proxies[0].extra["url"])


def _routes() -> list[tuple[str, str]]:
    doc = build_document()
    out = []
    for path, ops in doc["paths"].items():
        for method in ops:
            if method in ("get", "post", "put", "patch", "delete"):
                out.append((method.upper(), path.format(**PATH_VALUES)))
    return out


async def _status(
    http: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str]
) -> tuple[int, dict[str, Any], str]:
    async with http.request(
        method, url, headers={"Accept": "application/json", **headers}, json={},
        allow_redirects=False,
    ) as resp:  # fmt: skip
        is_json = resp.content_type == "application/json"
        body = await resp.json() if is_json else {}
        return resp.status, body, resp.headers.get("WWW-Authenticate", "")


async def test_every_route_refuses_no_token_and_a_wrong_token(
    cluster: LocalCluster, http: aiohttp.ClientSession
) -> None:
    forged = sign_token(b"not-the-cluster-secret-at-all!!", "admin", time.time() + 600)
    bases = [*_wurls(cluster)[:1], _rurl(cluster)]
    checked = 0
    for method, path in _routes():
        if path in OPEN_PATHS:
            for base in bases:
                status, _body, _www = await _status(http, method, base + path, {})
                assert status != 401, f"{method} {path} should stay open"
            continue
        refused_by = []
        for base in bases:
            for headers in ({}, bearer(forged), bearer("garbage")):
                status, body, www = await _status(http, method, base + path, headers)
                if status in (404, 405) and body.get("name") != "UNAUTHENTICATED":
                    break  # this proxy does not serve the route (or not that method)
                assert status == 401, f"{method} {base}{path} {headers}: {status} {body}"
                assert body["code"] == 48 and body["name"] == "UNAUTHENTICATED", body
                assert isinstance(body["message"], str) and body["message"]
                assert forged not in body["message"]
                assert www.startswith("Bearer"), www
                refused_by.append(base)
        assert refused_by, f"no proxy serves {method} {path}"
        checked += 1
    assert checked >= 30  # every API route of the document


async def test_produce_grant_is_per_prefix_and_not_admin(
    cluster: LocalCluster, secret: bytes
) -> None:
    uid = _uid()
    alice = token(secret, "alice")
    urls = _wurls(cluster)
    async with ProxyClient(write_urls=urls, read_urls=[_rurl(cluster)], token=alice) as client:
        dlsn = await client.write(f"app-{uid}", b"mine")
        with pytest.raises(ForbiddenError, match="'alice' may not produce on stream 'other-"):
            await client.write(f"other-{uid}", b"not mine")
        with pytest.raises(ForbiddenError, match="may not admin"):
            await client.truncate(f"app-{uid}", dlsn)
        with pytest.raises(ForbiddenError):
            await client.create_stream(f"app-new-{uid}")  # creating is admin
        with pytest.raises(ForbiddenError):
            await client.delete_stream(f"app-{uid}")
        page = await client.read(f"app-{uid}")
        assert [r.payload for r in page.records] == [b"mine"]
    admin = token(secret, "admin")
    async with ProxyClient(write_urls=_wurls(cluster), config=CLIENT, token=admin) as client:
        await client.truncate(f"app-{uid}", dlsn)  # admin may
        await client.write(f"other-{uid}", b"admin writes anywhere")


async def test_consume_grants_reads_and_websocket_tails(
    cluster: LocalCluster, secret: bytes, http: aiohttp.ClientSession
) -> None:
    uid = _uid()
    stream = f"app-tail-{uid}"
    alice, bob = token(secret, "alice"), token(secret, "bob")
    async with ProxyClient(write_urls=_wurls(cluster), config=CLIENT, token=alice) as client:
        await client.write(stream, b"r1")
    url = f"{_rurl(cluster)}/v1/streams/{stream}/records?from=earliest"
    async with http.get(url, headers=bearer(bob)) as resp:
        assert resp.status == 403
        assert (await resp.json(content_type=None))["name"] == "FORBIDDEN"
    async with http.get(url, headers=bearer(alice)) as resp:
        assert resp.status == 200
    async with http.get(f"{_rurl(cluster)}/v1/streams/{stream}", headers=bearer(bob)) as resp:
        assert resp.status == 403
        message = (await resp.json(content_type=None))["message"]
        assert message == f"'bob' may not produce or consume on stream '{stream}'"
    ws_url = f"{_rurl(cluster).replace('http', 'ws')}/v1/streams/{stream}/tail?from=earliest"
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await http.ws_connect(ws_url)
    assert info.value.status == 401
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await http.ws_connect(ws_url, headers=bearer(bob))
    assert info.value.status == 403
    # the header, or the query parameter a browser uses
    for target, headers in ((ws_url, bearer(alice)), (f"{ws_url}&format=json&token={alice}", {})):
        async with http.ws_connect(target, headers=headers) as ws:
            msg = await asyncio.wait_for(ws.receive(), 20)
            assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT)


async def test_group_join_checks_the_group_and_its_topics(
    cluster: LocalCluster, secret: bytes
) -> None:
    uid = _uid()
    topic, group = f"orders-{uid}", f"billing-{uid}"
    admin, bob = token(secret, "admin"), token(secret, "bob")
    async with ProxyClient(write_urls=_wurls(cluster), config=CLIENT, token=admin) as client:
        await client.create_topic(topic, 2)
        await client.create_topic(f"secret-{uid}", 1)
    join = group_wire.JoinRequest(topics=(topic,)).to_wire()
    async with aiohttp.ClientSession(headers=bearer(bob)) as http:

        async def post(group_name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            url = f"{_wurls(cluster)[0]}/v1/groups/{group_name}/join"

            async def answered() -> tuple[int, dict[str, Any]] | None:  # 503 while it starts
                async with http.post(url, json=body, allow_redirects=True) as resp:
                    answer = await resp.json(content_type=None)
                    return None if resp.status == 503 else (resp.status, answer)

            return await wait_for(answered, "the group coordinator to answer", interval_s=0.5)

        status, answer = await post(group, join)
        assert status == 200, answer
        assert answer["assignment"]
        status, answer = await post(f"payroll-{uid}", join)
        assert (status, answer["name"]) == (403, "FORBIDDEN")
        status, answer = await post(
            f"billing2-{uid}", group_wire.JoinRequest(topics=(f"secret-{uid}",)).to_wire()
        )
        assert (status, answer["name"]) == (403, "FORBIDDEN")
        assert f"topic 'secret-{uid}'" in answer["message"]


async def test_expired_token_is_refused(cluster: LocalCluster, secret: bytes) -> None:
    expired = token(secret, "admin", lifetime_s=-1)
    async with ProxyClient(write_urls=_wurls(cluster), config=CLIENT, token=expired) as client:
        with pytest.raises(UnauthenticatedError, match="expired"):
            await client.write(f"app-{_uid()}", b"x")


async def test_redirect_to_the_owner_stays_authorized(
    cluster: LocalCluster, secret: bytes, http: aiohttp.ClientSession
) -> None:
    first, second = _wurls(cluster)
    alice = token(secret, "alice")
    stream = f"app-moved-{_uid()}"
    async with ProxyClient(write_urls=[second], config=CLIENT, token=alice) as client:
        await client.write(stream, b"owned by the second proxy")
    url = f"{first}/v1/streams/{stream}/records"
    body = {"records": [{"payload": "x"}]}
    async with http.post(url, json=body, headers=bearer(alice), allow_redirects=False) as resp:
        assert resp.status == 307
        location = resp.headers["Location"]
    assert location.startswith(second)
    async with http.post(location, json=body) as resp:  # the owner wants a token too
        assert resp.status == 401
    async with ProxyClient(write_urls=[first], config=CLIENT, token=alice) as client:
        await client.write(stream, b"through a redirect")
        assert client.redirects >= 1


async def test_cluster_file_carries_the_admin_token(cluster: LocalCluster, secret: bytes) -> None:
    """Clients given cluster.json authenticate as admin without being told a token; the
    file names the token's file, never the signing secret or its file."""
    path = Path(cluster.dir / "cluster.json")
    text = path.read_text()
    assert '"token_file": "auth/admin.token"' in text
    assert secret.decode() not in text and '"auth/secret"' not in text
    async with ProxyClient.from_cluster_file(path, config=CLIENT) as client:
        await client.write(f"other-{_uid()}", b"admin from the cluster file")


def test_cli_takes_the_cluster_files_token_or_token_flag(cluster: LocalCluster) -> None:
    """`--token` wins over the cluster file's; a bad one is refused with a hint."""
    import subprocess
    import sys

    base = [sys.executable, "-m", "ops.cli", "stream", "list", "--cluster",
            str(cluster.dir / "cluster.json")]  # fmt: skip

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [*base, *extra]
        return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)

    assert run().returncode == 0
    bad = run("--token", "bl1.YWRtaW4.1.AAAA")
    assert bad.returncode == 1, bad.stderr
    assert "UNAUTHENTICATED (48)" in bad.stderr and "--token TOKEN" in bad.stderr
