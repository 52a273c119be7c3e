"""One Kafka consumer group member in its own process (so a test can kill -9 it), with
the client and assignor a test names, for tests/test_kafka_classic_groups.py.

``python -m tests.kafka_group_member CLIENT BOOTSTRAP TOPIC GROUP ASSIGNOR SESSION_MS
[INSTANCE_ID]``: subscribes, reads, commits what it read after each poll (manual
commits), and prints one JSON line whenever its state changes: the partitions it
holds, every partition it was ever asked to give up (``revoked``: a count per
partition) and how many records it read. It runs until killed; SIGTERM closes the
consumer (leaving the group) and exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

_POLL_S = 0.3


@dataclass(frozen=True, slots=True)
class Args:
    bootstrap: str
    topic: str
    group: str
    assignor: str
    session_ms: int
    instance: str | None


class Report:
    def __init__(self) -> None:
        self.held: set[int] = set()
        self.revoked: dict[int, int] = {}
        self.read = 0
        self._last = ""

    def revoke(self, partitions: set[int]) -> None:
        for p in partitions:
            self.revoked[p] = self.revoked.get(p, 0) + 1

    def emit(self) -> None:
        doc = {"held": sorted(self.held), "revoked": self.revoked, "read": self.read}
        line = json.dumps(doc, sort_keys=True)
        if line != self._last:
            self._last = line
            print(line, flush=True)


def _stop_on_term() -> dict[str, bool]:
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    return stop


def _python_client_settings(a: Args, assignor: Any) -> dict[str, Any]:
    """kafka-python's and aiokafka's consumer settings (the same names in both)."""
    extra: dict[str, Any] = {"group_instance_id": a.instance} if a.instance else {}
    return {
        "bootstrap_servers": a.bootstrap,
        "group_id": a.group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "partition_assignment_strategy": (assignor,),
        "session_timeout_ms": a.session_ms,
        "heartbeat_interval_ms": 300,
        **extra,
    }


def kafka_python(a: Args) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    report, stop = Report(), _stop_on_term()

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            report.revoke({tp.partition for tp in revoked})

        def on_partitions_assigned(self, assigned: Any) -> None:
            pass

    consumer = KafkaConsumer(**_python_client_settings(a, assignors[a.assignor]))
    consumer.subscribe([a.topic], listener=Listener())
    while not stop["now"]:
        batches = consumer.poll(timeout_ms=int(_POLL_S * 1000))
        report.read += sum(len(records) for records in batches.values())
        if batches:
            consumer.commit()
        report.held = {tp.partition for tp in consumer.assignment()}
        report.emit()
    consumer.close()


def confluent(a: Args) -> None:
    from confluent_kafka import Consumer

    report, stop = Report(), _stop_on_term()
    conf: dict[str, Any] = {
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group,
        "partition.assignment.strategy": a.assignor,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": a.session_ms,
        "heartbeat.interval.ms": 300,
    }
    if os.environ.get("GROUP_MEMBER_LOG"):
        conf.update({"debug": "cgrp", "logger": logging.getLogger("confluent")})
    if a.instance:
        conf["group.instance.id"] = a.instance
    consumer = Consumer(conf)

    def on_revoke(_consumer: Any, parts: Any) -> None:
        report.revoke({tp.partition for tp in parts})

    consumer.subscribe([a.topic], on_revoke=on_revoke)
    while not stop["now"]:
        msgs = consumer.consume(100, _POLL_S)
        good = [m for m in msgs if m.error() is None]
        report.read += len(good)
        if good:
            consumer.commit(asynchronous=False)
        report.held = {tp.partition for tp in consumer.assignment()}
        report.emit()
    consumer.close()


async def aiokafka(a: Args) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    report, stop = Report(), _stop_on_term()

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            report.revoke({tp.partition for tp in revoked})

        def on_partitions_assigned(self, assigned: Any) -> None:
            pass

    consumer = AIOKafkaConsumer(**_python_client_settings(a, assignors[a.assignor]))
    consumer.subscribe([a.topic], listener=Listener())
    await consumer.start()
    while not stop["now"]:
        batches = await consumer.getmany(timeout_ms=int(_POLL_S * 1000))
        report.read += sum(len(records) for records in batches.values())
        if batches:
            await consumer.commit()
        report.held = {tp.partition for tp in consumer.assignment()}
        report.emit()
    await consumer.stop()


def _log_to_file() -> None:
    """DEBUG of the clients' group coordinators into $GROUP_MEMBER_LOG, if set."""
    path = os.environ.get("GROUP_MEMBER_LOG")
    if not path:
        return
    logging.basicConfig(
        filename=path, level=logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    for name in ("kafka.coordinator", "kafka.consumer", "aiokafka.consumer", "confluent"):
        logging.getLogger(name).setLevel(logging.DEBUG)


def main(argv: list[str]) -> None:
    _log_to_file()
    client, bootstrap, topic, group, assignor, session = argv[:6]
    instance = argv[6] if len(argv) > 6 else None
    args = Args(bootstrap, topic, group, assignor, int(session), instance)
    if client == "kafka-python":
        kafka_python(args)
    elif client == "confluent-kafka":
        confluent(args)
    else:
        asyncio.run(aiokafka(args))


if __name__ == "__main__":
    main(sys.argv[1:])
