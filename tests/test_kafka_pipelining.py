"""Pipelined Produce requests on one Kafka connection (kafkaapi/listener.py and
kafkaapi/produce.py), over a write core the test controls: served while the connection
reads on, answered in the order they came, a producer's batches to one partition
handed to the core one after the other in their order, and at most
``requests_inflight_max`` requests held per connection."""

from __future__ import annotations

import asyncio
import functools
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from foundation.errors import UnavailableError
from kafkaapi.context import KafkaServing, Session
from kafkaapi.listener import KafkaListener, ListenerLimits, _Budget, _Pipeline
from kafkaapi.protocol.apis_cluster import API_VERSIONS
from kafkaapi.protocol.apis_data import PRODUCE
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import encode_request
from kafkaapi.protocol.records import Record, RecordBatch, encode_batch
from serving.write.batch import WriteBatch
from tests.waiting import wait_for

_VERSION = 9
_PRODUCER_ID = 7


@dataclass
class _Core:
    """A write core and topic hosting whose first partition check of a held partition
    waits until it is released, and which remembers the batches written, in order."""

    held: set[int] = field(default_factory=set)
    writes_held: set[int] = field(default_factory=set)  # written, not answered yet
    released: asyncio.Event = field(default_factory=asyncio.Event)
    checking: list[int] = field(default_factory=list)
    written: list[tuple[int, int]] = field(default_factory=list)  # (partition, seq)

    async def partition_for_write(self, name: str, partition: int) -> str:
        self.checking.append(partition)
        first = self.checking.count(partition) == 1
        while first and partition in self.held:
            self.released.clear()
            await self.released.wait()
        return f"{name}~{partition}"

    def release(self, partition: int) -> None:
        self.held.discard(partition)
        self.writes_held.discard(partition)
        self.released.set()

    @contextmanager
    def admit(self, stream: str, size: int) -> Iterator[Any]:
        yield stream

    async def write(self, admission: Any, batch: WriteBatch) -> Any:
        assert batch.producer is not None
        partition = int(batch.stream.rsplit("~", 1)[1])
        self.written.append((partition, batch.producer.seq))
        offset = len(self.written) - 1
        assert batch.on_handed is not None
        batch.on_handed()  # in the stream: the quorum write may take its time
        while partition in self.writes_held:
            self.released.clear()
            await self.released.wait()
        return type("Result", (), {"offsets": [offset]})()


def _serving(core: _Core) -> KafkaServing:
    def unused() -> Any:
        raise UnavailableError("not used by Produce here")

    return KafkaServing(
        "wp-1", 1, ns=unused, pages=unused, write=cast(Any, core), authority=None,
        topics=cast(Any, core),
    )  # fmt: skip


@pytest.fixture
async def served() -> AsyncIterator[tuple[_Core, KafkaListener, int]]:
    core = _Core()
    listener = KafkaListener(_serving(core), ListenerLimits(requests_inflight_max=3))
    port = await listener.start("127.0.0.1", 0)
    try:
        yield core, listener, port
    finally:
        await listener.stop()


def _produce(correlation_id: int, partition: int, seq: int) -> bytes:
    batch = RecordBatch(
        0, (Record(0, 1_700_000_000_000, b"key", b"value"),),
        producer_id=_PRODUCER_ID, producer_epoch=0, base_sequence=seq,
    )  # fmt: skip
    body = {
        "transactional_id": None, "acks": -1, "timeout_ms": 30_000,
        "topic_data": [{"name": "t", "partition_data": [
            {"index": partition, "records": encode_batch(batch)}]}],
    }  # fmt: skip
    return frame(encode_request(PRODUCE, _VERSION, correlation_id, "test", body))


