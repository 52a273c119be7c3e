"""Exactly-once into an external sink: the offsets live with the output (SQLite here).

Each batch's rows and the partition's next offset are written in **one SQLite
transaction**, so they are durable together or not at all; the group's own committed
offsets are not what restarts use. On assignment the task reads its partitions' next
offsets from the database and seeks there (``on_assign`` runs before any record of the
partition is returned).

The offset update is a compare-and-set (``WHERE next_offset = <the batch's first
offset>``): if another task has moved the partition on meanwhile -- this one is a
paused zombie, say -- the transaction is rolled back and the task seeks to the stored
offset instead. Nothing is ever written twice.

    python -m examples.exactly_once_sink --cluster .cluster/cluster.json --topic orders \\
        --group sink --db sink.sqlite --produce 1000
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sqlite3
import time
from collections.abc import Sequence

from examples.common import ensure_topic, parse
from groups.consumer import ConsumerConfig, ConsumerRecord, GroupConsumer, TopicPartition

log = logging.getLogger("exactly_once_sink")

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key TEXT, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS offsets (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition));
"""


class Sink:
    def __init__(self, path: str) -> None:
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        self.db.executescript(SCHEMA)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a COMMIT is durable

    def next_offset(self, tp: TopicPartition) -> int | None:
        row = self.db.execute(
            "SELECT next_offset FROM offsets WHERE topic = ? AND partition = ?", tp
        ).fetchone()
        return None if row is None else int(row[0])

    def store(self, tp: TopicPartition, records: Sequence[ConsumerRecord]) -> bool:
        """Rows and the next offset in one transaction; False (nothing written) when the
        stored offset is not where this batch starts."""
        first, nxt = records[0].offset, records[-1].offset + 1
        self.db.execute("BEGIN IMMEDIATE")
        try:
            stored = self.next_offset(tp)
            if stored is not None and stored != first:
                self.db.execute("ROLLBACK")
                return False
            self.db.executemany(
                "INSERT INTO results VALUES (?, ?, ?, ?, ?)",
                [(r.topic, r.partition, r.offset, (r.key or b"").decode(),
                  (r.value or b"").decode()) for r in records],
            )  # fmt: skip
            self.db.execute(
                "INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, partition) "
                "DO UPDATE SET next_offset = excluded.next_offset",
                (*tp, nxt),
            )
            self.db.execute("COMMIT")
            return True
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()


async def main(argv: Sequence[str] | None = None) -> None:
    args = parse(
        __doc__ or "",
        argv,
        extra=[("--db", {"default": "sink.sqlite", "help": "SQLite database of the sink"})],
    )
    await ensure_topic(args.cluster, args.topic, args.partitions, args.produce)
    sink = Sink(args.db)
    consumer: GroupConsumer

    def on_assign(tps: list[TopicPartition]) -> None:
        for tp in tps:
            stored = sink.next_offset(tp)
            if stored is not None:
                consumer.seek(tp, stored)  # else: the group's auto_offset_reset

    config = ConsumerConfig(
        auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=3_000
    )
    consumer = await GroupConsumer.from_cluster_file(
        args.cluster, args.group, [args.topic], config=config, on_assign=on_assign
    )
    last = time.monotonic()
    try:
        while time.monotonic() - last < args.idle_exit_s:
            records = await consumer.poll(timeout_s=0.5)
            if not records:
                continue
            last = time.monotonic()
            for tp, group in itertools.groupby(records, key=lambda r: r.tp):
                batch = list(group)
                if not sink.store(tp, batch):
                    stored = sink.next_offset(tp)
                    log.warning("%s moved on to %s elsewhere; seeking there", tp, stored)
                    if stored is not None:
                        consumer.seek(tp, stored)
            consumer.commit_async()  # for lag only: restarts use the sink's offsets
    finally:
        await consumer.close()
        sink.close()


if __name__ == "__main__":
    asyncio.run(main())
