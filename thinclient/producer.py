"""The thin client's writes: per-stream queues, batching, and idempotent producer
sequences with epochs.

* **Batching and order**: writes to one stream are queued and sent by one sender task,
  up to ``requests_in_flight_per_stream`` requests at once; everything queued meanwhile
  goes in the next request (up to ``batch_records_max`` / ``batch_bytes_max``). The
  owning proxy appends a producer's requests in sequence order whatever order they
  arrive in, so the stream and the DLSNs follow the write order.
* **Idempotence**: the client has a producer id; each request gets the next sequence
  numbers of its stream (within the producer's current *epoch* on it) when it is
  sent, and a retried request reuses them, so the proxy never writes a record twice.
  A request that fails for good leaves a hole in the sequence that nothing will fill:
  the stream's sender then lets its other requests finish (those refused for the hole
  were not written and are kept), bumps the epoch and starts again at sequence 0,
  sending the kept records first (Kafka's KIP-360; see docs/proxies.md).
* **Backpressure**: queued bytes are bounded (``buffer_bytes_max``): callers wait for
  :meth:`Producer.wait_room` or check :meth:`Producer.has_room`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ClosedError,
    OutOfOrderSequenceError,
    TooLargeError,
)
from httpapi import wire, writes
from streams.dlsn import DLSN
from thinclient.config import ClientConfig
from thinclient.records import as_record, is_plain, sizes_of
from thinclient.topics import records_path
from thinclient.transport import Transport

log = logging.getLogger(__name__)

__all__ = ["Chunk", "Producer", "check_sizes"]


@dataclass(slots=True)
class Chunk:
    """One ``write``/``write_many``/``send`` call's records, waiting in ``fut`` for
    their DLSNs -- or, with ``offsets``, their offsets (sequence ids in the stream)."""

    # Plain payloads (the fast path: no WireRecord per record) or full records.
    records: list[bytes] | list[writes.WireRecord]
    order: int  # queued as the stream's order-th chunk (parked chunks go back in order)
    size: int
    fut: asyncio.Future[Any]
    single: bool
    offsets: bool = False


@dataclass
class _Sender:
    """One stream's writes: the queue, and this producer's epoch and next sequence.

    Sequence numbers are given when a request is formed, so a request that fails for
    good leaves a hole only among requests already sent. The sender then stops forming
    requests (``abandoning``) until every request of the epoch is answered -- those
    refused with OUT_OF_ORDER_SEQUENCE for the hole were not written and are
    ``parked`` -- then bumps the epoch, restarts at 0 and sends the parked chunks first.
    Requests whose outcome is unknown are retried in their own epoch until answered
    (or their deadline), so nothing is sent twice under two epochs."""

    stream: str
    producer: str
    queue: collections.deque[Chunk] = field(default_factory=collections.deque)
    epoch: int = 0
    next_seq: int = 0
    abandoning: bool = False
    parked: list[Chunk] = field(default_factory=list)
    queued: int = 0
    task: asyncio.Task[None] | None = None


def check_sizes(sizes: list[int], record_bytes_max: int) -> None:
    """TOO_LARGE, before anything is queued, for a record over the limit."""
    if sizes and max(sizes) > record_bytes_max:
        raise TooLargeError(f"record of {max(sizes)} bytes; at most {record_bytes_max}")


class Producer:
    """Every stream's sender, and the bytes they hold (``buffered``). ``on_batch(stream)``
    is called whenever a request is cut from a stream's queue (the topic router moves
    unkeyed records to another partition then)."""

    def __init__(
        self,
        config: ClientConfig,
        transport: Transport,
        producer_id: str,
        on_batch: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.transport = transport
        self.producer_id = producer_id
        self._on_batch = on_batch
        self.closed = False
        self._senders: dict[str, _Sender] = {}
        self._buffered = 0
        self._room = asyncio.Event()

    # -- queueing ------------------------------------------------------------------

    def enqueue(
        self,
        stream: str,
        records: list[bytes] | list[writes.WireRecord],
        single: bool,
        *,
        offsets: bool = False,
        size: int | None = None,
    ) -> Chunk:
        """Queue ``records`` for ``stream``; the chunk's future gets their DLSN(s), or
        with ``offsets`` their offset(s). ``size``: their total size, when the caller
        computed it and checked every record against ``record_bytes_max``."""
        if self.closed:
            raise ClosedError("ProxyClient was closed")
        if not records:
            raise BadRequestError("nothing to write")
        if size is None:
            sizes = sizes_of(records)
            check_sizes(sizes, self.config.record_bytes_max)
            size = sum(sizes)
        sender = self._senders.get(stream)
        if sender is None:
            sender = self._senders[stream] = _Sender(stream, self.producer_id)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        chunk = Chunk(records, sender.queued, size, fut, single, offsets)
        sender.queued += 1
        sender.queue.append(chunk)
        self._buffered += size
        if sender.task is None:
            sender.task = asyncio.get_running_loop().create_task(self._send_loop(sender))
        return chunk

    def has_room(self, size: int) -> bool:
        return self._buffered == 0 or self._buffered + size <= self.config.buffer_bytes_max

    async def wait_room(self, size: int) -> None:
        while not self.has_room(size):
            self._room.clear()
            await self._room.wait()

    async def flush(self) -> None:
        """Wait until everything queued so far is answered."""
        futs = [c.fut for s in self._senders.values() for c in s.queue]
        tasks = [s.task for s in self._senders.values() if s.task is not None]
        if futs:
            await asyncio.wait(futs)
        if tasks:
            await asyncio.wait(tasks)

    async def drain(self) -> None:
        """Wait for every sender to end (queued writes answered or out of time)."""
        tasks = [s.task for s in self._senders.values() if s.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- sending -------------------------------------------------------------------

    async def _send_loop(self, sender: _Sender) -> None:
        """Send the stream's queue as requests, up to ``requests_in_flight_per_stream``
        at once; records queued while they are in flight form the next request."""
        cfg = self.config
        window: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        try:
            while sender.queue or window or sender.parked:
                if sender.abandoning and not window:
                    self._next_epoch(sender)  # every request of the old epoch is answered
                while (sender.queue and not sender.abandoning
                       and len(window) < cfg.requests_in_flight_per_stream):  # fmt: skip
                    batch, size = self._next_batch(sender.queue)
                    if self._on_batch is not None:
                        self._on_batch(sender.stream)
                    seq = sender.next_seq
                    sender.next_seq += sum(len(c.records) for c in batch)
                    window.add(loop.create_task(
                        self._send_counted(sender, batch, size, sender.epoch, seq)))  # fmt: skip
                if window:
                    _done, pending = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
                    window = set(pending)
        finally:
            sender.task = None
            for task in window:  # cancelled: the requests' futures fail below
                task.cancel()
            left = [*sender.parked, *sender.queue]
            sender.parked.clear()
            sender.queue.clear()
            for chunk in left:  # cancelled with records queued: fail them, don't hang
                if not chunk.fut.done():
                    chunk.fut.set_exception(ClosedError("ProxyClient closed"))

    def _next_epoch(self, sender: _Sender) -> None:
        """After a request failed for good: restart the stream's sequence at 0 in a new
        epoch (which fences the old one at the proxy), parked chunks first, in order."""
        sender.abandoning = False
        if sender.epoch >= writes.EPOCH_MAX:
            sender.producer, sender.epoch = uuid.uuid4().hex, 0  # out of epochs: a new id
        else:
            sender.epoch += 1
        sender.next_seq = 0
        parked = sorted(sender.parked, key=lambda c: c.order)
        sender.parked.clear()
        sender.queue.extendleft(reversed(parked))
        log.info(
            "stream %s: producer %s goes on in epoch %d (%d records held back resent)",
            sender.stream,
            sender.producer,
            sender.epoch,
            sum(len(c.records) for c in parked),
        )

    def _next_batch(self, queue: collections.deque[Chunk]) -> tuple[list[Chunk], int]:
        cfg = self.config
        batch: list[Chunk] = []
        count = size = 0
        while queue:
            nxt = queue[0]
            if batch and (count + len(nxt.records) > cfg.batch_records_max
                          or size + nxt.size > cfg.batch_bytes_max):  # fmt: skip
                break
            batch.append(queue.popleft())
            count += len(nxt.records)
            size += nxt.size
        return batch, size

    async def _send_counted(
        self, sender: _Sender, batch: list[Chunk], size: int, epoch: int, seq: int
    ) -> None:
        parked = False
        try:
            parked = await self._send_batch(sender, batch, epoch, seq)
        finally:
            if not parked:  # parked chunks stay buffered: they are sent again
                self._buffered -= size
                self._room.set()
                for c in batch:  # cancelled before an answer: the caller must not hang
                    if not c.fut.done():
                        c.fut.set_exception(ClosedError("ProxyClient closed"))

    async def _send_batch(self, sender: _Sender, batch: list[Chunk], epoch: int, seq: int) -> bool:
        """Send one request; answer its chunks' futures. True when it was parked: refused
        for the hole a failed request left in ``epoch``, to be sent again in the next."""
        stream = sender.stream
        items = batch[0].records if len(batch) == 1 else [r for c in batch for r in c.records]
        if all(is_plain(c.records) for c in batch):
            payloads: list[Any] = items
            obj = {"producer": sender.producer, "seq": seq, "payloads": payloads,
                   "crc": writes.payloads_crc(payloads)}  # fmt: skip
            if epoch:
                obj["epoch"] = epoch
        else:
            if all(type(r) is writes.WireRecord for r in items):
                recs = cast("list[writes.WireRecord]", items)
            else:
                recs = list(map(as_record, items))
            obj = writes.write_body(recs, sender.producer, seq, epoch)
        records = items
        body = wire.encode_body(obj, wire.MSGPACK)
        path = records_path(stream)

        def hole(error: BooklineError) -> bool:
            # Refused for the gap a failed request of this epoch left: never written, and
            # retrying in this epoch would only wait for its deadline.
            return (isinstance(error, OutOfOrderSequenceError) and sender.abandoning
                    and sender.epoch == epoch)  # fmt: skip

        try:
            answer = await self.transport.call("POST", path, body, stream=stream, give_up=hole)
            # DLSN objects only for calls that want them (sends want offsets).
            dlsns: Sequence[DLSN] = ()
            if not all(c.offsets for c in batch):
                dlsns = writes.answer_dlsns(answer)  # DLSNs already
            answered = len(dlsns) if dlsns else writes.answer_count(answer)
            if answered != len(records):
                raise BadRequestError(f"{answered} positions for {len(records)} records")
            offsets: list[int] | None = None
            if any(c.offsets for c in batch):
                offsets = writes.answer_offsets(answer)
                if offsets is None or len(offsets) != len(records):
                    raise BadRequestError("the write answer lacks the records' offsets")
        except BooklineError as exc:
            if hole(exc):
                sender.parked.extend(batch)
                return True
            if sender.epoch == epoch:
                sender.abandoning = True  # a hole in the sequence: go on in a new epoch
            for c in batch:
                if not c.fut.done():
                    c.fut.set_exception(exc)
            return False
        pos = 0
        for c in batch:
            n = len(c.records)
            if not c.fut.done():
                got: Sequence[Any] = offsets if c.offsets and offsets is not None else dlsns
                c.fut.set_result(got[pos] if c.single else got[pos : pos + n])
            pos += n
        return False
