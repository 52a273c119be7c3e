"""Where a Bookline record's time and CPU go, hop by hop (``bench compare``, issue 26).

Around each latency workload (``ack``, ``e2e_<rate>``) of the core and the thin client,
a :class:`HopWindow` reads, when the timed records start and when they end, what the
services already measure -- nothing is added to their hot paths:

* the CPU seconds of every process role (``/proc``): ``bookies``, ``write_proxy``,
  ``read_proxy``, ``zookeeper``, ``client`` (this process: the load generator, and for
  the core also the writer) and ``reader`` (the tail's own process);
* the means of the latency histograms the services keep on each hop (their
  ``/metrics``; the core writer's ledger figures in this process):

  ======================  =============================================================
  ``proxy_request_ms``    write proxy: a write request received -> answered (thin)
  ``writer_add_ms``       the writer's ledger: an entry's first send -> its Qa acks
                          (core: this process; thin: the write proxy's writers)
  ``bookie_add_ms``       a bookie: ADD decoded -> answer encoded (the journal's queue,
                          write and fsync)
  ``fsync_ms``            a bookie's journal: one group's fdatasync
  ======================  =============================================================

and, from the workload's own medians: ``ack_ms`` (client -> acknowledgement, per
record) and ``ack_to_reader_ms`` (e2e - ack at p50: the LAC told to the bookies, a
long poll's answer, the reader's hand-over; through the read proxy's WebSocket for the
thin client). Hop means are per entry or request (what the services time), so the hops
nest rather than add up: fsync within bookie_add within writer_add within ack.
``cpu_us_per_record`` is each role's CPU per timed record, ``run_queue_us_per_record``
how long its threads were ready but waited for a core (``/proc`` schedstat): on a
machine whose cores the roles share, where most of a tail's visibility gap went
(docs/benchmarks.md, "Where the visibility gap waits").
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Callable
from typing import Any, Final

from ops.bench.cpu import cpu_seconds, run_queue_seconds

__all__ = ["HopWindow", "services_of"]

#: (hop, role whose /metrics has it, histogram, label that must match or "").
_HISTOGRAMS: Final = (
    ("proxy_request_ms", "write_proxy", "bookline_writeproxy_request_seconds", 'method="POST"'),
    ("writer_add_ms", "write_proxy", "bookline_ledger_add_seconds", ""),
    ("bookie_add_ms", "bookies", "bookline_bookie_request_seconds", 'op="ADD"'),
    ("fsync_ms", "bookies", "bookline_bookie_journal_fsync_seconds", ""),
)

SumCount = tuple[float, float]


def services_of(describe: dict[str, Any]) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """Pids and ``/metrics`` URLs per role of a local cluster (``LocalCluster.describe``)."""
    pids: dict[str, list[int]] = {}
    urls: dict[str, list[str]] = {}
    for role, key in (
        ("bookies", "bookies"),
        ("write_proxy", "write_proxies"),
        ("read_proxy", "read_proxies"),
    ):
        for child in describe.get(key, []):
            if "pid" in child:
                pids.setdefault(role, []).append(int(child["pid"]))
            if "metrics" in child:
                urls.setdefault(role, []).append(str(child["metrics"]))
    zk = describe.get("zookeeper", {})
    if "pid" in zk:
        pids["zookeeper"] = [int(zk["pid"])]
    return pids, urls


def histogram(text: str, name: str, label: str) -> SumCount:
    """``(sum, count)`` of histogram ``name`` in Prometheus text, over the series whose
    labels contain ``label`` (all when empty)."""
    total = [0.0, 0.0]
    for i, part in enumerate(("_sum", "_count")):
        # Label values hold braces too (endpoint="/v1/streams/{name}/records").
        pattern = re.compile(rf"^{name}{part}(?:\{{(.*)\}})? (\S+)$", re.M)
        for labels, value in pattern.findall(text):
            if not label or label in labels:
                total[i] += float(value)
    return total[0], total[1]


def _scrape(urls: list[str]) -> str:
    texts = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:  # loopback only
                texts.append(answer.read().decode())
        except OSError:
            continue  # a service that does not answer counts nothing
    return "\n".join(texts)


class HopWindow:
    """``await start()`` when the timed records start, ``await stop(records)`` when they
    are done: ``{"hops_ms": {...}, "cpu_us_per_record": {...},
    "run_queue_us_per_record": {...}}``. ``in_process`` gives
    this process's ledger add histogram ``(sum, count)`` for a core writer here."""

    def __init__(
        self,
        pids: dict[str, list[int]],
        urls: dict[str, list[str]],
        in_process: Callable[[], SumCount] | None = None,
    ) -> None:
        self._pids = pids
        self._urls = urls
        self._in_process = in_process
        self._cpu: dict[int, float] = {}
        self._queued: dict[int, float] = {}
        self._hist: dict[str, SumCount] = {}

    async def _histograms(self) -> dict[str, SumCount]:
        roles = {role for _h, role, _n, _l in _HISTOGRAMS}
        texts = {r: await asyncio.to_thread(_scrape, self._urls.get(r, [])) for r in roles}
        out = {hop: histogram(texts[role], name, label) for hop, role, name, label in _HISTOGRAMS}
        if self._in_process is not None:
            out["writer_add_ms"] = self._in_process()
        return out

    async def start(self) -> None:
        self._hist = await self._histograms()
        self._cpu = {
            pid: s for pids in self._pids.values() for pid in pids
            if (s := cpu_seconds(pid)) is not None
        }  # fmt: skip
        self._queued = {
            pid: q for pids in self._pids.values() for pid in pids
            if (q := run_queue_seconds(pid)) is not None
        }  # fmt: skip

    async def stop(self, records: int) -> dict[str, Any]:
        cpu = self._per_record(self._cpu, cpu_seconds, records)
        queued = self._per_record(self._queued, run_queue_seconds, records)
        after = await self._histograms()
        hops: dict[str, float] = {}
        for hop, (s1, c1) in after.items():
            s0, c0 = self._hist.get(hop, (0.0, 0.0))
            if c1 > c0:
                hops[hop] = round((s1 - s0) / (c1 - c0) * 1000.0, 3)
        return {"hops_ms": hops, "cpu_us_per_record": cpu, "run_queue_us_per_record": queued}

    def _per_record(
        self, start: dict[int, float], read: Callable[[int], float | None], records: int
    ) -> dict[str, float]:
        """Per role, µs per record of what ``read(pid)`` counts (seconds) since ``start``."""
        out: dict[str, float] = {}
        for role, pids in self._pids.items():
            used = 0.0
            for pid in pids:
                now, before = read(pid), start.get(pid)
                if now is not None and before is not None:
                    used += now - before
            out[role] = round(max(0.0, used) / max(1, records) * 1e6, 1)
        out["total"] = round(sum(out.values()), 1)
        return out
