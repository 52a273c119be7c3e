"""Produce: record batches into partition streams through the write core.

Each partition's batch is decoded into a :class:`~serving.write.batch.WriteBatch` --
plain records (no headers, no null value: what producers send most) straight into its
columns of values, keys and the producer's timestamps, others one object per record
(key, value or null, header pairs, timestamp) -- admitted on the request's bytes first,
like an HTTP write. The answer's base offset is the first record's sequence id in the stream.

``acks``: 0 gets no answer at all (Kafka's rule); 1 and -1 are both answered once the
records are on the ack quorum of bookies, fsynced -- Bookline has no weaker write.
An idempotent producer's batch (producer id >= 0) carries its producer id, epoch and
base sequence onto the core's de-duplication (``kafka:<id>`` as the producer), so a
retried batch is answered with its first write's offsets, never written twice, and a
batch is written only where it follows the producer's history here (``strict``: a
Kafka producer reads a later batch's success as the acknowledgement of the earlier
ones). What each refusal means to the producer: :mod:`kafkaapi.errormap`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from foundation.errors import BooklineError, TooManyRequestsError, UnknownPartitionError
from foundation.names import partition_stream
from groups.topics import TopicAdmin
from kafkaapi.errormap import kafka_code
from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.errors import KafkaCode, KafkaProtocolError
from kafkaapi.protocol.records import ProducedBatch, decode_produced, split_batches
from serving.write.batch import ProducerSeq, WriteBatch

if TYPE_CHECKING:
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request
    from serving.write.core import WriteCore

__all__ = ["init_producer_id", "kafka_producer", "produce"]

log = logging.getLogger(__name__)

_NOT_LEADER: Final = kerr.code_named("NOT_LEADER_OR_FOLLOWER")
_DENIED: Final = kerr.code_named("TOPIC_AUTHORIZATION_FAILED")
_INVALID_RECORD: Final = kerr.code_named("INVALID_RECORD")
_TXN: Final = kerr.code_named("TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
# Over the admission limits, nothing written: "retry later". Not THROTTLING_QUOTA_EXCEEDED
# (Kafka's for topic admin), which librdkafka takes as a permanent produce failure: the
# records fail and it bumps the producer's epoch, numbering anew records of other
# partitions that may be stored.
_BUSY: Final = kerr.code_named("NOT_ENOUGH_REPLICAS")
# For the same reason a server failure is never UNKNOWN_SERVER_ERROR (permanent to
# librdkafka) on Produce but KAFKA_STORAGE_ERROR: retried with the same sequence.
# What was handed to a writer that failed is REQUEST_TIMED_OUT (kafkaapi.errormap).
_UNKNOWN: Final = kerr.code_named("UNKNOWN_SERVER_ERROR")
_STORAGE: Final = kerr.code_named("KAFKA_STORAGE_ERROR")
# Producer epochs are int16; the last one cannot be bumped.
_EPOCH_MAX: Final = (1 << 15) - 1


def kafka_producer(producer_id: int) -> str:
    """The de-duplication table's producer name of a Kafka producer id."""
    return f"kafka:{producer_id}"


async def produce(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any] | None:
    body = request.body
    transactional = body["transactional_id"] is not None
    jobs = [
        _in_turn(session, topic["name"], part["index"],
                 functools.partial(_partition, serving, session, topic["name"], part,
                                   transactional))
        for topic in body["topic_data"]
        for part in topic["partition_data"]
    ]  # fmt: skip
    if len(jobs) == 1:
        # One partition (librdkafka sends one a request): served in the request's own
        # task, with no task of its own to start and gather (two loop turns each way).
        answers = iter([await jobs[0].run])
    else:
        tasks = []
        for job in jobs:
            task = asyncio.ensure_future(job.run)
            # A task cancelled before its first step never runs its coroutine's finally.
            task.add_done_callback(functools.partial(_pass, job.pass_turn))
            tasks.append(task)
        answers = iter(await asyncio.gather(*tasks))
    if body["acks"] == 0:
        return None  # acks=0: the client reads no answer
    responses = [
        {
            "name": topic["name"],
            "partition_responses": [next(answers) for _ in topic["partition_data"]],
        }
        for topic in body["topic_data"]
    ]
    return {"responses": responses, "throttle_time_ms": 0}


