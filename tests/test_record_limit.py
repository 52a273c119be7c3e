"""One record-size limit end to end (issue 12 defect 11).

The thin client, the write proxy and the core writer all accept records up to
``foundation.limits.RECORD_BYTES_MAX`` (1 MiB: value + key + headers) and refuse one byte
more with TOO_LARGE. Before, the core writer stopped at its 512 KiB buffer, so a record
the proxy advertised as fine failed further down.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator

import pytest

from bookline import LogRecord, Namespace, NamespaceConfig, ProxyClient
from foundation.errors import TooLargeError
from foundation.limits import RECORD_BYTES_MAX, record_bytes
from tests.conftest import BookieCluster
from tests.values import values
from thinclient.client import ClientConfig

pytestmark = pytest.mark.integration

_names = itertools.count()


def test_record_bytes_counts_value_key_and_headers() -> None:
    assert record_bytes(b"abc", None, None) == 3
    assert record_bytes(b"abc", b"k", {"h": b"vv", "é": b""}) == 3 + 1 + 3 + 2
    # Bookline's own headers (the proxy's producer id and sequence) are not the user's
    assert record_bytes(b"abc", None, {"bl.producer": b"p" * 40}) == 3


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk,
        bookie_cluster.root,
        f"rl{os.getpid()}-{next(_names)}",
        NamespaceConfig(session_timeout_ms=4000),
    )
    try:
        yield n
    finally:
        await n.close()


async def test_core_writer_takes_a_record_of_the_limit_and_refuses_one_more_byte(
    ns: Namespace,
) -> None:
    await ns.create_stream("big")
    w = await ns.open_writer("big")
    biggest = bytes(range(256)) * (RECORD_BYTES_MAX // 256)
    try:
        d1 = await w.write(LogRecord(b"small"))
        d2 = await w.write(LogRecord(biggest))
        with pytest.raises(TooLargeError):
            w.write_nowait(LogRecord(biggest + b"x"))
        with pytest.raises(TooLargeError):
            w.write_nowait(LogRecord(biggest[:-1], key=b"kk"))
        many = await w.write_many([LogRecord(b"a"), LogRecord(biggest), LogRecord(b"b")])
        with pytest.raises(TooLargeError):
            await w.write_many([LogRecord(b"a"), LogRecord(biggest, headers={"h": b""})])
    finally:
        await w.close()
    assert d1 < d2 < many[0] < many[1] < many[2]
    reader = await ns.open_reader("big", "earliest")
    try:
        got: list[bytes] = []
        while len(got) < 5:
            batch = await reader.read_many(10, timeout_s=10)
            assert batch
            got.extend(values(batch))
    finally:
        await reader.close()
    assert got == [b"small", biggest, b"a", biggest, b"b"]


async def test_thin_client_writes_a_record_of_the_limit_through_the_proxy(
    proxy_cluster: object,
) -> None:
    from ops.cluster.local import LocalCluster

    assert isinstance(proxy_cluster, LocalCluster)
    client = ProxyClient(
        write_urls=[p.extra["url"] for p in proxy_cluster.write_proxies],
        read_urls=[p.extra["url"] for p in proxy_cluster.read_proxies],
        config=ClientConfig(retry_deadline_ms=20_000),
    )
    await client.start()
    stream = f"limit-{uuid.uuid4().hex[:8]}"
    biggest = b"z" * RECORD_BYTES_MAX
    try:
        await client.create_stream(stream)
        dlsn = await client.write(stream, biggest)
        with pytest.raises(TooLargeError):
            await client.write(stream, biggest + b"!")
        # Long-poll: under load the record may reach readers a LAC round trip after its ack.
        page = await client.read(stream, str(dlsn), limit=1, wait_ms=10_000)
        assert [r.payload for r in page.records] == [biggest]
    finally:
        await client.close()
