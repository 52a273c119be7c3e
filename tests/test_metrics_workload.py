"""Issue 16 acceptance: after a write/read workload through a running cluster, every
family ``docs/metrics.md`` marks **workload** is non-zero in the service that exports
it, and every family it marks **present** is exported. Runs on the shared proxy
cluster (3 bookies, 2 write proxies, a read proxy; real processes).

The workload: batches with producer ids to a few streams (one batch sent twice: a
retry), a body over the limit (413), a write to the other proxy (307), a stream handed
from one proxy to the other (an acquisition with a tail scan), catch-up reads as
records and as record sets, and a malformed frame to a bookie.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Iterator, Mapping

import aiohttp
import pytest

from httpapi import wire
from ops.cluster.local import LocalCluster
from tests.metrics_support import family_types, sample_sum, scrape
from tests.test_metrics_docs import SECTIONS, documented
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

# Checkpoints (every 10 s in a bookie) and the gauges refreshed every second need time.
SETTLE_S = 60.0
# Ledger client families: the service whose workload moves each.
LEDGER_WORKLOAD = {
    "bookline_ledger_add_seconds": "writeproxy",
    "bookline_ledger_entry_read_seconds": "readproxy",
}
MSGPACK = {"Content-Type": wire.MSGPACK, "Accept": wire.MSGPACK}


async def _post(
    session: aiohttp.ClientSession, url: str, body: Mapping[str, object], status: int = 200
) -> None:
    data = io.BytesIO(wire.encode_body(body, wire.MSGPACK))
    async with session.post(url, data=data, headers=MSGPACK, allow_redirects=False) as resp:
        await resp.read()
        assert resp.status == status, (url, resp.status)


async def _workload(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    wp0, wp1 = (str(p.extra["url"]) for p in cluster.write_proxies)
    rp = str(cluster.read_proxies[0].extra["url"])
    tag = uuid.uuid4().hex[:8]
    streams = [f"wl-{tag}-{i}" for i in range(3)]
    for stream in streams:
        for seq in range(0, 200, 50):
            batch = {"producer": f"p-{tag}", "seq": seq, "payloads": [b"r" * 100] * 50}
            await _post(session, f"{wp0}/v1/streams/{stream}/records", batch)
    retry = {"producer": f"p-{tag}", "seq": 150, "payloads": [b"r" * 100] * 50}
    await _post(session, f"{wp0}/v1/streams/{streams[0]}/records", retry)  # duplicates
    big = {"payloads": [b"x" * (3 << 20)]}
    await _post(session, f"{wp0}/v1/streams/{streams[0]}/records", big, 413)
    await _post(session, f"{wp1}/v1/streams/{streams[0]}/records", {"payloads": [b"a"]}, 307)
    # Hand streams[1] over: wp1 acquires it and scans its tail for producers.
    await _post(session, f"{wp0}/v1/streams/{streams[1]}/release", {})
    await _post(session, f"{wp1}/v1/streams/{streams[1]}/records", {"payloads": [b"b"]})
    for stream in streams:
        async with session.get(f"{rp}/v1/streams/{stream}/records?from=earliest&limit=500") as r:
            assert r.status == 200
        async with session.get(f"{rp}/v1/streams/{stream}/recordsets?from=earliest") as r:
            assert r.status == 200
            await r.read()
    host, port = str(cluster.bookies[0].address).rsplit(":", 1)
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"\xff" * 64)  # no frame of ours starts like that: a fatal bad frame
    await writer.drain()
    writer.close()


def _families(section: str, name: str) -> Iterator[str]:
    """The services a documented family is checked in."""
    if name in LEDGER_WORKLOAD:
        yield LEDGER_WORKLOAD[name]
    elif section.startswith("Ledger client"):
        return
    else:
        # Not services of this cluster: autorecovery, and the compaction job (its metrics
        # file is checked by tests/test_compaction.py).
        yield from (s for s in SECTIONS[section] if s not in ("autorecovery", "compaction"))


def _value(text: str, name: str, kind: str) -> float:
    return sample_sum(text, name + "_count" if kind == "histogram" else name)


async def test_documented_families_move_under_a_workload(proxy_cluster: LocalCluster) -> None:
    urls = {
        "bookie": [str(b.extra["metrics"]) for b in proxy_cluster.bookies],
        "writeproxy": [f"{p.extra['url']}/metrics" for p in proxy_cluster.write_proxies],
        "readproxy": [f"{p.extra['url']}/metrics" for p in proxy_cluster.read_proxies],
    }
    rows = list(documented())
    zero: list[str] = []
    missing: list[str] = []

    async def all_moved() -> bool:  # one turn: scrape every service, list what is wanting
        texts = {s: [await scrape(session, u) for u in us] for s, us in urls.items()}
        zero.clear()
        missing.clear()
        for section, name, kind, by in rows:
            for service in _families(section, name):
                base = name.removesuffix("_total") if kind == "counter" else name
                if not all(base in family_types(t) for t in texts[service]):
                    missing.append(f"{service}: {name}")
                elif by == "workload":
                    total = sum(_value(t, name, kind) for t in texts[service])
                    if total == 0:
                        zero.append(f"{service}: {name}")
        return not zero and not missing

    async with aiohttp.ClientSession() as session:
        await _workload(session, proxy_cluster)
        await wait_for(
            all_moved,
            lambda: f"every documented family exported ({missing} not) and moving under "
            f"the workload ({zero} still zero)",
            timeout_s=SETTLE_S, interval_s=1.0,
        )  # fmt: skip
