"""Producer epochs: a failed batch does not wedge a thin-client producer (issue 12
defect 6), and idempotence holds across the epoch bump, also across a failover.

Before epochs the client gave each record its sequence number when it was queued and
never took it back, while the proxy refuses a known producer whose sequence jumps
ahead: after one failed batch every later write of that client to that stream failed
with OUT_OF_ORDER_SEQUENCE after the whole retry deadline. Real processes (the shared
proxy cluster: ZooKeeper, 3 bookies, 2 write proxies, a read proxy).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import aiohttp
import pytest

from bookline import Namespace, NamespaceConfig
from foundation.errors import BadRequestError, BooklineError
from httpapi import writes
from ops.cluster import procs
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from streams.dlsn import DLSN
from tests.test_proxy_integration import _metric, _read_all, _rurl, _wurls
from tests.waiting import scaled, wait_for
from thinclient.client import ClientConfig, ProxyClient
from thinclient.routing import rendezvous

pytestmark = pytest.mark.integration

# Short enough that the wedge of before shows within seconds, not 30.
CONFIG = ClientConfig(
    batch_bytes_max=1 << 20, buffer_bytes_max=8 << 20, proxy_down_ms=1_000, retry_deadline_ms=5_000
)
# Reserved header names are refused by the proxy (400): a batch that fails for good.
BAD = writes.WireRecord(b"bad", headers=[("bl.forged", b"1")])


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _client(cluster: LocalCluster, config: ClientConfig = CONFIG) -> ProxyClient:
    return ProxyClient(write_urls=_wurls(cluster), read_urls=[_rurl(cluster)], config=config)


async def test_a_producer_writes_again_at_once_after_a_failed_batch(
    proxy_cluster: LocalCluster,
) -> None:
    s = f"epoch-{_uid()}"
    async with _client(proxy_cluster) as c:
        first = await c.write(s, b"a")
        with pytest.raises(BadRequestError, match="reserved"):
            await c.write(s, BAD)
        started = time.monotonic()
        second = await c.write(s, b"b")
        took_s = time.monotonic() - started
        again = await c.write_many(s, [b"c", b"d"])
        assert await _read_all(c, s) == [b"a", b"b", b"c", b"d"]
    assert first < second < again[0] < again[1]
    # Within one retry interval (the first backoff is 20 ms; the proxy's reorder wait,
    # which a stuck sequence would sit out first, is 500 ms).
    # (Scaled on a loaded machine: tests.waiting.)
    assert took_s < scaled(0.5), f"the next write took {took_s:.1f} s"


async def test_pipelined_writes_after_a_failed_request_go_on_in_order(
    proxy_cluster: LocalCluster,
) -> None:
    """Requests in flight behind the failed one are refused for the gap it leaves; they
    are sent again in the next epoch, in order, and nothing is written twice."""
    config = dataclasses.replace(CONFIG, batch_records_max=7, requests_in_flight_per_stream=5)
    s = f"epoch-pipe-{_uid()}"
    async with _client(proxy_cluster, config) as c:
        await c.write(s, b"first")
        records: list[bytes | writes.WireRecord] = [b"r%03d" % i for i in range(200)]
        records[60] = BAD
        futures = [c.write_nowait(s, r) for r in records]
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
        assert 60 in failed and len(failed) <= config.batch_records_max, failed
        assert all(isinstance(results[i], BadRequestError) for i in failed), results
        written = [records[i] for i in range(200) if i not in failed]
        assert await _read_all(c, s) == [b"first", *written]
        dlsns = [r for r in results if isinstance(r, DLSN)]
        assert dlsns == sorted(dlsns)
        assert len(set(dlsns)) == len(dlsns)
        assert await c.write(s, b"last") > dlsns[-1]


async def test_a_retry_across_a_failover_after_an_epoch_bump_writes_nothing_twice(
    proxy_cluster: LocalCluster,
) -> None:
    """The new epoch's first record is durable, its answer is lost with its proxy
    (kill -9 while the test-only fault hook stalls the answer), and the retry reaches
    the survivor: it must find (producer, epoch, seq) in the log and answer the original
    position, not write the record again as the start of a new epoch."""
    s = f"fault-epoch-{_uid()}"  # fault-*: the proxies stall new writes' answers 1.5 s
    urls = _wurls(proxy_cluster)
    victim = next(p for p in proxy_cluster.write_proxies
                  if p.extra["url"] == rendezvous(s, urls))  # fmt: skip
    survivor = next(u for u in urls if u != victim.extra["url"])
    config = dataclasses.replace(CONFIG, retry_deadline_ms=30_000)
    async with _client(proxy_cluster, config) as c, aiohttp.ClientSession() as http:
        await c.write(s, b"a")
        with pytest.raises(BooklineError, match="reserved"):
            await c.write(s, BAD)
        dups_before = await _metric(
            http, f"{survivor}/metrics", "bookline_writeproxy_duplicate_records_total"
        )
        pending = asyncio.ensure_future(c.write(s, b"b"))
        killed = False
        try:

            async def durable_unanswered() -> bool:
                if pending.done():
                    pytest.fail(f"b answered before it was in the log: {pending.exception()}")
                return await _read_all(c, s) == [b"a", b"b"]

            await wait_for(durable_unanswered, "b durable, its answer still stalled", timeout_s=10)
            procs.kill9(victim.proc)
            killed = True
            b_dlsn = await asyncio.wait_for(pending, 40)
            c_dlsn = await c.write(s, b"c")
        finally:
            pending.cancel()
            if killed:
                await asyncio.to_thread(proxy_cluster.restart_proxy, victim)
        assert await c.owner(s) == survivor
        assert await _read_all(c, s) == [b"a", b"b", b"c"]
        positions: list[DLSN] = []
        pos = "earliest"
        while page := (await c.read(s, pos, limit=10)).records:  # pages end at segments
            positions.extend(r.dlsn for r in page)
            pos = f"seq:{page[-1].sequence_id + 1}"
        assert positions[1:] == [b_dlsn, c_dlsn], "answered where they are in the log"
        dups = await _metric(
            http, f"{survivor}/metrics", "bookline_writeproxy_duplicate_records_total"
        )
        assert dups - dups_before >= 1, "the retry was answered as a duplicate"
    # Issue 24: the markers the survivor rebuilt its table from are no headers: a core
    # reader sees none (they were bl.* headers, and core readers returned them).
    core = await Namespace.open(proxy_cluster.zk_connect, CLUSTER_ROOT, "default",
                                NamespaceConfig(session_timeout_ms=4000))  # fmt: skip
    try:
        seg = (await core.stream_info(s)).segments
        recs = [r for x in seg for r in await core.read_entries(s, x.seqno, 0, x.last_entry_id)]
    finally:
        await core.close()
    assert [(r.payload, r.headers) for r in recs] == [(b"a", None), (b"b", None), (b"c", None)]