class _Turn(NamedTuple):
    """A partition's part of a Produce: ``run`` (to await, or wrap in a task, at once)
    and ``pass_turn`` (idempotent: lets the next request to the partition go)."""

    run: Coroutine[Any, Any, dict[str, Any]]
    pass_turn: Callable[[], None]


def _pass(pass_turn: Callable[[], None], _task: asyncio.Future[Any]) -> None:
    pass_turn()


def _in_turn(
    session: Session,
    topic: str,
    index: int,
    job: Callable[[Callable[[], None]], Awaitable[dict[str, Any]]],
) -> _Turn:
    """``job(pass_turn)`` run once the connection's Produce before this one to the
    partition has passed its turn: its batch was handed to the stream's writer (its
    ``pass_turn`` called, :attr:`WriteBatch.on_handed`) or it ended. Pipelined requests
    (:mod:`kafkaapi.listener`) so reach the write core in the order they came per
    partition -- the de-duplication sees a producer's batches in its order and never
    waits for a "gap" that is only a request overtaken inside the proxy -- while a
    batch still follows the one before it into the writer without waiting for its
    quorum write. Called as the request's handler starts (requests start in the order
    they came), so it takes the partition's turn at once. The turn passes, and the
    partition's entry of the session is dropped, on the hand-over or however ``run``
    ends; a task cancelled before its first step never runs ``run``'s ``finally``, so
    the caller wrapping it in a task passes the turn when the task is done too."""
    tails = session.partition_tails
    key = (topic, index)
    before = tails.get(key)
    turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    tails[key] = turn

    def pass_turn() -> None:
        if not turn.done():
            turn.set_result(None)
        if tails.get(key) is turn:
            del tails[key]

    async def in_turn() -> dict[str, Any]:
        try:
            if before is not None and not before.done():
                await asyncio.wait((before,))  # wait() never cancels nor raises it
            return await job(pass_turn)
        finally:
            pass_turn()  # however it ended

    return _Turn(in_turn(), pass_turn)


async def _partition(  # noqa: PLR0917 - the partition's request, and its turn
    serving: KafkaServing,
    session: Session,
    topic: str,
    part: dict[str, Any],
    transactional: bool,
    pass_turn: Callable[[], None],
) -> dict[str, Any]:
    index: int = part["index"]
    if transactional:
        return _answer(index, _TXN, "transactions are not supported (docs/kafka.md)")
    if not serving.allowed(session, "produce", "topic", topic):
        return _answer(index, _DENIED, f"may not produce to topic {topic!r}")
    write = serving.write
    if write is None:
        return _answer(index, _NOT_LEADER, "a read proxy leads no partition")
    try:
        offset = await _write(serving, write, topic, index, part["records"] or b"", pass_turn)
    except BooklineError as exc:
        code = _BUSY if isinstance(exc, TooManyRequestsError) else kafka_code(exc)
        if code.code == _UNKNOWN.code:
            # A failure of the server's, not the request's (e.g. the partition's log
            # could not be read back to take it over): retried, not failed for good.
            log.warning("produce to %s/%d failed: %s", topic, index, exc)
            code = _STORAGE
        return _answer(index, code, exc.message)
    return {"index": index, "error_code": 0, "base_offset": offset}


def _answer(index: int, code: KafkaCode, message: str) -> dict[str, Any]:
    return {"index": index, "error_code": code.code, "base_offset": -1, "error_message": message}