@asynccontextmanager
async def _sent(port: int, *frames: bytes) -> AsyncIterator[asyncio.StreamReader]:
    """A connection to the listener with ``frames`` written on it; its reader, for the
    answers. Closed on the way out."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(frames))
        await writer.drain()
        yield reader
    finally:
        writer.close()


async def _answers(reader: asyncio.StreamReader, count: int) -> list[int]:
    """The correlation ids of the next ``count`` answers, in the order they came."""
    ids = []
    for _ in range(count):
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        raw = await reader.readexactly(size)
        ids.append(struct.unpack_from(">i", raw)[0])
    return ids


async def test_a_produce_is_served_while_the_one_before_waits_and_answered_after_it(
    served: tuple[_Core, KafkaListener, int],
) -> None:
    core, _listener, port = served
    core.held.add(0)
    async with _sent(
        port, _produce(1, partition=0, seq=0), _produce(2, partition=1, seq=0)
    ) as reader:
        # The second request reaches the core while the first still waits on its own.
        await wait_for(lambda: core.written == [(1, 0)], "the second produce written")
        core.release(0)
        assert await asyncio.wait_for(_answers(reader, 2), 30) == [1, 2]
        assert core.written == [(1, 0), (0, 0)]


async def test_a_producers_batches_to_one_partition_reach_the_core_in_their_order(
    served: tuple[_Core, KafkaListener, int],
) -> None:
    core, _listener, port = served
    core.held.add(0)
    async with _sent(
        port, _produce(1, partition=0, seq=0), _produce(2, partition=0, seq=1)
    ) as reader:
        await wait_for(lambda: core.checking[:1] == [0], "the first produce checking its partition")
        await asyncio.sleep(0.3)  # the behaviour under test: the second does not overtake
        assert core.written == []
        core.release(0)
        assert await asyncio.wait_for(_answers(reader, 2), 30) == [1, 2]
        assert core.written == [(0, 0), (0, 1)]


async def test_a_producers_next_batch_follows_the_one_being_written_at_once(
    served: tuple[_Core, KafkaListener, int],
) -> None:
    """Once a batch is in the stream, the next one to the partition needs not wait for
    its quorum write (the write core keeps the producer's order from there)."""
    core, _listener, port = served
    core.writes_held.add(0)
    async with _sent(
        port, _produce(1, partition=0, seq=0), _produce(2, partition=0, seq=1)
    ) as reader:
        await wait_for(lambda: core.written == [(0, 0), (0, 1)], "both batches in the stream")
        core.release(0)
        assert await asyncio.wait_for(_answers(reader, 2), 30) == [1, 2]


async def test_other_requests_wait_for_the_produce_answers_before_them(
    served: tuple[_Core, KafkaListener, int],
) -> None:
    core, _listener, port = served
    core.held.add(0)
    versions = frame(encode_request(API_VERSIONS, 3, 2, "test", {}))
    async with _sent(
        port, _produce(1, partition=0, seq=0), versions, _produce(3, partition=1, seq=0)
    ) as reader:
        await wait_for(lambda: core.checking == [0], "the first produce checking its partition")
        await asyncio.sleep(0.3)  # the behaviour under test: nothing after it is served
        assert core.written == []
        core.release(0)
        assert await asyncio.wait_for(_answers(reader, 3), 30) == [1, 2, 3]
        assert core.written == [(0, 0), (1, 0)]


async def test_a_connection_holds_at_most_its_requests_in_flight(
    served: tuple[_Core, KafkaListener, int],
) -> None:
    core, listener, port = served
    core.held.add(0)
    free = listener.free_bytes
    requests = [_produce(i, partition=0, seq=i) for i in range(6)]
    async with _sent(port, *requests) as reader:
        # requests_inflight_max (3) served, and the fourth read, waiting for room.
        held = sum(map(len, requests[:4]))
        await wait_for(lambda: listener.free_bytes == free - held, "four frames held")
        await asyncio.sleep(0.3)  # the behaviour under test: no fourth request taken
        assert listener.free_bytes == free - held
        core.release(0)
        assert await asyncio.wait_for(_answers(reader, 6), 30) == list(range(6))
        assert core.written == [(0, seq) for seq in range(6)]
        await wait_for(lambda: listener.free_bytes == free, "every frame's bytes given back")


class _Socket:
    """The connection's writing side, as the pipeline uses it: the frames written."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.transport = self

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        raise AssertionError("the connection is not closed here")

    async def drain(self) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return 16 * 1024, 64 * 1024


async def test_a_produce_is_answered_in_the_loop_turn_after_its_write_is() -> None:
    """The answer leaves in the loop turn after the write core answers: no task to
    start, gather or wake in between (issue 25: each was a loop turn, a wait behind
    everything else a busy proxy's loop had to do, at every one of a producer's
    requests; the one turn left lets the turn's other callbacks -- a quorum
    acknowledgement's LAC push -- go first)."""
    core = _Core()
    core.writes_held.add(0)
    listener = KafkaListener(_serving(core))
    socket = _Socket()
    pipeline = _Pipeline(cast(Any, socket), _Budget(1 << 20), inflight_max=5)
    raw = _produce(7, partition=0, seq=0)[4:]  # the frame's body
    try:
        await pipeline.submit(functools.partial(listener._answer, raw, Session("test")), len(raw))
        await wait_for(lambda: core.written == [(0, 0)], "the batch handed to the write core")
        core.release(0)  # the write core answers: its waiter wakes in the next loop turn
        await asyncio.sleep(0)  # that turn: the request ends
        assert socket.written == []
        await asyncio.sleep(0)  # the next: its answer is written
        assert len(socket.written) == 1
        assert struct.unpack_from(">i", socket.written[0], 4)[0] == 7  # the correlation id
    finally:
        pipeline.close()
