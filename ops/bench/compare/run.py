"""``bookline bench compare``: Bookline against its peers, in one run on one machine.

Starts, each in its own processes under one directory (``--dir`` or a temporary one):
a Bookline cluster (ZooKeeper, 3 bookies, a write proxy, a read proxy; E=Qw=3, Qa=2,
fsync before ack), a 3-node NATS JetStream cluster (file storage, 3 replicas,
``sync_interval: always``) and one Redis (``appendonly yes``, ``appendfsync
always``); measures the disk's own limits (:mod:`ops.bench.disk`: fsync latency,
fsync'd sequential bandwidth), then runs every workload against every system:

* ``batched``: throughput with the best batching each system offers Python users;
* ``pipelined``: single records, pipelined;
* ``ack``: acknowledgement latency of single records at a fixed rate (1,000/s);
* ``e2e_<rate>``: write -> tailing reader (its own process) at 1,000 and 10,000/s;
* ``catchup``: reading back the batched workload's records (1,000,000) from the start;
* ``large``: 64 KiB records, batched, MB/s.

Each workload runs ``repeats`` times per system, the systems alternating (A, B, C, A,
B, C, ...) so a neighbour's noise hits them alike; the figures are medians. It prints
a table and, last, one JSON object ``{"bookline": ..., "jetstream": ..., "redis": ...,
"limits": ..., "ratios": ..., "targets": ...}`` (the thin client under
``bookline.thin_client``), and with ``--plots DIR`` draws the latency CDFs and
throughput bars there (:mod:`ops.bench.compare.plots`). ``--smoke`` runs every workload a
few hundred records long (seconds; the default test suite runs it).

Peers come from the ``bench`` extra and Debian's ``redis-server`` (``ops/setup.sh``
installs both); a peer that is missing is reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from ops.bench.compare.common import Latencies, Sizes, System

#: Numeric figures a workload's median is taken of.
_MEDIAN_KEYS: Final = (
    "records_per_s",
    "mb_per_s",
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "max_ms",
    "ack_p50_ms",
    "ack_p99_ms",
    "ack_p999_ms",
    "atomic_records_per_s",
    "publish_async_records_per_s",
)
#: Bytes each record is written as on this disk per replica: the journal and the entry
#: log; times 3 replicas. The 64 KiB target is a share of the disk's bandwidth / this.
WRITES_PER_BYTE: Final = 6


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--smoke", action="store_true", help="seconds-long run of every workload")
    p.add_argument("--repeats", type=int, default=None, help="runs per workload and system")
    p.add_argument(
        "--records",
        type=int,
        default=None,
        help="records of the batched workload, read back by catch-up",
    )
    p.add_argument(
        "--only", default=None, help="comma-separated workloads (batched,pipelined,ack,e2e,large)"
    )
    p.add_argument(
        "--systems",
        default="bookline,bookline_thin,jetstream,redis",
        help="comma-separated systems to run",
    )
    p.add_argument("--plots", default=None, help="directory for the PNG plots")
    p.add_argument(
        "--pause-s",
        type=float,
        default=None,
        help="idle time between runs (default 2 s, 0 in a smoke)",
    )


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def _servers(base: Path, wanted: set[str]) -> Iterator[tuple[list[System], dict[str, str]]]:
    """Every system's servers started (stopped by pid on the way out, also on failure);
    the systems to drive and the ones skipped, with why."""
    from ops.bench.compare import nats, redis
    from ops.bench.compare.bookline import BooklineCore, BooklineThin
    from ops.bench.compare.hops import services_of
    from ops.cluster.local import LocalCluster

    systems: list[System] = []
    skipped: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        if wanted & {"bookline", "bookline_thin"}:
            cluster = LocalCluster(base / "bookline", bookies=3, write_proxies=1, read_proxies=1)
            cluster.start()
            stack.callback(cluster.stop)
            described = cluster.describe()
            services = services_of(described)
            if "bookline" in wanted:
                systems.append(BooklineCore(cluster.zk_connect, described["root"], services))
            if "bookline_thin" in wanted:
                systems.append(BooklineThin(cluster.dir / "cluster.json", services))
        if "jetstream" in wanted:
            why = nats.available()
            if why is None:
                servers = nats.NatsCluster(base / "nats")
                servers.start()
                stack.callback(servers.stop)
                systems.append(nats.JetStream(servers.urls, servers.logs))
            else:
                skipped["jetstream"] = why
        if "redis" in wanted:
            why = redis.available()
            if why is None:
                server = redis.RedisServer(base / "redis")
                server.start()
                stack.callback(server.stop)
                systems.append(redis.RedisStreams(server.port))
            else:
                skipped["redis"] = why
        yield systems, skipped


Run = Callable[[System], Awaitable[dict[str, Any]]]
Follow = Callable[[System], Awaitable[Any]]


def _workloads(sizes: Sizes, only: set[str] | None) -> list[tuple[str, Run, Follow | None]]:
    """(name, run, follow-up) in order; ``catchup`` follows ``batched`` on the same
    records."""
    n, b = sizes.record_bytes, sizes.batched_records
    plan: list[tuple[str, Run, Follow | None]] = [
        ("batched", lambda s: s.batched(b, n), lambda s: s.catchup()),
        ("pipelined", lambda s: s.pipelined(sizes.pipelined_records, n), None),
        ("ack", lambda s: s.ack_latency(sizes.ack_rate, sizes.ack_seconds, n), None),
    ]
    for rate in sizes.e2e_rates:
        plan.append(
            (f"e2e_{int(rate)}", lambda s, r=rate: s.e2e(r, sizes.e2e_seconds, n), None)  # type: ignore[misc]
        )
    plan.append(
        ("large", lambda s: s.batched(sizes.large_records, sizes.large_bytes), lambda s: s.drop())
    )
    if only is None:
        return plan
    return [w for w in plan if w[0] in only or w[0].split("_")[0] in only]


async def _run_all(
    systems: list[System], sizes: Sizes, only: set[str] | None, pause_s: float
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every workload's runs per system, systems alternating within each repeat."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s.key: {} for s in systems}
    try:
        for s in systems:  # each close() is safe on a system that did not start
            await s.start()
        for name, run, follow in _workloads(sizes, only):
            for rep in range(sizes.repeats):
                order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
                for s in order:
                    if pause_s:
                        await asyncio.sleep(pause_s)
                    t0 = time.perf_counter()
                    result = await run(s)
                    result["load_avg"] = _loadavg()
                    runs[s.key].setdefault(name, []).append(result)
                    if follow is not None and name == "batched":
                        if pause_s:
                            await asyncio.sleep(pause_s)
                        back = await follow(s)
                        back["load_avg"] = _loadavg()
                        runs[s.key].setdefault("catchup", []).append(back)
                    elif follow is not None:
                        await follow(s)
                    print(
                        f"# {name} {s.key} run {rep + 1}: "
                        f"{_brief(result)} ({time.perf_counter() - t0:.1f} s)",
                        flush=True,
                    )
    finally:
        for s in systems:
            await s.close()
    return runs


def _brief(r: dict[str, Any]) -> str:
    if "p99_ms" in r:
        return f"p50 {r['p50_ms']} p99 {r['p99_ms']} p99.9 {r['p999_ms']} ms"
    return f"{r.get('records_per_s')} records/s {r.get('mb_per_s')} MB/s"


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _MEDIAN_KEYS:
        vals = [r[key] for r in runs if isinstance(r.get(key), int | float)]
        if vals:
            out[key] = round(statistics.median(vals), 3)
    for key in ("rate", "method", "sustained", "atomic_error"):
        vals = [r[key] for r in runs if key in r]
        if vals:
            out[key] = all(vals) if key == "sustained" else vals[-1]
    # the hop split (ops.bench.compare.hops)
    for key in ("hops_ms", "cpu_us_per_record", "run_queue_us_per_record"):
        parts = [r[key] for r in runs if isinstance(r.get(key), dict)]
        names = sorted({n for part in parts for n in part})
        if names:
            out[key] = {
                n: round(statistics.median(p[n] for p in parts if n in p), 3) for n in names
            }
    main = "p99_ms" if "p99_ms" in runs[0] else "records_per_s"
    out["runs"] = [r.get(main) for r in runs]
    out["load_avg"] = [r.get("load_avg") for r in runs]
    hists = [r["hist"] for r in runs if "hist" in r]
    if hists:
        merged = Latencies.decode(hists[0])
        for h in hists[1:]:
            merged.hist.add(Latencies.decode(h).hist)
        out["hist"] = merged.encode()
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def _get(results: dict[str, Any], system: str, workload: str, key: str) -> float | None:
    value = results.get(system, {}).get(workload, {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def ratios_and_targets(
    results: dict[str, Any], limits: dict[str, Any], e2e_rates: tuple[float, ...]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Bookline (core) over each peer per workload, and issue 17's targets."""
    bl, js, rd = "bookline", "jetstream", "redis"
    ratios: dict[str, Any] = {}
    for peer in (js, rd):
        ratios[f"bookline_over_{peer}"] = {
            "batched_records_per_s": _ratio(
                _get(results, bl, "batched", "records_per_s"),
                _get(results, peer, "batched", "records_per_s"),
            ),
            "pipelined_records_per_s": _ratio(
                _get(results, bl, "pipelined", "records_per_s"),
                _get(results, peer, "pipelined", "records_per_s"),
            ),
            "ack_p99": _ratio(
                _get(results, bl, "ack", "p99_ms"), _get(results, peer, "ack", "p99_ms")
            ),
            **{
                f"e2e_{int(r)}_p99": _ratio(
                    _get(results, bl, f"e2e_{int(r)}", "p99_ms"),
                    _get(results, peer, f"e2e_{int(r)}", "p99_ms"),
                )
                for r in e2e_rates
            },
            "catchup_records_per_s": _ratio(
                _get(results, bl, "catchup", "records_per_s"),
                _get(results, peer, "catchup", "records_per_s"),
            ),
            "large_mb_per_s": _ratio(
                _get(results, bl, "large", "mb_per_s"), _get(results, peer, "large", "mb_per_s")
            ),
        }
    disk = limits.get("seq_write_fsync_mb_per_s")
    share = _ratio(_get(results, bl, "large", "mb_per_s"), disk / WRITES_PER_BYTE if disk else None)
    ratios["bookline_large_over_disk_sixth"] = share
    over_js = ratios[f"bookline_over_{js}"]
    over_rd = ratios[f"bookline_over_{rd}"]

    def target(value: float | None, bound: float, at_least: bool) -> dict[str, Any]:
        met = None if value is None else (value >= bound if at_least else value <= bound)
        return {"value": value, "target": f"{'>=' if at_least else '<='} {bound}", "met": met}

    targets = {
        "batched_vs_jetstream": target(over_js["batched_records_per_s"], 10.0, True),
        "batched_vs_redis": target(over_rd["batched_records_per_s"], 3.0, True),
        "pipelined_vs_jetstream": target(over_js["pipelined_records_per_s"], 2.0, True),
        "ack_p99_vs_jetstream": target(over_js["ack_p99"], 1.0, False),
        "e2e_1000_p99_vs_jetstream": target(over_js.get("e2e_1000_p99"), 1.0, False),
        "e2e_10000_p99_vs_jetstream": target(over_js.get("e2e_10000_p99"), 2.0, False),
        "catchup_vs_jetstream": target(over_js["catchup_records_per_s"], 5.0, True),
        "large_vs_disk_sixth": target(share, 0.7, True),
    }
    e2e_js = results.get(js, {}).get("e2e_10000", {})
    if e2e_js and not e2e_js.get("sustained", True):
        targets["e2e_10000_p99_vs_jetstream"]["note"] = "JetStream did not sustain 10,000/s"
    return ratios, targets


