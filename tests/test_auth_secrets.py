"""Secrets stay secret (issue 15, scope 9): a workload through the proxies with auth on
-- writes, reads, a WebSocket tail, a group, refused requests of every kind -- then
every service's log file, every ``/metrics`` page and every error body is searched for
the cluster secret, the tokens used (and their signatures) and the ledgers' keys in
clear, and the cluster's own credentials (the services' token the children were
started with, the ledger secret). None may appear.

The list of what must not appear is the ``hidden`` fixture: a check of another secret
(a bookie credential, a derived ledger key) adds its values there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from foundation.auth import TOKEN_ENV, load_secrets, sign_token
from foundation.config import MetadataConfig
from foundation.errors import BooklineError
from ledger.keys import read_secret
from metadata.client import MetadataClient
from metadata.zk import read_digest
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from thinclient.client import ClientConfig, ProxyClient

pytestmark = pytest.mark.integration

GRANTS = """
superusers = ["admin"]
[[grants]]
principal = "writer"
permission = "produce"
kind = "stream"
prefix = "sec-"
"""
CLIENT = ClientConfig(retry_deadline_ms=10_000)
# A ledger password this short or this common is not a secret one can grep for.
_PASSWORD_CHARS_MIN = 12
_LEGACY_PASSWORD = b"bookline"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("secrets-cluster")
    (directory / "auth").mkdir(mode=0o700)
    (directory / "auth" / "grants.toml").write_text(GRANTS)
    c = LocalCluster(directory, bookies=3, write_proxies=1, read_proxies=1, auth=True)
    c.start()
    try:
        yield c
    finally:
        c.stop()


class Workload:
    """What the workload used and saw: tokens, error bodies."""

    def __init__(self, secret: bytes) -> None:
        now = time.time()
        self.admin = sign_token(secret, "admin", now + 600)
        self.writer = sign_token(secret, "writer", now + 600)
        self.expired = sign_token(secret, "writer", now - 5)
        self.tokens = [self.admin, self.writer, self.expired]
        self.error_bodies: list[str] = []


def _client(wurl: str, rurl: str, token: str) -> ProxyClient:
    return ProxyClient(write_urls=[wurl], read_urls=[rurl], config=CLIENT, token=token)


async def _run_workload(cluster: LocalCluster, w: Workload) -> None:
    wurl = cluster.write_proxies[0].extra["url"]
    rurl = cluster.read_proxies[0].extra["url"]
    uid = uuid.uuid4().hex[:8]
    stream = f"sec-{uid}"
    async with _client(wurl, rurl, w.writer) as client:
        for i in range(50):
            await client.write(stream, f"record {i}".encode())
    async with _client(wurl, rurl, w.admin) as client:
        await client.create_topic(f"sec-topic-{uid}", 2)
        await client.send(f"sec-topic-{uid}", b"v", key=b"k")
        page = await client.read(stream)
        assert page.records  # up to what the bookies have confirmed
    async with aiohttp.ClientSession() as http:
        ws_url = f"{rurl.replace('http', 'ws')}/v1/streams/{stream}/tail?from=earliest"
        async with http.ws_connect(f"{ws_url}&token={w.admin}") as ws:
            await asyncio.wait_for(ws.receive(), 20)
        refused = [
            ("POST", f"{wurl}/v1/streams/{stream}/truncate", w.writer),  # 403
            ("POST", f"{wurl}/v1/streams/other-{uid}/records", w.writer),  # 403
            ("GET", f"{rurl}/v1/streams/{stream}/records", w.expired),  # 401 expired
            ("GET", f"{rurl}/v1/streams/{stream}/records", w.writer + "x"),  # 401 forged
            ("GET", f"{rurl}/v1/cluster", w.writer),  # 403
            ("GET", f"{wurl}/v1/topics/nope-{uid}", w.admin),  # 404
            ("POST", f"{wurl}/v1/streams/{stream}/records", w.writer[:-3]),  # 401
        ]
        for method, url, tok in refused:
            headers = {"Authorization": f"Bearer {tok}", "Accept": "application/json"}
            async with http.request(method, url, headers=headers, json={"payloads": []}) as resp:
                assert resp.status >= 400, (method, url)
                w.error_bodies.append(await resp.text())
    async with _client(wurl, rurl, w.expired) as client:
        with pytest.raises(BooklineError) as info:
            await client.write(stream, b"refused")
        w.error_bodies.append(str(info.value))


@pytest.fixture(scope="module")
def workload(cluster: LocalCluster) -> Workload:
    secret = load_secrets(str(cluster.dir / "auth" / "secret"))[0]
    w = Workload(secret)
    asyncio.run(_run_workload(cluster, w))
    return w


async def _ledger_passwords(cluster: LocalCluster) -> list[bytes]:
    digest = str(cluster.zk_digest_file)  # the cluster's znodes admit its user alone
    config = MetadataConfig(zk=cluster.zk_connect, root=CLUSTER_ROOT, digest_file=digest)
    md = MetadataClient(config)
    await md.connect()
    try:
        out = []
        for ledger_id in await md.ledgers.list_ledger_ids():
            meta, _version = await md.ledgers.read(ledger_id)
            password = bytes(meta.password)
            if len(password) >= _PASSWORD_CHARS_MIN and password != _LEGACY_PASSWORD:
                out.append(password)
        return out
    finally:
        await md.close()


@pytest.fixture(scope="module")
def hidden(cluster: LocalCluster, workload: Workload) -> dict[str, str]:
    """What must appear nowhere: name -> text. Extend it for other secrets."""
    out: dict[str, str] = {}
    for i, secret in enumerate(load_secrets(str(cluster.dir / "auth" / "secret"))):
        out[f"cluster secret #{i}"] = secret.decode("ascii")
    for i, tok in enumerate(workload.tokens):
        out[f"token #{i}"] = tok
        out[f"signature of token #{i}"] = tok.rsplit(".", 1)[1]
    for name, token in sorted(_children_tokens(cluster).items()):
        out[f"service token of {name}"] = token
        out[f"signature of {name}'s token"] = token.rsplit(".", 1)[1]
    if cluster.ledger_secret_file is not None:
        out["ledger secret"] = read_secret(str(cluster.ledger_secret_file)).decode("ascii")
    if cluster.zk_digest_file is not None:
        out["ZooKeeper digest password"] = read_digest(str(cluster.zk_digest_file))[1]
    for i, password in enumerate(asyncio.run(_ledger_passwords(cluster))):
        out[f"ledger password #{i} (hex)"] = password.hex()
        if password.isascii() and password.decode("ascii").isprintable():
            out[f"ledger password #{i}"] = password.decode("ascii")
    return out


def _children_tokens(cluster: LocalCluster) -> dict[str, str]:
    """The token each child was started with (``$BOOKLINE_TOKEN``: the services' own,
    for the bookies), read from its environment."""
    out = {}
    for info in cluster.bookies + cluster.write_proxies + cluster.read_proxies:
        environ = Path(f"/proc/{info.proc.pid}/environ").read_bytes().split(b"\0")
        for entry in environ:
            if entry.startswith(TOKEN_ENV.encode() + b"="):
                out[info.name] = entry.split(b"=", 1)[1].decode()
    return out


def _log_texts(cluster: LocalCluster) -> dict[str, str]:
    logs = {str(p): p.read_text(errors="replace") for p in Path(cluster.dir).rglob("*.log")}
    assert len(logs) >= 5, sorted(logs)  # ZooKeeper, 3 bookies, 2 proxies at least
    return logs


async def _metrics_texts(cluster: LocalCluster) -> dict[str, str]:
    out = {}
    async with aiohttp.ClientSession() as http:
        for info in cluster.bookies + cluster.write_proxies + cluster.read_proxies:
            url = info.extra["metrics"]
            async with http.get(url) as resp:
                assert resp.status == 200, url
                out[url] = await resp.text()
    return out


def _leaks(texts: dict[str, str], hidden: dict[str, str]) -> list[str]:
    return [
        f"{what} in {where}"
        for where, text in texts.items()
        for what, value in hidden.items()
        if value in text
    ]


def test_no_secret_in_logs_metrics_or_error_bodies(
    cluster: LocalCluster, workload: Workload, hidden: dict[str, str]
) -> None:
    assert len(hidden) >= 7  # the secret, three tokens and their signatures
    if cluster.ledger_secret_file is not None:  # bookies with auth: their secrets too
        assert "ledger secret" in hidden and any(k.startswith("service token") for k in hidden)
    assert len(workload.error_bodies) == 8
    for body in workload.error_bodies:
        assert '"code"' in body or "(" in body, body  # the documented error shapes
    texts = {
        **_log_texts(cluster),
        **asyncio.run(_metrics_texts(cluster)),
        **{f"error body #{i}": b for i, b in enumerate(workload.error_bodies)},
    }
    assert _leaks(texts, hidden) == []


def test_the_search_finds_a_planted_secret(hidden: dict[str, str]) -> None:
    """The check is not vacuous: a log line carrying a token is found."""
    token = next(v for k, v in hidden.items() if k == "token #1")
    planted = {"some.log": f"INFO request with Authorization: Bearer {token}\n"}
    assert _leaks(planted, hidden) == ["token #1 in some.log", "signature of token #1 in some.log"]
