"""The thin client: :class:`ProxyClient` talks HTTP to write and read proxies.

* **Discovery**: a list of URLs, or ZooKeeper's proxy registry (``proxies/<id>`` for
  write proxies, ``proxies/read@<id>`` for read proxies), refreshed when proxies fail.
* **Routing**: a stream goes to the proxy that owns it (cached from OWNER_MOVED
  answers); an unowned stream to the proxy chosen by rendezvous hashing of the stream
  name over the live write proxies, which then acquires it.
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
* **Retries**: connection failures, 503 (UNAVAILABLE from a proxy that is starting or
  stopping included: it is avoided for a while), 429 and OWNER_MOVED are retried with
  exponential backoff and full jitter until ``retry_deadline_ms``; redirects are
  followed at once.
* **Backpressure**: queued bytes are bounded (``buffer_bytes_max``): ``write`` and
  ``write_many`` wait for room, ``write_nowait`` raises TooManyRequestsError.

:class:`SyncProxyClient` runs a ProxyClient on a private event loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import hashlib
import io
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import aiohttp

from foundation.config import MetadataConfig
from foundation.errors import (
    BadRequestError,
    BooklineError,
    ClosedError,
    ConfigError,
    ConnectionLostError,
    NotEnoughBookiesError,
    OutOfOrderSequenceError,
    OwnerMovedError,
    TimeoutError_,
    TooLargeError,
    TooManyRequestsError,
    UnavailableError,
)
from foundation.limits import RECORD_BYTES_MAX
from httpapi import wire
from httpapi.views import record_from_view
from streams.dlsn import DLSN
from streams.records import ReadRecord

log = logging.getLogger(__name__)

__all__ = ["ClientConfig", "ProxyClient", "ReadPage", "SyncProxyClient"]

T = TypeVar("T")
READ_PROXY_PREFIX = "read@"
RecordLike = bytes | str | wire.WireRecord
# Request bodies above this are streamed from a BytesIO (aiohttp's large-body advice).
BODY_STREAM_BYTES_MIN = 1 << 20


@dataclass(frozen=True, slots=True)
class ClientConfig:
    # One HTTP request's timeout (a write answers once durable: a few ms normally).
    request_timeout_ms: int = 10_000
    # Give up retrying a request after this long.
    retry_deadline_ms: int = 30_000
    # Backoff between retries: initial, doubling up to max, full jitter.
    backoff_initial_ms: int = 20
    backoff_max_ms: int = 1_000
    # OWNER_MOVED redirects followed at once per attempt before backing off.
    redirects_max: int = 5
    # A proxy that refused a connection is avoided this long.
    proxy_down_ms: int = 3_000
    # One write request carries at most this many records / bytes.
    batch_records_max: int = 10_000
    batch_bytes_max: int = 4 * 1024 * 1024
    # Bytes queued but not yet acknowledged, across streams (backpressure beyond).
    buffer_bytes_max: int = 64 * 1024 * 1024
    # A record's payload+key+headers at most (foundation.limits.record_bytes), refused
    # before sending; at most the limit every layer enforces (limits.RECORD_BYTES_MAX).
    record_bytes_max: int = RECORD_BYTES_MAX
    # HTTP connections per proxy.
    connections_per_proxy: int = 64
    # Write requests in flight per stream (like Kafka's max.in.flight.requests with an
    # idempotent producer): each carries the producer's sequence, and the owning proxy
    # appends them in sequence order whatever order they arrive in. 1 = one at a time.
    requests_in_flight_per_stream: int = 5
    # Re-list proxies from ZooKeeper at most this often.
    discovery_refresh_ms: int = 2_000

    def __post_init__(self) -> None:
        for name in (
            "request_timeout_ms",
            "retry_deadline_ms",
            "backoff_initial_ms",
            "backoff_max_ms",
            "batch_records_max",
            "batch_bytes_max",
            "buffer_bytes_max",
            "record_bytes_max",
            "connections_per_proxy",
            "requests_in_flight_per_stream",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"client.{name} must be positive")
        if self.buffer_bytes_max < self.batch_bytes_max:
            raise ConfigError("client.buffer_bytes_max must be >= batch_bytes_max")
        if self.record_bytes_max > RECORD_BYTES_MAX:
            # The proxies and the core writer would refuse what this lets through.
            raise ConfigError(f"client.record_bytes_max above {RECORD_BYTES_MAX}")


@dataclass(frozen=True, slots=True)
class ReadPage:
    records: list[ReadRecord]
    next: str  # position to continue from ("seq:N")


def _as_record(value: RecordLike) -> wire.WireRecord:
    if isinstance(value, wire.WireRecord):
        return value
    if isinstance(value, str):
        return wire.WireRecord(value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return wire.WireRecord(bytes(value))
    raise TypeError(f"a record is bytes, str or WireRecord, not {type(value).__name__}")


def _as_records(values: Sequence[RecordLike]) -> list[bytes] | list[wire.WireRecord]:
    """Plain bytes stay a list of payloads (the common case, no object per record)."""
    if all(type(v) is bytes for v in values):
        return cast("list[bytes]", list(values))
    return [_as_record(v) for v in values]


def _size_of(record: bytes | wire.WireRecord) -> int:
    return len(record) if type(record) is bytes else record.size_bytes  # type: ignore[union-attr]


@dataclass(slots=True)
class _Chunk:
    # Plain payloads (the fast path: no WireRecord per record) or full records.
    records: list[bytes] | list[wire.WireRecord]
    order: int  # queued as the stream's order-th chunk (parked chunks go back in order)
    size: int
    fut: asyncio.Future[Any]
    single: bool


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
    queue: collections.deque[_Chunk] = field(default_factory=collections.deque)
    epoch: int = 0
    next_seq: int = 0
    abandoning: bool = False
    parked: list[_Chunk] = field(default_factory=list)
    queued: int = 0
    task: asyncio.Task[None] | None = None


def _rendezvous(stream: str, urls: Sequence[str]) -> str:
    def score(url: str) -> bytes:
        return hashlib.blake2b(f"{url}\x00{stream}".encode(), digest_size=8).digest()

    return max(urls, key=score)


class ProxyClient:
    """``async with ProxyClient(write_urls=[...], read_urls=[...]) as c: ...``"""

    def __init__(
        self,
        *,
        write_urls: Sequence[str] = (),
        read_urls: Sequence[str] = (),
        zk: str | None = None,
        root: str = "/bookline",
        config: ClientConfig | None = None,
        producer_id: str | None = None,
    ) -> None:
        if not write_urls and not read_urls and zk is None:
            raise ConfigError("ProxyClient needs proxy URLs or a ZooKeeper connect string")
        self.config = config or ClientConfig()
        self.producer_id = producer_id or uuid.uuid4().hex
        self._write_urls = [u.rstrip("/") for u in write_urls]
        self._read_urls = [u.rstrip("/") for u in read_urls]
        self._zk = zk
        self._root = root
        self._md: Any = None
        self._last_discovery = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._owners: dict[str, str] = {}
        self._down: dict[str, float] = {}
        self._senders: dict[str, _Sender] = {}
        self._buffered = 0
        self._room = asyncio.Event()
        self._closed = False
        self._rng = random.Random()
        self.retries = 0
        self.redirects = 0

    @classmethod
    def from_cluster_file(
        cls, path: str | Path, *, config: ClientConfig | None = None, use_zk: bool = False
    ) -> ProxyClient:
        """Proxies from a ``cluster.json`` (``bookline local``); ``use_zk`` discovers
        them from the cluster's ZooKeeper instead."""
        layout = json.loads(Path(path).read_text())
        if use_zk:
            return cls(zk=layout["zk"], root=layout["root"], config=config)
        return cls(
            write_urls=[p["url"] for p in layout.get("write_proxies", [])],
            read_urls=[p["url"] for p in layout.get("read_proxies", [])],
            config=config,
        )

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> ProxyClient:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=self.config.connections_per_proxy
            )
            self._session = aiohttp.ClientSession(connector=connector)
        if self._zk is not None and self._md is None:
            from metadata.client import MetadataClient

            self._md = MetadataClient(MetadataConfig(zk=self._zk, root=self._root))
            await self._md.connect()
            await self._discover(force=True)
        return self

    async def close(self) -> None:
        """Wait for queued writes (bounded by their retry deadline), then close."""
        if self._closed:
            return
        tasks = [s.task for s in self._senders.values() if s.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._closed = True
        if self._session is not None:
            await self._session.close()
        if self._md is not None:
            await self._md.close()

    async def __aenter__(self) -> ProxyClient:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._closed:
            raise ClosedError("ProxyClient is not started or was closed")
        return self._session

    # -- discovery and routing -------------------------------------------------------

    async def _discover(self, force: bool = False) -> None:
        if self._md is None:
            return
        now = time.monotonic()
        if not force and now - self._last_discovery < self.config.discovery_refresh_ms / 1000:
            return
        self._last_discovery = now
        proxies = await self._md.proxies.list()
        self._write_urls = sorted(
            p.address.rstrip("/") for i, p in proxies.items() if not i.startswith(READ_PROXY_PREFIX)
        )
        self._read_urls = sorted(
            p.address.rstrip("/") for i, p in proxies.items() if i.startswith(READ_PROXY_PREFIX)
        )

    def _live(self, urls: list[str]) -> list[str]:
        now = time.monotonic()
        live = [u for u in urls if self._down.get(u, 0.0) <= now]
        return live or urls

    def _mark_down(self, url: str) -> None:
        self._down[url] = time.monotonic() + self.config.proxy_down_ms / 1000

    def _is_down(self, url: str) -> bool:
        return self._down.get(url, 0.0) > time.monotonic()

    def route(self, stream: str) -> str:
        """The write proxy a request for ``stream`` goes to now."""
        owner = self._owners.get(stream)
        if owner is not None and not self._is_down(owner):
            return owner
        urls = self._live(self._write_urls)
        if not urls:
            raise ConnectionLostError("no write proxy known")
        return _rendezvous(stream, urls)

    def _read_url(self) -> str:
        urls = self._live(self._read_urls)
        if not urls:
            raise ConnectionLostError("no read proxy known")
        return self._rng.choice(urls)

    # -- HTTP with retries --------------------------------------------------------------

    async def _http(
        self, method: str, url: str, body: bytes | None, timeout_s: float | None = None
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Accept": wire.MSGPACK}
        if body is not None:
            headers["Content-Type"] = wire.MSGPACK
        timeout = aiohttp.ClientTimeout(
            total=timeout_s if timeout_s is not None else self.config.request_timeout_ms / 1000
        )
        # aiohttp warns that big bytes bodies block the loop; a BytesIO (fresh per
        # attempt: aiohttp closes it) is streamed instead.
        data: bytes | io.BytesIO | None = body
        if body is not None and len(body) > BODY_STREAM_BYTES_MIN:
            data = io.BytesIO(body)
        async with self.session.request(
            method, url, data=data, headers=headers, timeout=timeout, allow_redirects=False
        ) as resp:
            raw = await resp.read()
            return resp.status, wire.decode_body(raw, resp.headers.get("Content-Type"))

    async def _call(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        stream: str | None = None,
        read: bool = False,
        timeout_s: float | None = None,
        give_up: Callable[[BooklineError], bool] | None = None,
    ) -> dict[str, Any]:
        """One logical request: routed, redirected and retried until the deadline (or
        until ``give_up(error)`` says a retriable error is not worth retrying)."""
        cfg = self.config
        deadline = time.monotonic() + cfg.retry_deadline_ms / 1000
        backoff = cfg.backoff_initial_ms / 1000
        redirects = 0
        target: str | None = None
        while True:
            if target is None:
                await self._discover()
                if read:
                    target = self._read_url()
                elif stream is not None:
                    target = self.route(stream)
                else:
                    target = self.route("")
            try:
                status, obj = await self._http(method, target + path, body, timeout_s)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error: BooklineError = (
                    TimeoutError_(f"{method} {target}{path} timed out")
                    if isinstance(exc, TimeoutError)
                    else ConnectionLostError(f"{method} {target}{path}: {exc}")
                )
                error.__cause__ = exc
                if not isinstance(exc, TimeoutError):
                    self._mark_down(target)
                    await self._discover(force=True)
                if stream is not None:
                    self._owners.pop(stream, None)
            else:
                if status < 300:
                    if stream is not None and not read:
                        self._owners[stream] = target
                    return obj
                error = wire.decode_error(obj, status)
            if isinstance(error, OwnerMovedError) and stream is not None:
                owner = (error.owner or "").rstrip("/")
                if owner and not self._is_down(owner) and redirects < cfg.redirects_max:
                    redirects += 1
                    self.redirects += 1
                    self._owners[stream] = owner
                    target = owner
                    continue
                self._owners.pop(stream, None)
            if isinstance(error, UnavailableError):
                # That proxy is starting or stopping: another one may serve meanwhile.
                self._mark_down(target)
                if stream is not None:
                    self._owners.pop(stream, None)
            if not (error.retriable or isinstance(error, NotEnoughBookiesError)):
                raise error
            if give_up is not None and give_up(error):
                raise error
            now = time.monotonic()
            if now >= deadline:
                raise error
            self.retries += 1
            redirects = 0
            await asyncio.sleep(min(self._rng.uniform(0, backoff), deadline - now))
            backoff = min(backoff * 2, cfg.backoff_max_ms / 1000)
            target = None

    # -- writes ---------------------------------------------------------------------

    def _enqueue(
        self, stream: str, records: list[bytes] | list[wire.WireRecord], single: bool
    ) -> _Chunk:
        if self._closed:
            raise ClosedError("ProxyClient was closed")
        if not records:
            raise BadRequestError("nothing to write")
        sizes = list(map(_size_of, records))
        if max(sizes) > self.config.record_bytes_max:
            raise TooLargeError(
                f"record of {max(sizes)} bytes; at most {self.config.record_bytes_max}"
            )
        size = sum(sizes)
        sender = self._senders.get(stream)
        if sender is None:
            sender = self._senders[stream] = _Sender(stream, self.producer_id)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        chunk = _Chunk(records, sender.queued, size, fut, single)
        sender.queued += 1
        sender.queue.append(chunk)
        self._buffered += size
        if sender.task is None:
            sender.task = asyncio.get_running_loop().create_task(self._send_loop(sender))
        return chunk

    def _has_room(self, size: int) -> bool:
        return self._buffered == 0 or self._buffered + size <= self.config.buffer_bytes_max

    async def _wait_room(self, size: int) -> None:
        while not self._has_room(size):
            self._room.clear()
            await self._room.wait()

    def write_nowait(self, stream: str, record: RecordLike) -> asyncio.Future[DLSN]:
        """Queue one record; the future resolves to its DLSN once durable."""
        rec = _as_records([record])
        if not self._has_room(_size_of(rec[0])):
            raise TooManyRequestsError("client buffer full; await write() instead")
        fut: asyncio.Future[DLSN] = self._enqueue(stream, rec, True).fut
        return fut

    async def write(self, stream: str, record: RecordLike) -> DLSN:
        rec = _as_records([record])
        await self._wait_room(_size_of(rec[0]))
        result: DLSN = await self._enqueue(stream, rec, True).fut
        return result

    def write_many_nowait(
        self, stream: str, records: Sequence[RecordLike]
    ) -> asyncio.Future[list[DLSN]]:
        recs = _as_records(records)
        if not self._has_room(sum(map(_size_of, recs))):
            raise TooManyRequestsError("client buffer full; await write_many() instead")
        fut: asyncio.Future[list[DLSN]] = self._enqueue(stream, recs, False).fut
        return fut

    async def write_many(self, stream: str, records: Sequence[RecordLike]) -> list[DLSN]:
        """Write records in order; their DLSNs once all are durable."""
        recs = _as_records(records)
        await self._wait_room(sum(map(_size_of, recs)))
        result: list[DLSN] = await self._enqueue(stream, recs, False).fut
        return result

    async def flush(self) -> None:
        """Wait until everything queued so far is answered."""
        futs = [c.fut for s in self._senders.values() for c in s.queue]
        tasks = [s.task for s in self._senders.values() if s.task is not None]
        if futs:
            await asyncio.wait(futs)
        if tasks:
            await asyncio.wait(tasks)

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
        if sender.epoch >= wire.EPOCH_MAX:
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

    def _next_batch(self, queue: collections.deque[_Chunk]) -> tuple[list[_Chunk], int]:
        cfg = self.config
        batch: list[_Chunk] = []
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
        self, sender: _Sender, batch: list[_Chunk], size: int, epoch: int, seq: int
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

    async def _send_batch(self, sender: _Sender, batch: list[_Chunk], epoch: int, seq: int) -> bool:
        """Send one request; answer its chunks' futures. True when it was parked: refused
        for the hole a failed request left in ``epoch``, to be sent again in the next."""
        stream = sender.stream
        items = [r for c in batch for r in c.records]
        if all(type(r) is bytes for r in items):
            payloads: list[Any] = items
            obj = {"producer": sender.producer, "seq": seq, "payloads": payloads,
                   "crc": wire.payloads_crc(payloads)}  # fmt: skip
            if epoch:
                obj["epoch"] = epoch
        else:
            obj = wire.write_body(list(map(_as_record, items)), sender.producer, seq,
                                      epoch)  # fmt: skip
        records = items
        body = wire.encode_body(obj, wire.MSGPACK)
        path = f"{wire.API_PREFIX}/streams/{stream}/records"

        def hole(error: BooklineError) -> bool:
            # Refused for the gap a failed request of this epoch left: never written, and
            # retrying in this epoch would only wait for its deadline.
            return (isinstance(error, OutOfOrderSequenceError) and sender.abandoning
                    and sender.epoch == epoch)  # fmt: skip

        try:
            answer = await self._call("POST", path, body, stream=stream, give_up=hole)
            dlsns = [DLSN(*d) for d in wire.answer_dlsns(answer)]
            if len(dlsns) != len(records):
                raise BadRequestError(f"{len(dlsns)} DLSNs for {len(records)} records")
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
                c.fut.set_result(dlsns[pos] if c.single else dlsns[pos : pos + n])
            pos += n
        return False

    # -- stream management ---------------------------------------------------------------

    def _path(self, stream: str, suffix: str = "") -> str:
        return f"{wire.API_PREFIX}/streams/{stream}{suffix}"

    async def create_stream(self, name: str) -> None:
        body = wire.encode_body({"name": name}, wire.MSGPACK)
        await self._call("POST", f"{wire.API_PREFIX}/streams", body)

    async def list_streams(self) -> list[str]:
        obj = await self._call("GET", f"{wire.API_PREFIX}/streams", None)
        return list(obj.get("streams", []))

    async def describe(self, name: str) -> dict[str, Any]:
        return await self._call("GET", self._path(name), None)

    async def delete_stream(self, name: str) -> None:
        await self._call("DELETE", self._path(name), None, stream=name)
        self._owners.pop(name, None)

    async def truncate(self, name: str, dlsn: DLSN) -> None:
        body = wire.encode_body({"dlsn": str(dlsn)}, wire.MSGPACK)
        await self._call("POST", self._path(name, "/truncate"), body, stream=name)

    async def release(self, name: str) -> None:
        await self._call("POST", self._path(name, "/release"), None, stream=name)
        self._owners.pop(name, None)

    async def heartbeat(self, name: str) -> dict[str, Any]:
        return await self._call("POST", self._path(name, "/heartbeat"), None, stream=name)

    async def owner(self, name: str) -> str | None:
        obj = await self._call("GET", self._path(name, "/owner"), None)
        owner = obj.get("owner")
        return owner if isinstance(owner, str) else None

    # -- reads ------------------------------------------------------------------------

    async def read(
        self, stream: str, start: str = "earliest", limit: int = 100, wait_ms: int = 0
    ) -> ReadPage:
        """A page of records from ``start`` (earliest, latest, ``s:e:s``, ``seq:N``,
        ``txid:N``, ``time:MS``); ``wait_ms`` long-polls for the first record."""
        wire.parse_position(start)  # fail early on a bad position
        query = f"?from={start}&limit={limit}&wait_ms={wait_ms}"
        timeout = self.config.request_timeout_ms / 1000 + wait_ms / 1000
        obj = await self._call(
            "GET", self._path(stream, "/records") + query, None, read=True, timeout_s=timeout
        )
        raw = obj.get("records")
        if not isinstance(raw, list):
            raise BadRequestError("read answer without records")
        return ReadPage([record_from_view(stream, r) for r in raw], str(obj.get("next", start)))

    async def tail(self, stream: str, start: str = "latest") -> AsyncGenerator[ReadRecord, None]:
        """Every record from ``start`` on, following the stream (WebSocket), across
        read proxy failures (it resumes where it stopped)."""
        wire.parse_position(start)
        position = start
        backoff = self.config.backoff_initial_ms / 1000
        while True:
            url = self._read_url()
            ws_url = (
                url.replace("http", "ws", 1) + self._path(stream, "/tail") + f"?from={position}"
            )
            try:
                async with self.session.ws_connect(ws_url, heartbeat=30.0, max_msg_size=0) as ws:
                    backoff = self.config.backoff_initial_ms / 1000
                    async for msg in ws:
                        if msg.type is aiohttp.WSMsgType.BINARY:
                            obj = wire.decode_body(msg.data, wire.MSGPACK)
                        elif msg.type is aiohttp.WSMsgType.TEXT:
                            obj = wire.decode_body(msg.data.encode(), wire.JSON)
                        else:
                            break
                        if "error" in obj:
                            raise wire.decode_error(obj["error"], 500)
                        for r in obj.get("records", []):
                            yield record_from_view(stream, r)
                        position = str(obj.get("next", position))
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status < 500:
                    raise BadRequestError(f"tail of {stream} refused: HTTP {exc.status}") from exc
                self._mark_down(url)
            except (aiohttp.ClientError, OSError) as exc:
                log.info("tail of %s via %s broke (%s); resuming at %s", stream, url, exc, position)
                self._mark_down(url)
            await asyncio.sleep(self._rng.uniform(0, backoff))
            backoff = min(backoff * 2, self.config.backoff_max_ms / 1000)
            await self._discover(force=True)


class SyncProxyClient:
    """Blocking facade: a ProxyClient on a private event loop thread."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="bookline-proxy-client"
        )
        self._thread.start()
        self._client: ProxyClient = self._run(self._make(kwargs))

    async def _make(self, kwargs: dict[str, Any]) -> ProxyClient:
        return await ProxyClient(**kwargs).start()

    @classmethod
    def from_cluster_file(cls, path: str | Path, **kwargs: Any) -> SyncProxyClient:
        layout = json.loads(Path(path).read_text())
        return cls(
            write_urls=[p["url"] for p in layout.get("write_proxies", [])],
            read_urls=[p["url"] for p in layout.get("read_proxies", [])],
            **kwargs,
        )

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def write(self, stream: str, record: RecordLike) -> DLSN:
        return self._run(self._client.write(stream, record))

    def write_many(self, stream: str, records: Sequence[RecordLike]) -> list[DLSN]:
        return self._run(self._client.write_many(stream, records))

    def write_async(self, stream: str, record: RecordLike) -> concurrent.futures.Future[DLSN]:
        """Pipelined: a concurrent.futures.Future resolving to the DLSN."""
        return asyncio.run_coroutine_threadsafe(self._client.write(stream, record), self._loop)

    def flush(self) -> None:
        self._run(self._client.flush())

    def read(
        self, stream: str, start: str = "earliest", limit: int = 100, wait_ms: int = 0
    ) -> ReadPage:
        return self._run(self._client.read(stream, start, limit, wait_ms))

    def tail(self, stream: str, start: str = "latest") -> Iterator[ReadRecord]:
        agen = self._client.tail(stream, start)

        async def step() -> ReadRecord:
            return await agen.__anext__()

        try:
            while True:
                yield self._run(step())
        except StopAsyncIteration:
            return
        finally:
            with contextlib.suppress(RuntimeError):
                self._run(agen.aclose())

    def create_stream(self, name: str) -> None:
        self._run(self._client.create_stream(name))

    def list_streams(self) -> list[str]:
        return self._run(self._client.list_streams())

    def describe(self, name: str) -> dict[str, Any]:
        return self._run(self._client.describe(name))

    def delete_stream(self, name: str) -> None:
        self._run(self._client.delete_stream(name))

    def close(self) -> None:
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> SyncProxyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