_ROWS: Final = (
    ("batched", "records_per_s", "batched, records/s"),
    ("pipelined", "records_per_s", "single pipelined, records/s"),
    ("ack", "p50_ms", "ack p50 ms @1,000/s"),
    ("ack", "p99_ms", "ack p99 ms"),
    ("ack", "p999_ms", "ack p99.9 ms"),
    ("e2e_1000", "p50_ms", "e2e p50 ms @1,000/s"),
    ("e2e_1000", "p99_ms", "e2e p99 ms @1,000/s"),
    ("e2e_1000", "p999_ms", "e2e p99.9 ms @1,000/s"),
    ("e2e_10000", "p50_ms", "e2e p50 ms @10,000/s"),
    ("e2e_10000", "p99_ms", "e2e p99 ms @10,000/s"),
    ("e2e_10000", "p999_ms", "e2e p99.9 ms @10,000/s"),
    ("catchup", "records_per_s", "catch-up read, records/s"),
    ("large", "mb_per_s", "64 KiB records, MB/s"),
)


def table(results: dict[str, Any], systems: Sequence[str]) -> str:
    """The comparison as a Markdown table (medians)."""
    head = "| workload | " + " | ".join(systems) + " |"
    lines = [head, "|---" * (len(systems) + 1) + "|"]
    for workload, key, label in _ROWS:
        cells = []
        for s in systems:
            v = _get(results, s, workload, key)
            cells.append("" if v is None else f"{v:,.0f}" if v >= 1000 else f"{v:g}")
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The hop split's columns (ops.bench.compare.hops), in the record's order.
_HOPS: Final = ("ack_ms", "proxy_request_ms", "writer_add_ms", "bookie_add_ms", "fsync_ms",
                "ack_to_reader_ms")  # fmt: skip


