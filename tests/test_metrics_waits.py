"""Issue 22, item 9: "read latency is mostly long-poll waiting". A caught-up consumer's
long polls made the read proxy's request latency (and the dashboard's "read" line)
hundreds of milliseconds, and the bookies' READ_LAC timing likewise. The wait for new
data is now its own family (``bookline_readproxy_long_poll_wait_seconds``,
``bookline_bookie_long_poll_wait_seconds``) and not in the serving latency.

The checks are on where the time goes, not on how fast anything is: a long poll that
times out after ``WAIT_MS`` has waited at least that long by definition; that wait
must be in the wait family, and the serving family must not have grown by it.
"""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from foundation.waits import waiting
from httpapi.monitoring import latency_middleware
from ops.cluster.local import LocalCluster
from tests.metrics_support import get_msgpack, post_msgpack, sample_sum, scrape

# The long polls' wait: every one of them times out (nothing is written meanwhile).
WAIT_MS = 1000


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _split(text: str, route: str) -> tuple[float, float, float]:
    """(serving seconds, waited seconds, requests that waited) on ``route``."""
    label = f'endpoint="{route}"'
    return (
        sample_sum(text, "bookline_readproxy_request_seconds_sum", label),
        sample_sum(text, "bookline_readproxy_long_poll_wait_seconds_sum", label),
        sample_sum(text, "bookline_readproxy_long_poll_wait_seconds_count", label),
    )


async def _assert_poll_is_a_wait(
    session: aiohttp.ClientSession, rurl: str, route: str, poll_url: str, polls: int
) -> None:
    before = _split(await scrape(session, f"{rurl}/metrics"), route)
    for _ in range(polls):
        await get_msgpack(session, poll_url)  # caught up: each one waits WAIT_MS for nothing
    after = _split(await scrape(session, f"{rurl}/metrics"), route)
    served, waited, waits = (a - b for a, b in zip(after, before, strict=True))
    assert waits == polls, (route, before, after)
    assert waited >= polls * WAIT_MS / 1000 * 0.9, (route, before, after)  # timer slack
    # the polls' waits are not serving time: serving grew by far less than they waited
    assert served < waited / 4, (route, served, waited)


@pytest.mark.integration
async def test_a_caught_up_long_poll_is_a_wait_not_serving_time(
    proxy_cluster: LocalCluster,
) -> None:
    wurl = str(proxy_cluster.write_proxies[0].extra["url"])
    rurl = str(proxy_cluster.read_proxies[0].extra["url"])
    stream, topic = f"m-wait-{_uid()}", f"m-wait-{_uid()}"
    async with aiohttp.ClientSession() as session:
        await post_msgpack(
            session, f"{wurl}/v1/streams/{stream}/records", {"payloads": [b"a", b"b"]}
        )
        await post_msgpack(session, f"{wurl}/v1/topics", {"name": topic, "partitions": 1})
        await post_msgpack(
            session, f"{wurl}/v1/topics/{topic}/partitions/0/records", {"payloads": [b"x"]}
        )
        # a stream page past the end: the shared feed's long poll
        await _assert_poll_is_a_wait(
            session, rurl, "/v1/streams/{name}/records",
            f"{rurl}/v1/streams/{stream}/records?from=seq:2&wait_ms={WAIT_MS}", polls=2,
        )  # fmt: skip
        # a consumer's fetch past a partition's end: a private reader's long poll
        await _assert_poll_is_a_wait(
            session, rurl, "/v1/topics/{topic}/partitions/{partition}/records",
            f"{rurl}/v1/topics/{topic}/partitions/0/records?offset=1&wait_ms={WAIT_MS}",
            polls=2,
        )  # fmt: skip


@pytest.mark.integration
async def test_a_bookie_read_lac_long_poll_is_a_wait_not_serving_time(
    proxy_cluster: LocalCluster,
) -> None:
    """The read proxy's readers of a caught-up stream long-poll the bookies (READ_LAC);
    a write ends their polls after they waited at least ``WAIT_MS``."""
    wurl = str(proxy_cluster.write_proxies[0].extra["url"])
    rurl = str(proxy_cluster.read_proxies[0].extra["url"])
    bookies = [str(b.extra["metrics"]) for b in proxy_cluster.bookies]
    stream = f"m-lacwait-{_uid()}"

    async def totals(session: aiohttp.ClientSession) -> tuple[float, float]:
        texts = [await scrape(session, url) for url in bookies]
        serving = sum(
            sample_sum(t, "bookline_bookie_request_seconds_sum", 'op="READ_LAC"') for t in texts
        )
        waited = sum(sample_sum(t, "bookline_bookie_long_poll_wait_seconds_sum") for t in texts)
        return serving, waited

    async with aiohttp.ClientSession() as session:
        await post_msgpack(session, f"{wurl}/v1/streams/{stream}/records", {"payloads": [b"a"]})
        before = await totals(session)
        # the feed opened for this poll follows the stream: its reader is caught up
        await get_msgpack(
            session, f"{rurl}/v1/streams/{stream}/records?from=seq:1&wait_ms={WAIT_MS}"
        )
        await post_msgpack(session, f"{wurl}/v1/streams/{stream}/records", {"payloads": [b"b"]})
        await get_msgpack(session, f"{rurl}/v1/streams/{stream}/records?from=seq:1&wait_ms=30000")
        after = await totals(session)
    served, waited = after[0] - before[0], after[1] - before[1]
    assert waited >= WAIT_MS / 1000 * 0.9, (before, after)
    assert served < waited / 4, (served, waited)


async def test_only_the_request_task_s_own_waits_are_counted() -> None:
    """Pure: the middleware keeps a request's waits apart from its serving time; a task
    the request started (a feed's pump) waits on nobody's account."""
    registry = CollectorRegistry()
    serving = Histogram("t_request_seconds", "", ["method", "endpoint"], registry=registry)
    waits = Histogram("t_wait_seconds", "", ["method", "endpoint"], registry=registry)

    async def wait_a_while() -> None:
        with waiting():
            await asyncio.sleep(0.3)  # the wait being measured

    async def own(request: web.Request) -> web.Response:
        await wait_a_while()
        return web.Response(text="ok")

    async def pump(request: web.Request) -> web.Response:
        await asyncio.get_running_loop().create_task(wait_a_while())
        return web.Response(text="ok")

    app = web.Application(middlewares=[latency_middleware(serving, waits)])
    app.router.add_get("/own", own)
    app.router.add_get("/pump", pump)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/own")).status == 200
        assert (await client.get("/pump")).status == 200
    text = generate_latest(registry).decode()
    own_label, pump_label = 'endpoint="/own"', 'endpoint="/pump"'
    assert sample_sum(text, "t_wait_seconds_count", own_label) == 1
    assert sample_sum(text, "t_wait_seconds_sum", own_label) >= 0.3
    assert sample_sum(text, "t_wait_seconds_count", pump_label) == 0  # not the request's
    assert sample_sum(text, "t_request_seconds_count", own_label) == 1
    assert sample_sum(text, "t_request_seconds_sum", pump_label) >= 0.3
