"""``bookline bench consume``: consumer groups reading a topic, and how fast they rebalance.

Starts its own cluster (ZooKeeper, 3 bookies, a write proxy, a read proxy, each a
process) in a temporary directory unless ``--cluster`` names a running one. Then:

1. **fill**: a topic of ``--partitions`` (6) partitions gets ``--records`` (1,000,000)
   records of ``--record-size`` (100) bytes, with one core writer per partition;
2. **core**: ``--consumers`` (3) consumer processes of one group read it all straight
   from the bookies (``via="core"``);
3. **proxy**: the same through the read proxy with thin-client consumers
   (``via="proxy"``), as another group;
4. **rebalance**: on a topic of ``--rebalance-partitions`` (12) partitions, a group of 3
   members (in this process) gets a 4th; the time from its join until every partition
   is consumed again by exactly one member, balanced (3 each), over ``--rounds`` (7)
   rounds; the 4th leaves between rounds.

Consumer phases are timed from "go" -- sent once every member has joined and the
group has settled, so process start-up and the first rebalance are not counted -- to
the moment the last member has read its partitions to their end offsets:
``records_per_s`` = records / that time. The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import resource
import statistics
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ops.bench.common import asyncio_run, local_cluster, percentile_ms

if TYPE_CHECKING:
    from groups.consumer import ConsumerConfig, GroupConsumer
    from groups.coordinator_client import CoordinatorClient
    from streams.namespace import Namespace

# Records per write_many while filling, and write_many calls in flight per partition.
FILL_BATCH_RECORDS: Final = 5_000
FILL_BATCHES_IN_FLIGHT: Final = 4
# A member process starts, joins and settles within this on a loaded machine.
SETTLE_TIMEOUT_S: Final = 60.0
# Between rebalance rounds: longer than the quick-heartbeat window after a rebalance
# (a heartbeat interval, 1 s, plus 1 s).
REBALANCE_QUIET_S: Final = 3.0
# A consumer phase (1,000,000 records) ends within this even on a slow machine.
PHASE_TIMEOUT_S: Final = 300.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default=None, help="cluster.json of a running cluster")
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--records", type=int, default=1_000_000, help="records to fill and read")
    p.add_argument("--record-size", type=int, default=100, help="bytes per record")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the read topic")
    p.add_argument("--consumers", type=int, default=3, help="consumer processes per phase")
    p.add_argument("--phases", default="core,proxy,rebalance",
                   help="comma-separated: core, proxy, rebalance")  # fmt: skip
    p.add_argument("--max-poll-records", type=int, default=2_000, help="records per poll")
    p.add_argument("--fetch-records", type=int, default=5_000, help="records per fetch")
    p.add_argument("--rebalance-partitions", type=int, default=12)
    p.add_argument("--rounds", type=int, default=7, help="rebalance rounds")
    p.add_argument("--seed", type=int, default=None, help="rebalance: phase of the joins")
    p.add_argument("--check", action="store_true",
                   help="consumers check each offset comes once, in order (costs CPU)")  # fmt: skip


def _consumer_config(spec: dict[str, Any]) -> ConsumerConfig:
    from groups.consumer import ConsumerConfig

    fetch = int(spec["fetch_records"])
    return ConsumerConfig(
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=int(spec["max_poll_records"]),
        fetch_records_max=fetch,
        buffered_records_max=max(2 * fetch, 10_000),
    )


# -- fill ---------------------------------------------------------------------------------


async def _fill(ns: Namespace, topic: str, args: argparse.Namespace) -> list[int]:
    """``args.records`` records spread evenly over the partitions; their end offsets."""
    from foundation.names import partition_stream
    from groups.topics import TopicAdmin
    from streams.records import LogRecord

    admin = TopicAdmin(ns)
    await admin.create_topic(topic, args.partitions)
    payload = os.urandom(args.record_size)
    batch = [LogRecord(payload) for _ in range(FILL_BATCH_RECORDS)]

    async def one(p: int, count: int) -> None:
        w = await ns.open_writer(partition_stream(topic, p))
        try:
            inflight: set[asyncio.Task[Any]] = set()
            for start in range(0, count, FILL_BATCH_RECORDS):
                n = min(FILL_BATCH_RECORDS, count - start)
                task = asyncio.ensure_future(w.write_many(batch[:n]))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                if len(inflight) >= FILL_BATCHES_IN_FLIGHT:
                    await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*inflight)
        finally:
            await w.close()

    per, extra = divmod(args.records, args.partitions)
    await asyncio.gather(*(one(p, per + (p < extra)) for p in range(args.partitions)))
    return await admin.end_offsets(topic)


# -- consumer processes -------------------------------------------------------------------


class _Worker:
    """One consumer process: joins, waits for "go", reads its partitions to their end
    offsets, reports ``(t_go, t_done, records, cpu_s)``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(spec, child), daemon=True)
        self.proc.start()
        child.close()

    async def recv(self, timeout_s: float) -> Any:
        if not await asyncio.to_thread(self.conn.poll, timeout_s):
            raise TimeoutError(f"consumer process {self.proc.pid} said nothing for {timeout_s} s")
        msg = self.conn.recv()
        if isinstance(msg, BaseException):
            raise msg
        return msg

    async def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send("stop")
        await asyncio.to_thread(self.proc.join, 15)
        if self.proc.is_alive():
            self.proc.kill()
            await asyncio.to_thread(self.proc.join, 5)
        self.conn.close()


