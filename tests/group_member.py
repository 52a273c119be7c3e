"""A consumer group member as its own process, for the acceptance tests (kill -9,
SIGSTOP): ``python -m tests.group_member --cluster C --group G --topic T --events F``.

It polls, "processes" each batch (nothing to do) and commits the positions after
every poll, writing what happens as JSON lines to ``--events`` (flushed per line):

* ``{"ev": "member", "member": id, "gen": g}`` when its member id or generation changes;
* ``{"ev": "assign" | "revoke" | "lost", "tps": [p, ...]}`` from the callbacks;
* ``{"ev": "batch", "ranges": {p: [first, last]}}`` per poll that returned records;
* ``{"ev": "commit_error", "code": c, "name": n}``;
* ``{"ev": "resume_commit", "ok": bool, "code": c}``: after SIGCONT, a commit of the
  positions it held before it was stopped (a member paused past its session timeout
  must not be able to commit them).

Every event has ``t`` (wall clock, s). SIGTERM closes the consumer (final commit,
leave) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import Any, TextIO

from foundation.errors import BooklineError
from groups.consumer import ConsumerConfig, GroupConsumer, TopicPartition
from thinclient.client import ClientConfig


class Events:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, ev: str, **fields: Any) -> None:
        self.out.write(json.dumps({"ev": ev, "t": time.time(), **fields}) + "\n")
        self.out.flush()


async def run(args: argparse.Namespace, emit: Events) -> None:
    stop = asyncio.Event()
    resumed = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGCONT, resumed.set)

    def listener(ev: str) -> Any:
        def call(tps: list[TopicPartition]) -> None:
            emit(ev, tps=[p for _t, p in tps])

        return call

    config = ConsumerConfig(
        session_timeout_ms=args.session_ms,
        heartbeat_interval_ms=args.heartbeat_ms,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_instance_id=args.instance_id,
        fetch_wait_ms=200,
    )
    consumer = await GroupConsumer.from_cluster_file(
        args.cluster, args.group, [args.topic], via=args.via, config=config,
        client_config=ClientConfig(retry_deadline_ms=10_000, proxy_down_ms=1_000),
        on_assign=listener("assign"), on_revoke=listener("revoke"), on_lost=listener("lost"),
    )  # fmt: skip
    seen = (consumer.member_id, consumer.generation)
    emit("member", member=seen[0], gen=seen[1], pid_started=True)
    before: dict[TopicPartition, int] = {}  # positions held as this iteration began
    try:
        while not stop.is_set():
            if resumed.is_set():
                # `before` was taken before the poll the stop interrupted.
                resumed.clear()
                await _resume_commit(consumer, before, emit)
            before = {
                tp: o for tp in consumer.assignment() if (o := consumer.position(tp)) is not None
            }
            records = await consumer.poll(timeout_s=0.1)
            now = (consumer.member_id, consumer.generation)
            if now != seen:
                seen = now
                emit("member", member=now[0], gen=now[1])
            if not records:
                continue
            ranges: dict[int, list[int]] = {}
            for r in records:
                span = ranges.setdefault(r.partition, [r.offset, r.offset])
                span[1] = r.offset
            emit("batch", ranges=ranges)
            try:
                await consumer.commit()
            except BooklineError as exc:
                emit("commit_error", code=exc.code, name=exc.name)
    finally:
        await consumer.close()
        emit("closed")


async def _resume_commit(
    consumer: GroupConsumer, positions: dict[TopicPartition, int], emit: Events
) -> None:
    if not positions:
        emit("resume_commit", ok=None, code=None)
        return
    try:
        await consumer.commit(positions)
    except BooklineError as exc:
        emit("resume_commit", ok=False, code=exc.code, name=exc.name)
    else:
        emit("resume_commit", ok=True, code=None)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cluster", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--via", default="proxy")
    p.add_argument("--instance-id", default=None)
    p.add_argument("--session-ms", type=int, default=3_000)
    p.add_argument("--heartbeat-ms", type=int, default=500)
    args = p.parse_args()
    with open(args.events, "a", encoding="utf-8") as out:
        asyncio.run(run(args, Events(out)))


if __name__ == "__main__":
    main()
