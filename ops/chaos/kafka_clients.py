"""The chaos run's Kafka-client workload (issue 25): librdkafka through confluent-kafka.

Writer processes of ``bookline chaos --workload kafka`` (started like the other
writers, ``python -m ops.chaos.workload writer --kind kafka-producer|kafka-consumer``,
so the nemesis may ``kill -9`` and pause them):

* ``kafka-producer`` -- an idempotent producer (``enable.idempotence``, ``acks=all``)
  sending keyed records to the run's 6-partition topic through the proxies' Kafka
  listeners; each value names its producer and sequence (``<writer>.<incarnation>.<seq>``).
  The attempt is recorded before ``produce()``, the delivery report as the outcome:
  ``ok`` with the partition and offset, else ``unknown`` -- librdkafka retries an
  idempotent record itself, so a record reported failed (a timeout, a fatal error, a
  purge on the way out) may still have been written once; it must never be there twice.
  Only a record ``produce()`` refused to queue is ``failed``. A fatal error (the
  idempotent state lost) makes a new producer, a new producer id, in the same process.
* ``kafka-consumer`` -- a member of the run's consumer group (``subscribe``, manual
  commits): every record it is handed is recorded (``consumed``) before the offsets are
  committed, so a record below a committed offset was recorded by someone.

:func:`drain_group` is the final phase's last member: after the workload stopped, it
consumes the group's topic from the committed offsets to the end, commits, and records
each partition's committed and end offsets (``group_end``) for the checker.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from foundation.names import partition_stream
from ops.chaos.checker import Attempt, Consumed, GroupEnd, HistoryWriter, Outcome

log = logging.getLogger(__name__)

__all__ = [
    "GROUP",
    "KAFKA_KINDS",
    "KafkaSpec",
    "client_config",
    "drain_group",
    "run_kafka_writer",
]

KAFKA_KINDS: Final = ("kafka-producer", "kafka-consumer")
# The consumer group of the run's consumers and of the final drain.
GROUP: Final = "chaos-kafka-group"
# Distinct keys per producer (keyed records: one key stays in one partition).
KEYS: Final = 12
# librdkafka retries an idempotent record this long before reporting it (unknown).
MESSAGE_TIMEOUT_MS: Final = 120_000
# A member missing its heartbeats this long leaves the group (kill -9, pause, cut off).
GROUP_SESSION_TIMEOUT_MS: Final = 10_000
# Records per consume() call, and how long one waits.
CONSUME_BATCH: Final = 200
CONSUME_WAIT_S: Final = 0.5
# librdkafka calls that wait on the cluster (flush on the way out, committed offsets).
CALL_TIMEOUT_S: Final = 15.0


@dataclass(frozen=True, slots=True)
class KafkaSpec:
    """One incarnation of one Kafka writer process."""

    name: str
    kind: str
    incarnation: int
    cluster_file: Path
    history_dir: Path
    rate_per_s: float
    topic: str
    seed: int = 0

    @property
    def producer(self) -> str:
        return f"{self.name}.{self.incarnation}"


def client_config(cluster_file: Path, client_id: str) -> dict[str, Any]:
    """librdkafka's settings for the cluster ``cluster_file`` describes: its Kafka
    bootstrap list and, with auth on, SASL PLAIN as admin with the admin token."""
    doc = json.loads(cluster_file.read_text())
    servers = doc.get("kafka_bootstrap")
    if not servers:
        raise RuntimeError(f"{cluster_file} has no kafka_bootstrap: the Kafka listener is off")
    conf: dict[str, Any] = {
        "bootstrap.servers": servers,
        "client.id": client_id,
        # Proxies come back quickly after a kill: look again soon.
        "reconnect.backoff.max.ms": 1_000,
        "topic.metadata.refresh.interval.ms": 5_000,
    }
    token_file = doc.get("token_file")
    if token_file:
        token = (cluster_file.parent / str(token_file)).read_text().strip()
        conf |= {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "admin",  # the principal cluster.json's token names
            "sasl.password": token,
        }
    return conf


def _text(payload: bytes | None) -> str:
    return "<null>" if payload is None else payload.decode(errors="backslashreplace")


# -- producer ------------------------------------------------------------------------------


class _Producer:
    """One idempotent librdkafka producer and its history; a fatal error makes another
    (a new producer id: ``<writer>.<incarnation>-<generation>``)."""

    def __init__(self, spec: KafkaSpec, history: HistoryWriter) -> None:
        self.spec, self.history = spec, history
        self.generation = 0
        self.fatal: str | None = None
        self.name = spec.producer
        self.client = self._make()

    def _make(self) -> Any:
        from confluent_kafka import Producer

        conf = client_config(self.spec.cluster_file, self.name) | {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            # The idempotence state machine's log (epoch bumps, sequence resets) in the
            # writer's log: what explains a duplicate the checker finds.
            "debug": "eos",
            "error_cb": self._on_error,
        }
        return Producer(conf)

    def _on_error(self, err: Any) -> None:
        log.warning("producer %s: %s", self.name, err)
        if err.fatal():
            self.fatal = str(err)

    def renew(self) -> None:
        """After a fatal error: report what the old producer holds, then a new one."""
        log.error("producer %s: fatal error %s; a new producer", self.name, self.fatal)
        self.client.flush(CALL_TIMEOUT_S)  # every record reported (errors: unknown)
        self.generation += 1
        self.name, self.fatal = f"{self.spec.producer}-{self.generation}", None
        self.client = self._make()

    def send(self, seq: int) -> None:
        value = f"{self.name}.{seq}"
        topic = self.spec.topic
        self.history.record(Attempt(value, self.spec.name, self.name, topic, seq, time.time()))
        try:
            self.client.produce(
                topic, value=value.encode(), key=f"k{seq % KEYS}".encode(),
                on_delivery=self._on_delivery,
            )  # fmt: skip
        except (BufferError, ValueError, RuntimeError) as exc:  # not queued: not written
            self.history.record(Outcome(value, "failed", None, None, repr(exc)[:300], time.time()))

    def _on_delivery(self, err: Any, msg: Any) -> None:
        value = _text(msg.value())
        if err is None:
            stream = partition_stream(msg.topic(), msg.partition())
            offset = msg.offset()
            # librdkafka acknowledges a retried record the broker had already written
            # (DUPLICATE_SEQUENCE_NUMBER) without its offset: acknowledged, place unknown.
            position = f"offset:{offset}" if offset is not None and offset >= 0 else None
            note = None if position else "acknowledged without an offset"
            outcome = Outcome(value, "ok", position, stream, note, time.time())
        else:  # librdkafka may have written it before the error: maybe there, once
            outcome = Outcome(value, "unknown", None, None, str(err)[:300], time.time())
        self.history.record(outcome)


def _serve(client: Any, seconds: float, stop: threading.Event) -> None:
    """Serve delivery reports for ``seconds`` (poll() returns after the first one)."""
    until = time.monotonic() + seconds
    while not stop.is_set() and (left := until - time.monotonic()) > 0:
        client.poll(left)


def run_producer(spec: KafkaSpec, stop: threading.Event) -> None:
    """Produce at ``rate_per_s`` until ``stop``; then flush what is in flight (what is
    not reported by then has no outcome: unknown)."""
    rng = random.Random(f"{spec.seed}/{spec.name}/{spec.incarnation}")
    with HistoryWriter(spec.history_dir / f"{spec.producer}.jsonl") as history:
        producer = _Producer(spec, history)
        print(f"writer {spec.producer} ready", flush=True)
        seq = 0
        while not stop.is_set():
            if producer.fatal is not None:
                producer.renew()
            producer.send(seq)
            seq += 1
            _serve(producer.client, rng.expovariate(spec.rate_per_s), stop)
        left = producer.client.flush(CALL_TIMEOUT_S)
        log.info("producer %s: %d records unreported at the end", producer.name, left)


# -- consumers -----------------------------------------------------------------------------


def _consumer(cluster_file: Path, client_id: str) -> Any:
    from confluent_kafka import Consumer

    conf = client_config(cluster_file, client_id) | {
        "group.id": GROUP,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": GROUP_SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": 1_000,
    }
    return Consumer(conf)


def _consume_once(consumer: Any, name: str, history: HistoryWriter) -> list[Any]:
    """One batch recorded, then committed (a refused commit means its records are
    handed out again: at least once)."""
    from confluent_kafka import KafkaException

    batch = consumer.consume(CONSUME_BATCH, CONSUME_WAIT_S)
    got = []
    for msg in batch:
        if msg.error() is not None:
            log.warning("consumer %s: %s", name, msg.error())
            continue
        stream = partition_stream(msg.topic(), msg.partition())
        history.record(Consumed(name, stream, f"offset:{msg.offset()}", _text(msg.value())))
        got.append(msg)
    if got:
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:
            log.warning("consumer %s: commit refused: %s", name, exc)
    return got


def run_consumer(spec: KafkaSpec, stop: threading.Event) -> None:
    """A member of :data:`GROUP` until ``stop``; then it leaves the group."""
    with HistoryWriter(spec.history_dir / f"{spec.producer}.jsonl") as history:
        consumer = _consumer(spec.cluster_file, spec.producer)
        try:
            consumer.subscribe([spec.topic])
            print(f"writer {spec.producer} ready", flush=True)
            while not stop.is_set():
                _consume_once(consumer, spec.producer, history)
        finally:
            consumer.close()


def run_kafka_writer(spec: KafkaSpec, stop: threading.Event) -> None:
    runner: Callable[[KafkaSpec, threading.Event], None] = (
        run_producer if spec.kind == "kafka-producer" else run_consumer
    )
    runner(spec, stop)


def drain_group(
    cluster_file: Path, topic: str, partitions: int, history: HistoryWriter, deadline_s: float
) -> bool:
    """The group's last member: consume from the committed offsets until every
    partition's committed offset is its end (or ``deadline_s`` passes), then record
    each partition's committed and end offsets. True when the end was reached."""
    from confluent_kafka import KafkaException, TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = _consumer(cluster_file, "final-drain")
    deadline = time.monotonic() + deadline_s
    committed: dict[int, int] = {}
    ends: dict[int, int] = {}
    try:
        consumer.subscribe([topic])
        while True:
            _consume_once(consumer, "final-drain", history)
            try:
                committed = {
                    tp.partition: tp.offset for tp in consumer.committed(tps, CALL_TIMEOUT_S)
                }
                ends = {
                    tp.partition: consumer.get_watermark_offsets(tp, CALL_TIMEOUT_S)[1]
                    for tp in tps
                }
            except KafkaException as exc:
                log.warning("final drain: %s", exc)
            done = len(ends) == partitions and all(
                committed.get(p, -1) >= e for p, e in ends.items()
            )
            if done or time.monotonic() > deadline:
                break
    finally:
        consumer.close()
    for p in range(partitions):
        stream = partition_stream(topic, p)
        history.record(GroupEnd(GROUP, stream, committed.get(p, -1), ends.get(p, -1)))
    return bool(ends) and all(committed.get(p, -1) >= e for p, e in ends.items())
