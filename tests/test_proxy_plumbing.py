"""Proxy and thin-client plumbing without a cluster: the write proxy's test-only stall
middleware (installed only when configured, it stalls only new durable writes to the
matching streams), the thin client reading ``cluster.json`` and the blocking client on
the shared loop thread."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from foundation.errors import BadRequestError, ConfigError
from httpapi import wire, writes
from httpapi.server import proxy_app
from thinclient.client import ProxyClient, SyncProxyClient
from writeproxy.config import WriteProxyConfig
from writeproxy.faults import fault_middlewares
from writeproxy.metrics import WriteProxyMetrics

# -- the stall middleware -------------------------------------------------------------


def test_no_fault_middleware_unless_configured() -> None:
    assert fault_middlewares(WriteProxyConfig()) == []
    assert len(fault_middlewares(WriteProxyConfig(fault_stall_writes=1, fault_stall_ms=5))) == 1


async def _write(request: web.Request) -> web.Response:
    """Answers as the write proxy does: ``?n=`` records, ``?dups=`` of them retries."""
    if "fail" in request.query:
        raise BadRequestError("refused")
    n, dups = int(request.query["n"]), int(request.query.get("dups", "0"))
    media = wire.negotiate(request.headers.get("Accept"))
    answer = writes.write_answer([(1, 2, i) for i in range(n)], media, dups)
    return web.Response(body=wire.encode_body(answer, media), content_type=media)


async def test_stall_middleware_stalls_only_new_durable_writes_to_fault_streams() -> None:
    stalls: list[float] = []

    async def sleep(seconds: float) -> None:
        stalls.append(seconds)

    config = WriteProxyConfig(fault_stall_writes=3, fault_stall_ms=1500)
    metrics = WriteProxyMetrics()
    app = proxy_app(
        health=_write,
        registry=metrics.registry,
        requests=metrics.requests,
        middlewares=fault_middlewares(config, sleep=sleep),
    )
    app.router.add_post(f"{wire.API_PREFIX}/streams/{{name}}/records", _write)
    app.router.add_post(f"{wire.API_PREFIX}/streams/{{name}}/heartbeat", _write)
    msgpack_only = {"Accept": wire.MSGPACK}
    async with TestClient(TestServer(app)) as client:

        async def post(path: str, **headers: str) -> int:
            resp = await client.post(f"{wire.API_PREFIX}/streams/{path}", headers=headers)
            return resp.status

        assert await post("other/records?n=2") == 200  # not a fault-* stream
        assert await post("fault-a/records?n=2&dups=2") == 200  # retries only
        assert await post("fault-a/records?n=1&fail=1") == 400  # refused
        assert await post("fault-a/heartbeat?n=1") == 200  # not a write
        assert stalls == []
        assert await post("fault-a/records?n=1") == 200  # JSON answer
        assert await post("fault-a/records?n=3&dups=2", **msgpack_only) == 200
        assert await post("fault-b/records?n=1", **msgpack_only) == 200
        assert stalls == [1.5, 1.5, 1.5]
        assert await post("fault-c/records?n=1") == 200  # the three stalls are spent
        assert stalls == [1.5, 1.5, 1.5]


# -- the thin client's cluster file and loop thread ----------------------------------


def _cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(
        json.dumps(
            {
                "zk": "127.0.0.1:1/chroot",
                "root": "/bookline",
                "write_proxies": [{"url": "http://127.0.0.1:1/"}],
                "read_proxies": [{"url": "http://127.0.0.1:2"}],
            }
        )
    )
    return path


def test_clients_from_a_missing_or_malformed_cluster_file_say_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        ProxyClient.from_cluster_file(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="does not exist"):
        SyncProxyClient.from_cluster_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"zk": ')
    with pytest.raises(ConfigError, match="not JSON"):
        ProxyClient.from_cluster_file(bad)


async def test_proxy_client_from_cluster_file(tmp_path: Path) -> None:
    path = _cluster_file(tmp_path)
    client = ProxyClient.from_cluster_file(path)
    assert client.route("s") == "http://127.0.0.1:1"
    zk_client = ProxyClient.from_cluster_file(path, use_zk=True)
    assert zk_client._proxies.write_urls == []  # discovered once started


def test_sync_client_runs_on_a_loop_thread_and_stops_it(tmp_path: Path) -> None:
    def loop_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "bookline-proxy-client"]

    before = len(loop_threads())
    with SyncProxyClient.from_cluster_file(_cluster_file(tmp_path)) as client:
        assert len(loop_threads()) == before + 1
        with pytest.raises(BadRequestError, match="position"):
            client.read("s", "nowhere")  # refused before any request
    assert len(loop_threads()) == before
