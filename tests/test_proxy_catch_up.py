"""Catch-up reads through a read proxy as record sets (``GET .../recordsets``): the
proxy hands the entries through as stored, the thin client decodes them -- every
record, in order, with the sequence ids and DLSNs a page read gives."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from foundation.errors import NotFoundError
from ops.cluster.local import LocalCluster
from streams.records import ReadRecord
from thinclient.client import ClientConfig, ProxyClient

pytestmark = pytest.mark.integration

CLIENT_CONFIG = ClientConfig(batch_bytes_max=1 << 20, buffer_bytes_max=8 << 20)


@pytest.fixture
async def client(proxy_cluster: LocalCluster) -> AsyncIterator[ProxyClient]:
    c = ProxyClient(
        write_urls=[p.extra["url"] for p in proxy_cluster.write_proxies],
        read_urls=[p.extra["url"] for p in proxy_cluster.read_proxies],
        config=CLIENT_CONFIG,
    )
    await c.start()
    try:
        yield c
    finally:
        await c.close()


async def _collect(client: ProxyClient, stream: str, start: str, n: int) -> list[ReadRecord]:
    out: list[ReadRecord] = []
    batches = client.catch_up(stream, start)
    try:
        async for batch in batches:
            out.extend(batch)
            if len(out) >= n:
                break
    finally:
        await batches.aclose()
    return out


async def test_catch_up_reads_every_record_as_a_page_would(client: ProxyClient) -> None:
    stream = f"catchup-{uuid.uuid4().hex[:8]}"
    payloads = [f"r{i:06d}".encode() * 3 for i in range(30_000)]
    for i in range(0, len(payloads), 5_000):
        await client.write_many(stream, payloads[i : i + 5_000])
    got = await _collect(client, stream, "earliest", len(payloads))
    assert [r.payload for r in got] == payloads
    assert [r.sequence_id for r in got] == list(range(len(payloads)))
    page = await client.read(stream, "seq:12345", limit=3)
    assert [(r.dlsn, r.payload) for r in page.records] == [
        (r.dlsn, r.payload) for r in got[12345:12348]
    ]
    # From inside a record set: the first record is the one asked for.
    mid = await _collect(client, stream, "seq:12345", len(payloads) - 12345)
    assert [r.sequence_id for r in mid] == list(range(12345, len(payloads)))


async def test_catch_up_of_a_missing_stream_is_not_found(client: ProxyClient) -> None:
    batches = client.catch_up(f"missing-{uuid.uuid4().hex[:8]}")
    with pytest.raises(NotFoundError):
        await batches.__anext__()
    await batches.aclose()
