"""Reads while every bookie is down: an error with a stable code, never "no records".

A read proxy answered ``GET .../records?from=earliest`` of a stream holding records with
200 and an empty page when its fresh reader had not got a record within 300 ms -- and
with every bookie down, most concurrent reads did just that. A core reader waiting at
the LAC returned nothing for ever while its long polls failed. Here: records written,
every bookie killed (kill -9), each read fails with a retriable error; bookies back,
every record is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from foundation.errors import BooklineError, ConnectionLostError, TimeoutError_
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from streams.config import NamespaceConfig
from streams.dlsn import StartPosition
from streams.namespace import Namespace
from streams.records import LogRecord
from tests.cluster_support import kill_bookies, restart_bookies
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

STREAMS = 6
RECORDS = 3
CONCURRENT_READS = 30
# Restarted bookies, readers reopened: a loaded machine gets room.
RECOVERY_S = 90.0
REQUEST_TIMEOUT_S = 60.0
# The errors an outage may be answered with (each retriable, HTTP 503/504).
OUTAGE_CODES = {"CONNECTION_LOST", "NOT_ENOUGH_BOOKIES", "TIMEOUT", "UNAVAILABLE"}
# What a write right after the outage may be answered with (retriable, 503).
RETRIED_WRITE = OUTAGE_CODES | {"OUTCOME_UNKNOWN"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("outage"), bookies=3, write_proxies=1,
                     read_proxies=1)  # fmt: skip
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield session


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        body = await resp.read()
        if resp.content_type == "application/json":
            return resp.status, await resp.json()
        return resp.status, body


def _is_outage_error(status: int, body: Any) -> bool:
    return status in (503, 504) and isinstance(body, dict) and body.get("name") in OUTAGE_CODES


async def test_proxy_reads_fail_while_every_bookie_is_down_and_recover_every_record(
    cluster: LocalCluster, http: aiohttp.ClientSession
) -> None:
    wp, rp = str(cluster.write_proxies[0].extra["url"]), str(cluster.read_proxies[0].extra["url"])
    tag = uuid.uuid4().hex[:8]
    streams = [f"outage-{tag}-{i}" for i in range(STREAMS)]
    for name in streams:
        for j in range(RECORDS):
            async with http.post(f"{wp}/v1/streams/{name}/records", json={"payload": f"r{j}"}) as r:
                assert r.status == 200, await r.text()
    kill_bookies(cluster)
    try:
        # Never read before: each stream's first page, its record sets, and many
        # concurrent pages of one stream -- every answer an error, none a 200.
        pages = [f"{rp}/v1/streams/{n}/records?from=earliest&limit=1" for n in streams]
        sets = [f"{rp}/v1/streams/{n}/recordsets?from=earliest" for n in streams[:2]]
        answers = [await _get(http, u) for u in pages + sets]
        burst = [pages[1]] * CONCURRENT_READS
        answers += await asyncio.gather(*(_get(http, u) for u in burst))
        wrong = [(u, s, b) for u, (s, b) in zip(pages + sets + burst, answers, strict=True)
                 if not _is_outage_error(s, b)]  # fmt: skip
        assert not wrong, f"{len(wrong)} reads not an outage error: {wrong[:3]}"
    finally:
        await restart_bookies(cluster, RECOVERY_S)
    # The writer's next add carries the LAC the restarted bookies forgot (their explicit
    # LAC is not kept across a restart): only then is the last record readable.
    # The owner's writer may have failed while its bookies were gone: its answer is then
    # a retriable error (OUTCOME_UNKNOWN), retried as a client does -- so "after" may be
    # stored more than once, never a record before it.
    for name in streams:

        async def wrote(name: str = name) -> bool:
            url = f"{wp}/v1/streams/{name}/records"
            async with http.post(url, json={"payload": "after"}) as r:
                if r.status == 200:
                    return True
                body = await r.json()
                assert r.status == 503 and body["name"] in RETRIED_WRITE, (r.status, body)
                return False

        # Twice: the second add carries the LAC that makes the first readable even
        # when the writer's explicit LAC is lost (kept in the bookies' memory only).
        await _eventually(wrote)
        await _eventually(wrote)
    want = [f"r{j}" for j in range(RECORDS)]
    for name in streams:
        got: list[str] = []

        async def read_all(name: str = name, got: list[str] = got) -> bool:
            status, body = await _get(http, f"{rp}/v1/streams/{name}/records?from=earliest")
            if status != 200:
                assert _is_outage_error(status, body), (status, body)
                return False
            got[:] = [rec["payload"] for rec in body["records"]]
            return len(got) > RECORDS

        await _eventually(read_all)
        assert got[:RECORDS] == want and set(got[RECORDS:]) == {"after"}, got


async def _eventually(check: Any, what: str = "the cluster to serve again") -> None:
    await wait_for(check, what, timeout_s=RECOVERY_S, interval_s=0.1)


async def test_core_reader_raises_while_every_bookie_is_down_and_reads_on_after(
    cluster: LocalCluster,
) -> None:
    ns = await Namespace.open(cluster.zk_connect, CLUSTER_ROOT, f"outage-{uuid.uuid4().hex[:8]}",
                              NamespaceConfig(session_timeout_ms=10_000))  # fmt: skip
    try:
        await ns.create_stream("s")
        writer = await ns.open_writer("s")
        await writer.write_many([LogRecord(f"r{j}".encode()) for j in range(RECORDS)])
        reader = await ns.open_reader("s", StartPosition.earliest())
        try:
            got = [r.payload async for r in _take(reader, RECORDS)]
            await reader.settle(RECOVERY_S)
            assert reader.caught_up  # read to the LAC, its long polls answered
            kill_bookies(cluster)
            try:
                # At the LAC with nothing answering: a timed read says why nothing came
                # (once a long poll failed; before, it returned nothing for ever).
                down = "the reader to fail while every bookie is down"
                await _eventually(lambda: _raises(reader.settle(RECOVERY_S)), down)
                await _eventually(lambda: _raises(reader.read_many(10, timeout_s=RECOVERY_S)), down)
                # A fresh reader of records it cannot read fails as well.
                fresh = await ns.open_reader("s", StartPosition.earliest())
                try:
                    with pytest.raises(BooklineError) as err:
                        await fresh.read_many(10, timeout_s=RECOVERY_S)
                    assert err.value.retriable, err.value
                finally:
                    await fresh.close()
            finally:
                await restart_bookies(cluster, RECOVERY_S)
            await writer.write(LogRecord(b"after"))  # carries the LAC (see the proxy test)

            async def more() -> bool:
                # Still reconnecting: the same reader goes on.
                with contextlib.suppress(ConnectionLostError, TimeoutError_):
                    got.extend(r.payload for r in await reader.read_many(10, timeout_s=1.0))
                return len(got) > RECORDS

            await _eventually(more)
            assert got == [*(f"r{j}".encode() for j in range(RECORDS)), b"after"]
        finally:
            await reader.close()
            await writer.close()
    finally:
        await ns.close()


async def _raises(read: Any) -> bool:
    """True when ``read`` raised an outage error; False when it gave nothing."""
    try:
        got = await read
    except (ConnectionLostError, TimeoutError_):
        return True
    assert not got, got  # no record exists past the LAC here
    return False


async def _take(reader: Any, n: int) -> AsyncIterator[Any]:
    for _ in range(n):
        rec = await reader.read_next(RECOVERY_S)
        assert rec is not None
        yield rec
