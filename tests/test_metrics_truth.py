"""Issue 16, "metrics that tell the truth": each defect the newcomers reported, against
the shared proxy cluster (ZooKeeper, 3 bookies, 2 write proxies, a read proxy; real
processes). Each test failed on the code before its fix (see the commit messages).
"""

from __future__ import annotations

import io
import re
import uuid

import aiohttp
import pytest

from httpapi import wire
from ops.cluster.local import LocalCluster
from tests.metrics_support import family_types, sample_sum, scrape

pytestmark = pytest.mark.integration


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _wurl(cluster: LocalCluster, i: int = 0) -> str:
    return str(cluster.write_proxies[i].extra["url"])


def _rurl(cluster: LocalCluster) -> str:
    return str(cluster.read_proxies[0].extra["url"])


def _bookie_base(cluster: LocalCluster, i: int = 0) -> str:
    return str(cluster.bookies[i].extra["metrics"]).removesuffix("/metrics")


async def _write(
    session: aiohttp.ClientSession, url: str, stream: str, payloads: list[bytes]
) -> aiohttp.ClientResponse:
    body = wire.encode_body({"payloads": payloads}, wire.MSGPACK)
    headers = {"Content-Type": wire.MSGPACK, "Accept": wire.MSGPACK}
    async with session.post(
        f"{url}/v1/streams/{stream}/records",
        data=io.BytesIO(body),
        headers=headers,
        allow_redirects=False,
    ) as resp:
        await resp.read()
        return resp


async def test_payload_bytes_and_acquisitions_move_under_load(proxy_cluster: LocalCluster) -> None:
    """Defect: ``bookline_writeproxy_payload_bytes_written_total`` and
    ``..._acquisitions_total`` stayed 0 under load (nothing incremented them)."""
    url = _wurl(proxy_cluster)
    async with aiohttp.ClientSession() as session:
        text = await scrape(session, f"{url}/metrics")
        bytes_before = sample_sum(text, "bookline_writeproxy_payload_bytes_written_total")
        acquired_before = sample_sum(text, "bookline_writeproxy_acquisitions_total")
        streams = [f"m-bytes-{_uid()}" for _ in range(3)]
        payloads = [b"x" * 100, b"y" * 250, b"z" * 7]
        for stream in streams:
            for _ in range(4):
                resp = await _write(session, url, stream, payloads)
                assert resp.status == 200, resp.status
        text = await scrape(session, f"{url}/metrics")
    written = sample_sum(text, "bookline_writeproxy_payload_bytes_written_total") - bytes_before
    acquired = sample_sum(text, "bookline_writeproxy_acquisitions_total") - acquired_before
    assert written == 3 * 4 * (100 + 250 + 7)
    assert acquired == 3


async def test_rejections_count_413s(proxy_cluster: LocalCluster) -> None:
    """Defect: ``bookline_writeproxy_rejected_total`` stayed 0 while 413s were counted in
    ``..._requests_total``: a refusal is a refusal, whatever its reason."""
    url = _wurl(proxy_cluster)
    too_big = [b"a" * (3 << 20)]  # the test cluster's proxies take bodies up to 2 MiB
    async with aiohttp.ClientSession() as session:
        before = sample_sum(
            await scrape(session, f"{url}/metrics"),
            "bookline_writeproxy_rejected_requests_total",
            'reason="too_large"',
        )
        resp = await _write(session, url, f"m-big-{_uid()}", too_big)
        assert resp.status == 413
        text = await scrape(session, f"{url}/metrics")
    after = sample_sum(text, "bookline_writeproxy_rejected_requests_total", 'reason="too_large"')
    assert after - before == 1
    assert sample_sum(text, "bookline_writeproxy_requests_total", 'status="413"') >= 1


async def test_bookie_storage_stats_are_typed_families(proxy_cluster: LocalCluster) -> None:
    """Defect: ``bookline_bookie_storage{stat=...}`` was one gauge mixing counters (adds,
    checkpoints) with sizes in bytes. Each figure is now its own family with its type
    and unit."""
    async with aiohttp.ClientSession() as session:
        text = await scrape(session, f"{_bookie_base(proxy_cluster)}/metrics")
    types = family_types(text)
    assert "bookline_bookie_storage" not in types
    assert not re.search(r"^bookline_bookie_storage\{stat=", text, re.M)
    assert types["bookline_bookie_storage_adds"] == "counter"
    assert types["bookline_bookie_storage_added_bytes"] == "counter"
    assert types["bookline_bookie_journal_groups"] == "counter"
    assert types["bookline_bookie_memtable_entries"] == "gauge"
    assert types["bookline_bookie_read_cache_bytes"] == "gauge"


