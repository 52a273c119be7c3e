"""Write proxies starting, stopping and restarting as real processes (issue 12).

* A starting write proxy (listening, not yet connected to ZooKeeper) answers a
  retriable 503, and the thin client waits for it instead of failing the write.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiohttp
import pytest

from bookline import http_api
from bookline.client import ClientConfig, ProxyClient
from bookline.errors import for_code
from ops import procs
from ops.local import CLUSTER_ROOT, LOCAL_CHROOT, LocalCluster
from tests import proxy_support
from tests.proxy_support import GatedForwarder

pytestmark = pytest.mark.integration


def _uid() -> str:
    return uuid.uuid4().hex[:8]


async def test_a_starting_write_proxy_answers_a_retriable_503_and_the_client_waits(
    proxy_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Issue 12 defect 8: the proxy listens before its ZooKeeper session is up; writes
    in that window got 500 UNKNOWN "write proxy not started", which the client does not
    retry (30 records failed so across a cluster restart)."""
    assert proxy_cluster.zk is not None
    zk_port = int(proxy_cluster.zk.connect_string.rsplit(":", 1)[1])
    gate = await GatedForwarder(zk_port).start()
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "writeproxy.log"
    proc = proxy_support.spawn_write_proxy(
        f"127.0.0.1:{gate.port}{LOCAL_CHROOT}", CLUSTER_ROOT, log_path,
        proxy_id=f"wp-start-{_uid()}", port=port,
    )
    try:
        await proxy_support.wait_listening(url)
        stream = f"starting-{_uid()}"
        async with aiohttp.ClientSession() as session, session.post(
            f"{url}/v1/streams/{stream}/records", json={"payload": "x"}
        ) as resp:
            body = await resp.json()
        assert resp.status == 503, (resp.status, body)
        error = http_api.decode_error(body, resp.status)
        assert error.retriable and type(error) is type(for_code(body["code"])), body

        config = ClientConfig(retry_deadline_ms=30_000, backoff_max_ms=200)
        async with ProxyClient(write_urls=[url], config=config) as client:
            write = asyncio.ensure_future(client.write(stream, b"after start"))
            await asyncio.sleep(1.0)
            assert not write.done(), "the write waits while the proxy starts"
            gate.open()
            await proxy_support.wait_ready(proc, log_path)
            dlsn = await asyncio.wait_for(write, 30)
            assert client.retries >= 1
        assert dlsn.segment_seqno >= 1
    finally:
        await proxy_support.stop(proc)
        await gate.close()