def _worker_main(spec: dict[str, Any], conn: Connection) -> None:
    try:
        conn.send(asyncio_run(_worker(spec, conn)))
    except BaseException as exc:  # reported to the parent, which raises it
        conn.send(RuntimeError(f"consumer process failed: {exc!r}"))
        raise
    finally:
        conn.close()


async def _worker(spec: dict[str, Any], conn: Connection) -> dict[str, Any]:
    from foundation.gctune import settle_heap
    from groups.consumer import GroupConsumer

    consumer = await GroupConsumer.from_cluster_file(
        spec["cluster"], spec["group"], [spec["topic"]], via=spec["via"],
        config=_consumer_config(spec),
    )  # fmt: skip
    topic, ends = spec["topic"], spec["ends"]
    try:
        conn.send("joined")
        # Until "go": settle into the group (callbacks run in poll) without consuming.
        while not conn.poll():
            await consumer.poll(timeout_s=0.05)
            consumer.pause(consumer.assignment())
        assert conn.recv() == "go"
        mine = sorted(consumer.assignment())
        consumer.seek_to_beginning(mine)  # drop what was fetched ahead while waiting
        consumer.resume(mine)
        settle_heap()
        cpu0 = _cpu_s()
        t_go = time.time()
        count = 0
        left = {tp for tp in mine if ends[tp[1]] > 0}
        check = bool(spec.get("check"))
        seen: dict[int, int] = {}
        while left:
            records = await consumer.poll(timeout_s=1.0)
            count += len(records)
            if check:
                for r in records:
                    assert seen.get(r.partition, 0) == r.offset, (r.partition, r.offset, seen)
                    seen[r.partition] = r.offset + 1
            for tp in list(left):
                position = consumer.position(tp)
                if position is not None and position >= ends[tp[1]]:
                    left.discard(tp)
        t_done = time.time()
        return {"t_go": t_go, "t_done": t_done, "records": count, "cpu_s": _cpu_s() - cpu0,
                "partitions": [p for _t, p in mine], "topic": topic}  # fmt: skip
    finally:
        await consumer.close()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _settled(cc: CoordinatorClient, group: str, members: int, partitions: int) -> bool:
    with contextlib.suppress(Exception):
        desc = await cc.describe(group)
        owned = [sorted(p for _t, p in m["owned"]) for m in desc["members"]]
        flat = sorted(p for o in owned for p in o)
        sizes = [len(o) for o in owned]
        return (
            len(owned) == members
            and flat == list(range(partitions))
            and max(sizes) - min(sizes) <= 1
        )
    return False


