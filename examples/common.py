"""What the examples share: their flags, a topic to play with, and the "processing"
(a line per record appended to a file, so a test can check what was processed)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from bookline import Namespace
from bookline.errors import AlreadyExistsError
from groups.consumer import ConsumerRecord
from groups.producer import TopicProducer
from groups.topics import TopicAdmin

__all__ = ["Output", "add_flags", "ensure_topic", "parse"]


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default=".cluster/cluster.json",
                   help="cluster.json of `bookline local --dir .cluster`")  # fmt: skip
    p.add_argument("--topic", default="orders", help="topic to consume")
    p.add_argument("--group", default="example", help="consumer group")
    p.add_argument("--partitions", type=int, default=4, help="partitions if the topic is new")
    p.add_argument("--produce", type=int, default=0,
                   help="first create the topic if needed and add this many records")  # fmt: skip
    p.add_argument("--out", default="processed.txt", help="where processed records go")
    p.add_argument("--idle-exit-s", type=float, default=5.0,
                   help="stop after this long without a record")  # fmt: skip


def parse(description: str, argv: Sequence[str] | None = None,
          extra: Sequence[tuple[str, dict[str, object]]] = ()) -> argparse.Namespace:  # fmt: skip
    p = argparse.ArgumentParser(description=description)
    add_flags(p)
    for flag, kwargs in extra:
        p.add_argument(flag, **kwargs)  # type: ignore[arg-type]
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    return p.parse_args(argv)


async def ensure_topic(cluster: str, topic: str, partitions: int, records: int) -> None:
    """Create ``topic`` unless it exists, then add ``records`` records ``value-i`` with
    keys ``key-(i % 16)`` (Kafka's key partitioning: a key's records share a partition,
    in order)."""
    async with await Namespace.from_cluster_file(cluster) as ns:
        admin = TopicAdmin(ns)
        if topic not in await admin.list_topics():
            with contextlib.suppress(AlreadyExistsError):  # another process was quicker
                await admin.create_topic(topic, partitions)
        if records:
            producer = TopicProducer(ns)
            try:
                for start in range(0, records, 1000):
                    await asyncio.gather(*(
                        producer.send(topic, f"value-{i}", key=f"key-{i % 16}")
                        for i in range(start, min(records, start + 1000))
                    ))  # fmt: skip
            finally:
                await producer.close()


class Output:
    """The "processing": one line ``partition offset key value`` per record, appended
    and flushed (a killed process loses nothing it wrote)."""

    def __init__(self, path: str | Path) -> None:
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def process(self, records: Sequence[ConsumerRecord]) -> None:
        self._file.write("".join(
            f"{r.partition} {r.offset} {(r.key or b'').decode()} {(r.value or b'').decode()}\n"
            for r in records
        ))  # fmt: skip
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
