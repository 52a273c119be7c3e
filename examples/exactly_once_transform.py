"""Exactly-once consume-transform-produce, from one Bookline topic into another.

The input and output topics have the same partition count; the task for input
partition ``p`` writes its results to output partition ``p`` only. Each result carries
the input offset it came from (header ``source-offset``), so the output record and the
input position it consumed are **one durable write**: nothing to commit separately,
nothing to get out of step.

* On assignment of input partition ``p``, the task opens output partition ``p``'s
  writer (the stream's single-writer lock: it waits for a crashed predecessor's
  ZooKeeper session to expire, then recovers and seals its last segment -- fencing it at
  the bookies), reads the last result there and resumes the input just after its
  ``source-offset``.
* A zombie -- an old task that was paused, not dead -- can no longer write: its ledger
  was fenced by the new writer, so its writes fail and it stops. It never adds a
  duplicate.
* Group commits are made for monitoring (lag) only; the output is the truth.
* A fault (a lost ZooKeeper session, a fenced or failed writer, a partition taken away
  while its writer lock was awaited) ends the consumer's session, not the task: it
  closes its writers, waits a moment and joins the group again, resuming every
  partition it gets from its output as above (up to ``RESTARTS_MAX`` in a row without
  a record written in between).

Per-key order holds: a key's records are in one input partition, read in order, and
written in that order to one output partition.

    python -m examples.exactly_once_transform --cluster .cluster/cluster.json \\
        --topic orders --output orders-upper --group upper --produce 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence

from bookline import LogRecord, LogWriter, Namespace, NamespaceConfig, ProxyClient, StartPosition
from bookline.errors import AlreadyExistsError, BooklineError, NotAssignedError, TimeoutError_
from examples.common import ensure_topic, parse
from foundation.backoff import Backoff, BackoffPolicy
from groups.consumer import ConsumerConfig, ConsumerRecord, GroupConsumer, TopicPartition
from groups.topics import TopicAdmin

log = logging.getLogger("exactly_once_transform")

SOURCE_OFFSET = "source-offset"
# How long a new task waits for a crashed predecessor's writer lock (its session).
LOCK_WAIT_S = 60.0
# How long reading the last result of an output partition may take.
LAST_RESULT_WAIT_S = 10.0
# Consecutive consumer sessions ended by a fault, with nothing written in between,
# before the task gives up (a fault that persists is not going to heal by retrying).
RESTARTS_MAX = 10
# Pause before rejoining after a fault, doubled per consecutive fault up to the max.
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 8.0


def output_stream(topic: str, partition: int) -> str:
    """Partition p of topic t is the stream "t~p" (docs/topics.md, "Names")."""
    return f"{topic}~{partition}"


def transform(record: ConsumerRecord) -> LogRecord:
    value = record.value
    return LogRecord(
        None if value is None else value.upper(),  # a tombstone stays one
        key=record.key,
        headers=[(SOURCE_OFFSET, str(record.offset).encode())],
    )


async def last_source_offset(ns: Namespace, stream: str) -> int:
    """The input offset behind the last result in ``stream`` (-1: none yet). Called
    with the stream's writer open, so its last segment is recovered and final."""
    end = await ns.end_offset(stream)
    if end == 0:
        return -1
    reader = await ns.open_reader(stream, StartPosition.sequence(end - 1))
    try:
        last = await reader.read_next(timeout_s=LAST_RESULT_WAIT_S)
    finally:
        await reader.close()
    if last is None:  # unreadable for now (bookies, a session): a fault, retried
        raise TimeoutError_(
            f"{stream}: its last result (sequence id {end - 1}) could not be read "
            f"within {LAST_RESULT_WAIT_S:.0f} s"
        )
    offsets = [v for name, v in last.headers or [] if name == SOURCE_OFFSET and v is not None]
    if not offsets:
        raise RuntimeError(f"{stream}: the last record has no {SOURCE_OFFSET} header")
    return int(offsets[-1])


