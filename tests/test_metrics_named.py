"""Issue 22, item 13: records per stream and per topic (write and read rates a
Prometheus query can draw), with a bounded number of series, and
``bookline_build_info`` on every service."""

from __future__ import annotations

import platform
import uuid

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bookie.metrics import BookieMetrics
from foundation.metrics import OTHER, BoundedLabels
from foundation.version import __version__
from httpapi.monitoring import PublicMetrics
from ops.cluster.local import LocalCluster
from readproxy.metrics import ReadProxyMetrics
from tests.metrics_support import get_msgpack, post_msgpack, sample_sum, scrape
from writeproxy.metrics import WriteProxyMetrics


def test_named_series_are_bounded() -> None:
    labels = BoundedLabels(series_max=3)
    assert [labels(n) for n in ("a", "b", "a", "c", "d", "e", "b")] == [
        "a", "b", "a", "c", OTHER, OTHER, "b",
    ]  # fmt: skip
    metrics = WriteProxyMetrics()
    for i in range(500):
        metrics.count_written(f"s{i}", 1)
    text = generate_latest(metrics.registry).decode()
    series = [line for line in text.splitlines()
              if line.startswith("bookline_writeproxy_stream_records_total{")]  # fmt: skip
    assert len(series) == 101  # 100 names and <other>
    assert sample_sum(text, "bookline_writeproxy_stream_records_total") == 500
    assert sample_sum(text, "bookline_writeproxy_stream_records_total", f'"{OTHER}"') == 400


@pytest.mark.parametrize("registry", ["bookie", "writeproxy", "readproxy"])
def test_every_service_says_its_build(registry: str) -> None:
    made: CollectorRegistry = {
        "bookie": lambda: BookieMetrics().registry,
        "writeproxy": lambda: WriteProxyMetrics().registry,
        "readproxy": lambda: ReadProxyMetrics().registry,
    }[registry]()
    text = generate_latest(made).decode()
    labels = f'python="{platform.python_version()}",version="{__version__}"'
    want = f"bookline_build_info{{{labels}}} 1.0"
    assert want in text.splitlines(), text[:2000]


@pytest.mark.integration
async def test_records_are_counted_per_stream_and_per_topic(proxy_cluster: LocalCluster) -> None:
    wurl = str(proxy_cluster.write_proxies[0].extra["url"])
    rurl = str(proxy_cluster.read_proxies[0].extra["url"])
    stream, topic = f"m-named-{uuid.uuid4().hex[:8]}", f"m-named-{uuid.uuid4().hex[:8]}"
    async with aiohttp.ClientSession() as session:
        await post_msgpack(session, f"{wurl}/v1/streams/{stream}/records", {"payloads": [b"s"] * 7})
        await post_msgpack(session, f"{wurl}/v1/topics", {"name": topic, "partitions": 2})
        for p in (0, 1):
            await post_msgpack(
                session, f"{wurl}/v1/topics/{topic}/partitions/{p}/records",
                {"payloads": [b"t"] * 3},
            )  # fmt: skip
        await get_msgpack(session, f"{rurl}/v1/streams/{stream}/records?from=earliest")
        await get_msgpack(session, f"{rurl}/v1/topics/{topic}/partitions/1/records?offset=0")
        texts = [await scrape(session, f"{w.extra['url']!s}/metrics")
                 for w in proxy_cluster.write_proxies]  # fmt: skip
        rtext = await scrape(session, f"{rurl}/metrics")
    written = "\n".join(texts)  # each partition's owner counts its own
    assert sample_sum(written, "bookline_writeproxy_stream_records_total", f'"{stream}"') == 7
    assert sample_sum(written, "bookline_writeproxy_topic_records_total", f'"{topic}"') == 6
    assert sample_sum(rtext, "bookline_readproxy_stream_served_records_total", f'"{stream}"') == 7
    assert sample_sum(rtext, "bookline_readproxy_topic_served_records_total", f'"{topic}"') == 3


def test_per_stream_families_are_not_public() -> None:
    """Without a token allowed them, /metrics names no stream or topic (security.md)."""
    metrics = WriteProxyMetrics()
    metrics.count_written("secret-stream", 1)
    metrics.count_written("secret-topic~0", 1)
    public = CollectorRegistry()
    public.register(PublicMetrics(metrics.registry))
    text = generate_latest(public).decode()
    assert "secret" not in text
    assert "bookline_writeproxy_records_written_total 2.0" in text.splitlines()