def hop_table(results: dict[str, Any]) -> str:
    """Bookline's latency workloads split per hop (ms, nested means), the CPU each
    process role spent per record and the time all of them waited for a core (µs), as
    a Markdown table."""
    seen = {r for s in ("bookline", "bookline_thin")
            for w in results.get(s, {}).values()
            for r in w.get("cpu_us_per_record", {})}  # fmt: skip
    roles = [*sorted(seen - {"total"}), "total"]
    head = (
        "| system, workload | "
        + " | ".join(_HOPS)
        + " | "
        + " | ".join(f"cpu µs/rec {r}" for r in roles)
        + " | run queue µs/rec total |"
    )
    lines = [head, "|---" * (2 + len(_HOPS) + len(roles)) + "|"]
    for system in ("bookline", "bookline_thin"):
        for workload, summary in results.get(system, {}).items():
            hops, cpu = summary.get("hops_ms"), summary.get("cpu_us_per_record", {})
            if not hops:
                continue
            cells = [f"{hops[h]:g}" if h in hops else "" for h in _HOPS]
            cells += [f"{cpu[r]:g}" if r in cpu else "" for r in roles]
            queued = summary.get("run_queue_us_per_record", {})
            cells.append(f"{queued['total']:g}" if "total" in queued else "")
            lines.append(f"| {system} {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import disk
    from ops.bench.common import asyncio_run

    sizes = Sizes.smoke() if args.smoke else Sizes.full()
    if args.repeats is not None or args.records is not None:
        sizes = Sizes(
            **{
                **{f: getattr(sizes, f) for f in sizes.__slots__},
                **({"repeats": args.repeats} if args.repeats is not None else {}),
                **({"batched_records": args.records} if args.records is not None else {}),
            }
        )
    pause_s = args.pause_s if args.pause_s is not None else (0.0 if args.smoke else 2.0)
    only = set(args.only.split(",")) if args.only else None
    wanted = set(args.systems.split(","))
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # SIGTERM unwinds like Ctrl-C, so every server started is stopped by pid.
    signal.signal(signal.SIGTERM, _terminated)
    load_start = _loadavg()
    with contextlib.ExitStack() as stack:
        base = Path(args.dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="bl-cmp-")))
        base.mkdir(parents=True, exist_ok=True)
        limits = disk.measure(base)
        limits.pop("bench", None)
        with _servers(base, wanted) as (systems, skipped):
            runs = asyncio_run(_run_all(systems, sizes, only, pause_s))
    results: dict[str, Any] = {
        key: {w: _median(rs) for w, rs in workloads.items()} for key, workloads in runs.items()
    }
    ratios, targets = ratios_and_targets(results, limits, sizes.e2e_rates)
    order = [s for s in ("bookline", "bookline_thin", "jetstream", "redis") if s in results]
    print(table(results, order), flush=True)
    print(hop_table(results), flush=True)
    if args.plots:
        from ops.bench.compare.plots import render

        render(results, limits, Path(args.plots))
    for per_system in results.values():  # histograms went into the plots
        for summary in per_system.values():
            summary.pop("hist", None)
    out: dict[str, Any] = {
        "bench": "compare",
        "started": started,
        "smoke": bool(args.smoke),
        "repeats": sizes.repeats,
        "load_avg": {"start": load_start, "end": _loadavg()},
        "bookline": {
            **results.get("bookline", {}),
            "thin_client": results.get("bookline_thin", {}),
        },
        "jetstream": results.get("jetstream", {}),
        "redis": results.get("redis", {}),
        "limits": limits,
        "ratios": ratios,
        "targets": targets,
        "skipped": skipped,
    }
    return out