async def _phase(
    via: str, cluster: Path, topic: str, ends: list[int], *, cc: CoordinatorClient,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    group = f"bench-{via}-{uuid.uuid4().hex[:6]}"
    spec = {
        "cluster": str(cluster), "group": group, "topic": topic, "via": via, "ends": ends,
        "max_poll_records": args.max_poll_records, "fetch_records": args.fetch_records,
        "check": args.check,
    }  # fmt: skip
    workers = [_Worker(spec) for _ in range(args.consumers)]
    try:
        for w in workers:
            assert await w.recv(SETTLE_TIMEOUT_S) == "joined"
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not await _settled(cc, group, args.consumers, len(ends)):
            if time.monotonic() > deadline:
                desc = await cc.describe(group)
                raise TimeoutError(f"group {group} did not settle: {desc['members']}")
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # every member has run its callbacks
        for w in workers:
            w.conn.send("go")
        results = [await w.recv(PHASE_TIMEOUT_S) for w in workers]
    finally:
        for w in workers:
            await w.stop()
    total = sum(r["records"] for r in results)
    elapsed = max(r["t_done"] for r in results) - min(r["t_go"] for r in results)
    return {
        "records": total,
        "seconds": round(elapsed, 3),
        "records_per_s": round(total / elapsed),
        "consumers": args.consumers,
        "per_consumer": [
            {"partitions": r["partitions"], "records": r["records"],
             "records_per_s": round(r["records"] / max(1e-9, r["t_done"] - r["t_go"])),
             "cpu_s": round(r["cpu_s"], 2)}
            for r in results
        ],
    }  # fmt: skip


# -- rebalance ----------------------------------------------------------------------------


async def _rebalance(cluster: Path, ns: Namespace, args: argparse.Namespace) -> dict[str, Any]:
    from groups.consumer import ConsumerConfig, GroupConsumer
    from groups.topics import TopicAdmin

    n = args.rebalance_partitions
    topic = f"bench-rebalance-{uuid.uuid4().hex[:6]}"
    group = f"{topic}-g"
    await TopicAdmin(ns).create_topic(topic, n)
    config = ConsumerConfig(auto_offset_reset="latest", enable_auto_commit=False)
    rng = random.Random(args.seed)
    running = True

    async def member() -> tuple[GroupConsumer, asyncio.Task[None]]:
        c = await GroupConsumer.from_cluster_file(cluster, group, [topic], config=config)

        async def loop() -> None:
            while running:
                await c.poll(timeout_s=0.05)

        return c, asyncio.ensure_future(loop())

    def balanced(cs: list[GroupConsumer]) -> bool:
        held = [c.assignment() for c in cs]
        flat = [tp for h in held for tp in h]
        return len(flat) == n == len(set(flat)) and max(map(len, held)) - min(map(len, held)) <= 1

    async def until(cs: list[GroupConsumer], what: str) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not balanced(cs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {[sorted(c.assignment()) for c in cs]}")
            await asyncio.sleep(0.005)

    base = [await member() for _ in range(3)]
    durations: list[float] = []
    try:
        await until([c for c, _t in base], "3 members settle")
        for _ in range(args.rounds):
            # Members in their steady state: past the quick heartbeats that follow a
            # rebalance (one interval + 1 s), so the 4th's join is learnt at a regular
            # heartbeat; at a random phase of the members' heartbeat schedule (which
            # the last rebalance aligned: a fixed pause would always join just before
            # or just after their heartbeats).
            await asyncio.sleep(REBALANCE_QUIET_S + rng.uniform(0.0, 1.0))
            t0 = time.perf_counter()
            fourth = await member()
            everyone = [c for c, _t in base] + [fourth[0]]
            await until(everyone, "4 members settle")
            durations.append(time.perf_counter() - t0)
            fourth[1].cancel()
            await fourth[0].close()
            await until([c for c, _t in base], "back to 3 members")
    finally:
        running = False
        for c, task in base:
            await task
            await c.close()
    durations.sort()
    return {
        "partitions": n,
        "heartbeat_interval_ms": config.heartbeat_interval_ms,
        "seed": args.seed,
        "rounds": len(durations),
        "p50_ms": percentile_ms(durations, 0.5),
        "max_ms": round(durations[-1] * 1000, 1),
        "all_ms": [round(d * 1000, 1) for d in durations],
        "mean_ms": round(statistics.fmean(durations) * 1000, 1),
    }


# -- the benchmark ------------------------------------------------------------------------


async def _measure(cluster: Path, args: argparse.Namespace) -> dict[str, Any]:
    from groups.coordinator_client import CoordinatorClient
    from streams.namespace import Namespace
    from thinclient.client import ProxyClient

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    out: dict[str, Any] = {"bench": "consume", "record_size": args.record_size}
    async with (
        await Namespace.from_cluster_file(cluster) as ns,
        ProxyClient.from_cluster_file(cluster) as client,
    ):
        cc = CoordinatorClient.of(client)
        if "core" in phases or "proxy" in phases:
            topic = f"bench-consume-{uuid.uuid4().hex[:6]}"
            t0 = time.perf_counter()
            ends = await _fill(ns, topic, args)
            fill_s = time.perf_counter() - t0
            out["fill"] = {"records": sum(ends), "partitions": len(ends),
                           "records_per_s": round(sum(ends) / fill_s)}  # fmt: skip
            for via in ("core", "proxy"):
                if via in phases:
                    out[via] = await _phase(via, cluster, topic, ends, cc=cc, args=args)
        if "rebalance" in phases:
            out["rebalance"] = await _rebalance(cluster, ns, args)
    for key in ("core", "proxy"):
        if key in out:
            out[f"{key}_records_per_s"] = out[key]["records_per_s"]
    if "rebalance" in out:
        out["rebalance_p50_ms"] = out["rebalance"]["p50_ms"]
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.seed is None:
        args.seed = random.randrange(1 << 32)
    with local_cluster(args, write_proxies=1, read_proxies=1) as cluster:
        return asyncio_run(_measure(cluster, args))