class Transformer:
    def __init__(self, ns: Namespace, output: str) -> None:
        self.ns = ns
        self.output = output
        self.writers: dict[int, LogWriter] = {}
        self.consumer: GroupConsumer | None = None
        self.written = 0  # results written by this task (progress between faults)

    async def on_assign(self, tps: list[TopicPartition]) -> None:
        assert self.consumer is not None
        for topic, p in tps:
            await self._close_writer(p)  # given back before its revocation finished
            stream = output_stream(self.output, p)
            writer = await self.ns.open_writer(
                stream, identity=f"transform-{os.getpid()}", lock_timeout_s=LOCK_WAIT_S
            )
            self.writers[p] = writer
            resume = await last_source_offset(self.ns, stream) + 1
            try:
                self.consumer.seek((topic, p), resume)
            except NotAssignedError:
                # Taken away while the lock was awaited: on_revoke / on_lost closes
                # the writer; nothing of the partition is returned meanwhile.
                log.warning("input %s/%d: revoked while being assigned", topic, p)
                continue
            log.warning("input %s/%d: resuming at %d (from %s)", topic, p, resume, stream)

    async def _close_writer(self, p: int) -> None:
        writer = self.writers.pop(p, None)
        if writer is not None:
            with contextlib.suppress(BooklineError):  # fenced already, most likely
                await writer.close()

    async def close_all(self) -> None:
        """After a fault: every writer closed (sealing what it can), none kept."""
        for p in list(self.writers):
            await self._close_writer(p)

    async def on_revoke(self, tps: list[TopicPartition]) -> None:
        for _topic, p in tps:
            writer = self.writers.pop(p, None)
            if writer is not None:
                await writer.close()  # flush and seal: the next task reads it all

    async def on_lost(self, tps: list[TopicPartition]) -> None:
        for _topic, p in tps:
            await self._close_writer(p)

    async def handle(self, records: list[ConsumerRecord]) -> None:
        """Write the batch's results; return once all are durable. A writer that fails
        (fenced: another task owns the partition now) raises: this task must stop."""
        pending = [self.writers[r.partition].write_nowait(transform(r)) for r in records]
        await asyncio.gather(*pending)
        self.written += len(pending)


async def main(argv: Sequence[str] | None = None) -> None:
    args = parse(
        __doc__ or "",
        argv,
        extra=[("--output", {"default": "orders-upper", "help": "topic the results go to"})],
    )
    await ensure_topic(args.cluster, args.topic, args.partitions, args.produce)
    config = NamespaceConfig(session_timeout_ms=3_000)  # a crashed task's lock goes in 3 s
    async with await Namespace.from_cluster_file(args.cluster, config=config) as ns:
        admin = TopicAdmin(ns)
        partitions = await admin.partitions(args.topic)
        with contextlib.suppress(AlreadyExistsError):
            await admin.create_topic(args.output, partitions)
        if await admin.partitions(args.output) != partitions:
            raise SystemExit(f"{args.output} must have {partitions} partitions like {args.topic}")
        task = Transformer(ns, args.output)
        async with ProxyClient.from_cluster_file(args.cluster) as client:
            await run_with_restarts(lambda: consume(task, client, args), lambda: task.written)


async def consume(task: Transformer, client: ProxyClient, args: argparse.Namespace) -> None:
    """One consumer session until ``idle_exit_s`` without a record. A fault raises
    (the writers are closed by then)."""
    consumer = GroupConsumer(
        args.group, [args.topic], client=client, namespace=task.ns,
        config=ConsumerConfig(auto_offset_reset="earliest", session_timeout_ms=3_000),
        on_assign=task.on_assign, on_revoke=task.on_revoke, on_lost=task.on_lost,
    )  # fmt: skip
    task.consumer = consumer
    try:
        await consumer.start()
        last = time.monotonic()
        while time.monotonic() - last < args.idle_exit_s:
            records = await consumer.poll(timeout_s=0.5)
            if records:
                await task.handle(records)
                last = time.monotonic()
    except BaseException:
        await task.close_all()  # before leaving: a fenced writer's close is quick
        with contextlib.suppress(BooklineError):
            await consumer.close()
        raise
    await consumer.close()  # on_revoke closes the writers


async def run_with_restarts(
    session: Callable[[], Awaitable[None]], progress: Callable[[], int]
) -> None:
    """Run consumer sessions until one ends cleanly (idle); a BooklineError ends a
    session, not the task. Gives up after ``RESTARTS_MAX`` faults with no
    ``progress()`` in between."""
    policy = BackoffPolicy(
        delay_s=RESTART_BACKOFF_S, max_delay_s=RESTART_BACKOFF_MAX_S, max_tries=RESTARTS_MAX
    )
    backoff = Backoff(policy)
    seen = progress()
    while True:
        try:
            await session()
            return
        except BooklineError as exc:
            if progress() != seen:
                backoff.reset()
            seen = progress()
            if backoff.expired():
                raise
            pause = backoff.next_s()
            log.warning(
                "fault %d (%s: %s); rejoining in %.1f s", backoff.tries, exc.name, exc, pause
            )
            await asyncio.sleep(pause)


if __name__ == "__main__":
    asyncio.run(main())