async def _write(  # noqa: PLR0917 - the partition's request, and its turn
    serving: KafkaServing,
    write: WriteCore,
    topic: str,
    index: int,
    raw: bytes,
    pass_turn: Callable[[], None],
) -> int:
    if index < 0:
        raise UnknownPartitionError(f"partition {index} of topic {topic}")
    stream = partition_stream(topic, index)
    with write.admit(stream, len(raw)) as admission:
        views = split_batches(raw)
        if len(views) != 1:
            # Kafka's producers send one batch per partition (v3+), and a batch's
            # producer sequence numbers hold for it alone.
            raise KafkaProtocolError(_INVALID_RECORD, f"{len(views)} record batches; one expected")
        batch = decode_produced(views[0])
        if batch.count == 0:
            raise KafkaProtocolError(_INVALID_RECORD, "a record batch without records")
        if batch.control or batch.transactional:
            raise KafkaProtocolError(_INVALID_RECORD, "control or transactional batch")
        await _check_partition(serving, topic, index)
        result = await write.write(admission, _write_batch(stream, batch, pass_turn))
    return result.offsets[0]


async def _check_partition(serving: KafkaServing, topic: str, index: int) -> None:
    """The partition must exist before its stream is acquired (never auto-created);
    the write proxy's topic hosting skips the look-up for a partition it owns."""
    if serving.topics is not None:
        await serving.topics.partition_for_write(topic, index)
        return
    count = await TopicAdmin(serving.ns()).partitions(topic)  # NOT_FOUND without the topic
    if not 0 <= index < count:
        raise UnknownPartitionError(f"topic {topic} has {count} partitions; not {index}")


class _Record(NamedTuple):
    """A Kafka record as the write core takes it (a ``BatchRecord``)."""

    payload: bytes | None
    key: bytes | None
    headers: Sequence[tuple[str, bytes | None]] | None
    timestamp_ms: int | None
    txid: int | None = None


def _write_batch(stream: str, batch: ProducedBatch, handed: Callable[[], None]) -> WriteBatch:
    producer = None
    if batch.producer_id >= 0 and batch.base_sequence >= 0:
        # strict: a Kafka producer takes a later batch's success as the acknowledgement
        # of its earlier ones, so no first sequence is accepted over a gap.
        producer = ProducerSeq(
            kafka_producer(batch.producer_id),
            batch.base_sequence,
            batch.producer_epoch,
            strict=True,
        )
    log_append = batch.log_append_time  # then the timestamps are the log's to set
    columns = batch.columns
    if columns is not None:
        stamps: Sequence[int | None] | None = None
        if not log_append:
            raw = columns.timestamps
            stamps = raw if min(raw) >= 0 else [None if t < 0 else t for t in raw]
        return WriteBatch(stream, producer, columns.values, columns.keys, timestamps=stamps,
                          on_handed=handed)  # fmt: skip
    records = [
        _Record(
            r.value,
            r.key,
            r.headers or None,
            None if log_append or r.timestamp < 0 else r.timestamp,
        )
        for r in batch.records
    ]
    return WriteBatch(stream, producer, records=records, on_handed=handed)


async def init_producer_id(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    """A producer id for an idempotent producer: a random positive int63, unique in
    practice without coordination (a collision needs about 3 * 10^9 producers); an
    existing id (KIP-360: v3+ after a fatal sequence error) gets its epoch bumped,
    which fences its older epoch's writes in the core's de-duplication. A
    transactional id is refused: transactions are not supported (docs/kafka.md)."""
    body = request.body
    if body["transactional_id"] is not None:
        return {"throttle_time_ms": 0, "error_code": _TXN.code, "producer_epoch": -1}
    producer_id, epoch = body["producer_id"], body["producer_epoch"]
    if producer_id >= 0 and 0 <= epoch < _EPOCH_MAX:
        return {"throttle_time_ms": 0, "error_code": 0,
                "producer_id": producer_id, "producer_epoch": epoch + 1}  # fmt: skip
    fresh = secrets.randbits(63) or 1
    return {"throttle_time_ms": 0, "error_code": 0, "producer_id": fresh, "producer_epoch": 0}