async def test_proxies_have_latency_histograms_per_route(proxy_cluster: LocalCluster) -> None:
    """Defect: the proxies had no latency histograms."""
    url, rurl = _wurl(proxy_cluster), _rurl(proxy_cluster)
    stream = f"m-lat-{_uid()}"
    async with aiohttp.ClientSession() as session:
        assert (await _write(session, url, stream, [b"one", b"two"])).status == 200
        async with session.get(f"{rurl}/v1/streams/{stream}/records?from=earliest") as resp:
            assert resp.status == 200
        wtext = await scrape(session, f"{url}/metrics")
        rtext = await scrape(session, f"{rurl}/metrics")
    assert family_types(wtext)["bookline_writeproxy_request_seconds"] == "histogram"
    assert family_types(rtext)["bookline_readproxy_request_seconds"] == "histogram"
    route = 'endpoint="/v1/streams/{name}/records"'
    assert sample_sum(wtext, "bookline_writeproxy_request_seconds_count", route) >= 1
    assert sample_sum(rtext, "bookline_readproxy_request_seconds_count", route) >= 1


async def test_every_service_exports_process_metrics_and_no_created_series(
    proxy_cluster: LocalCluster,
) -> None:
    """Defects: no process metrics; every counter came with a ``_created`` twin."""
    urls = [
        f"{_bookie_base(proxy_cluster)}/metrics",
        f"{_wurl(proxy_cluster)}/metrics",
        f"{_rurl(proxy_cluster)}/metrics",
    ]
    async with aiohttp.ClientSession() as session:
        for url in urls:
            text = await scrape(session, url)
            assert sample_sum(text, "process_cpu_seconds_total") > 0, url
            assert sample_sum(text, "process_resident_memory_bytes") > 0, url
            assert "python_info" in family_types(text), url
            assert "_created" not in text, url


async def test_ledger_metrics_in_the_proxies(proxy_cluster: LocalCluster) -> None:
    """Defect: the ledger layer exported nothing: no add-to-ack latency for the core
    writer in a write proxy, no entry read latency for a read proxy's catch-up."""
    url, rurl = _wurl(proxy_cluster), _rurl(proxy_cluster)
    stream = f"m-ledger-{_uid()}"
    async with aiohttp.ClientSession() as session:
        for i in range(5):
            assert (await _write(session, url, stream, [b"r%d" % i] * 10)).status == 200
        async with session.get(
            f"{rurl}/v1/streams/{stream}/records?from=earliest&limit=100"
        ) as resp:
            assert resp.status == 200
        wtext = await scrape(session, f"{url}/metrics")
        rtext = await scrape(session, f"{rurl}/metrics")
    assert sample_sum(wtext, "bookline_ledger_add_seconds_count") >= 5
    assert sample_sum(rtext, "bookline_ledger_entry_read_seconds_count") >= 1
    for family in (
        "bookline_ledger_ensemble_changes",
        "bookline_ledger_speculative_reads",
        "bookline_ledger_speculative_reads_won",
        "bookline_ledger_recoveries",
    ):
        assert family_types(wtext)[family] == "counter"


async def test_bookie_health_is_json_not_the_metrics_text(proxy_cluster: LocalCluster) -> None:
    """Defect: a bookie's ``/health`` answered the metrics text (every path did)."""
    base = _bookie_base(proxy_cluster)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/health") as resp:
            assert resp.status == 200
            assert resp.content_type == "application/json"
            health = await resp.json()
        async with session.get(f"{base}/no-such-page") as resp:
            assert resp.status == 404
    assert health["state"] == "ok", health
    assert health["service"] == "bookie"
    assert health["id"] == proxy_cluster.bookies[0].name
    assert isinstance(health["why"], str)
    assert 0.0 < health["disk"]["used_ratio"] < 1.0


async def test_proxy_health_has_state_and_why(proxy_cluster: LocalCluster) -> None:
    async with aiohttp.ClientSession() as session:
        for url, service in (
            (_wurl(proxy_cluster), "writeproxy"),
            (_rurl(proxy_cluster), "readproxy"),
        ):
            async with session.get(f"{url}/health") as resp:
                assert resp.status == 200
                health = await resp.json()
            assert health["state"] == "ok", health
            assert health["service"] == service
            assert isinstance(health["why"], str)
