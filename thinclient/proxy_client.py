""":class:`ProxyClient`: the thin client's asyncio face, over its parts.

``routing`` (which proxy), ``transport`` (HTTP, retries, redirects), ``producer``
(batched idempotent writes with epochs), ``topics`` (partition counts and choice, topic
admin), ``reads`` (pages and tails); this module holds the lifecycle, the write and
send calls, stream and topic management and the read calls.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from ssl import SSLContext
from typing import Any, cast

import aiohttp

from foundation.auth import env_token
from foundation.cluster_file import read_cluster_file
from foundation.errors import ConfigError, NotFoundError, TooManyRequestsError
from foundation.names import partition_stream
from foundation.tls import cluster_ssl
from httpapi import topics as topic_wire
from httpapi import wire
from httpapi.views import info_from_view
from httpapi.writes import HeadersLike
from metadata.topics import TopicRecord
from streams.dlsn import DLSN, StartPosition
from streams.records import ReadRecord
from streams.vocabulary import StreamInfo, TopicInfo, TopicOptions
from thinclient import reads
from thinclient.config import ClientConfig
from thinclient.producer import Producer, check_sizes
from thinclient.reads import ReadPage, position_text, stream_path
from thinclient.records import (
    RecordLike,
    Records,
    as_records,
    key_of,
    keyed,
    one,
    size_of,
    sizes_of,
)
from thinclient.routing import ProxyDirectory
from thinclient.topics import TopicRouter, topic_path
from thinclient.transport import Transport

__all__ = ["ProxyClient", "Start"]

# Where a read starts: the core library's positions, or the HTTP API's text.
Start = StartPosition | DLSN | str


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
        ssl: SSLContext | None = None,
        token: str | None = None,
        zk_digest_file: str = "",
    ) -> None:
        """``ssl``: the context to dial ``https`` proxies with (None: the process's
        ``[tls]`` settings, else the system's CAs). ``token``: the proxies' bearer token
        when their auth is on; without one ``$BOOKLINE_TOKEN`` (and, from a cluster
        file, the token file it names). ``zk_digest_file``: ZooKeeper digest credentials
        for discovery through ``zk`` (metadata.digest_file)."""
        if not write_urls and not read_urls and zk is None:
            raise ConfigError("ProxyClient needs proxy URLs or a ZooKeeper connect string")
        self.config = config or ClientConfig()
        self.producer_id = producer_id or uuid.uuid4().hex
        rng = random.Random()  # backoff jitter and read proxy choice
        self._proxies = ProxyDirectory(
            self.config,
            write_urls=write_urls,
            read_urls=read_urls,
            zk=zk,
            root=root,
            rng=rng,
            zk_digest_file=zk_digest_file,
        )
        self._transport = Transport(
            self.config, self._proxies, rng, ssl=ssl, token=token or env_token()
        )
        self._topics = TopicRouter(self.config, self._transport, rng)
        self._producer = Producer(
            self.config, self._transport, self.producer_id, on_batch=self._topics.batch_cut
        )
        self._closed = False

    @classmethod
    def from_cluster_file(
        cls,
        path: str | Path,
        *,
        config: ClientConfig | None = None,
        use_zk: bool = False,
        token: str | None = None,
    ) -> ProxyClient:
        """Proxies from a ``cluster.json`` (``bookline local``); ``use_zk`` discovers
        them from the cluster's ZooKeeper instead. ConfigError when the file is missing
        or malformed (:func:`foundation.cluster_file.read_cluster_file`)."""
        cluster = read_cluster_file(path)
        ssl = cluster_ssl(cluster.raw)
        token = token or env_token() or cluster.token()
        if use_zk:
            digest = cluster.zk_digest_file or ""
            return cls(
                zk=cluster.zk, root=cluster.root, config=config, ssl=ssl, token=token,
                zk_digest_file=digest,
            )  # fmt: skip
        write_urls, read_urls = cluster.write_urls, cluster.read_urls
        return cls(write_urls=write_urls, read_urls=read_urls, config=config, ssl=ssl, token=token)

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> ProxyClient:
        self._transport.open()
        await self._proxies.connect()
        return self

    async def close(self) -> None:
        """Wait for queued writes (bounded by their retry deadline), then close."""
        if self._closed:
            return
        await self._producer.drain()
        self._closed = self._producer.closed = True
        await self._transport.close()
        await self._proxies.close()

    async def __aenter__(self) -> ProxyClient:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def transport(self) -> Transport:
        """The client's HTTP: one logical request, routed, retried and redirected
        (``call``), its session and proxy directory. Public for the layers built on the
        thin client (consumer groups' fetchers and coordinator client)."""
        return self._transport

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._transport.session

    @property
    def retries(self) -> int:
        """Requests sent again after a retriable error (since the client was made)."""
        return self._transport.retries

    @property
    def redirects(self) -> int:
        """OWNER_MOVED redirects followed."""
        return self._transport.redirects

    def route(self, stream: str) -> str:
        """The write proxy a request for ``stream`` goes to now."""
        return self._proxies.route(stream)

    # -- writes ---------------------------------------------------------------------

    def write_nowait(
        self,
        stream: str,
        record: RecordLike,
        key: bytes | str | None = None,
        headers: HeadersLike | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[DLSN]:
        """Queue one record; the future resolves to its DLSN once durable."""
        rec = keyed(record, key, headers, timestamp_ms)
        if not self._producer.has_room(size_of(rec)):
            raise TooManyRequestsError("client buffer full; await write() instead")
        fut: asyncio.Future[DLSN] = self._producer.enqueue(stream, one(rec), True).fut
        return fut

    async def write(
        self,
        stream: str,
        record: RecordLike,
        key: bytes | str | None = None,
        headers: HeadersLike | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> DLSN:
        """Write one record (bytes, str, None for a null value, WireRecord or LogRecord;
        ``key=``, ``headers=`` (ordered ``(name, value)`` pairs) and ``timestamp_ms=``
        beside a plain value); its DLSN once durable."""
        rec = keyed(record, key, headers, timestamp_ms)
        await self._producer.wait_room(size_of(rec))
        result: DLSN = await self._producer.enqueue(stream, one(rec), True).fut
        return result

    def write_many_nowait(
        self, stream: str, records: Sequence[RecordLike]
    ) -> asyncio.Future[list[DLSN]]:
        recs = as_records(records)
        size = self._checked_size(recs)
        if not self._producer.has_room(size):
            raise TooManyRequestsError("client buffer full; await write_many() instead")
        fut: asyncio.Future[list[DLSN]] = self._producer.enqueue(stream, recs, False, size=size).fut
        return fut

    async def write_many(self, stream: str, records: Sequence[RecordLike]) -> list[DLSN]:
        """Write records in order; their DLSNs once all are durable."""
        recs = as_records(records)
        size = self._checked_size(recs)
        await self._producer.wait_room(size)
        result: list[DLSN] = await self._producer.enqueue(stream, recs, False, size=size).fut
        return result

    def _checked_size(self, records: Records) -> int:
        """The records' total size, after TOO_LARGE for any over the limit."""
        sizes = sizes_of(records)
        check_sizes(sizes, self.config.record_bytes_max)
        return sum(sizes)

    async def flush(self) -> None:
        """Wait until everything queued so far is answered."""
        await self._producer.flush()

    # -- topics: producing --------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: RecordLike,
        key: bytes | str | None = None,
        headers: HeadersLike | None = None,
        partition: int | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> tuple[int, int]:
        """Send one record to ``topic``; ``(partition, offset)`` once it is durable.
        Keyed: Kafka's partition for the key; unkeyed: sticky batches spread over the
        partitions; ``partition=`` picks one (UNKNOWN_PARTITION if it does not exist).
        Per partition, records keep their order and retries never duplicate them.
        ``value=None`` is Kafka's null value (a tombstone when keyed); ``headers`` are
        ordered ``(name, value)`` pairs (a mapping is taken as its items);
        ``timestamp_ms`` the record's CreateTime (None: the log stamps it)."""
        rec = keyed(value, key, headers, timestamp_ms)
        await self._producer.wait_room(size_of(rec))
        for attempt in (1, 2):
            count = self._topics.cached(topic) or await self._topics.partitions(topic)
            if partition is None:
                p = self._topics.choose(topic, count, key_of(rec))
            else:
                p = await self._topics.check_partition(topic, partition, count)
            chunk = self._producer.enqueue(partition_stream(topic, p), one(rec), True, offsets=True)
            try:
                return p, await chunk.fut
            except NotFoundError:  # UNKNOWN_PARTITION included: nothing was written
                self._topics.forget(topic)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def send_many(
        self, topic: str, records: Sequence[RecordLike], partition: int | None = None
    ) -> list[tuple[int, int]]:
        """Send records (keys and headers inside WireRecords or LogRecords) to
        ``topic``; each one's ``(partition, offset)`` once all are durable."""
        recs = as_records(records)
        sizes = sizes_of(recs)
        check_sizes(sizes, self.config.record_bytes_max)
        await self._producer.wait_room(sum(sizes))
        out: list[tuple[int, int] | None] = [None] * len(recs)
        todo = list(range(len(recs)))
        for attempt in (1, 2):
            count = self._topics.cached(topic) or await self._topics.partitions(topic)
            if partition is not None:
                groups = {await self._topics.check_partition(topic, partition, count): todo}
            else:
                groups = self._topics.group(topic, count, recs, todo)
            chunks = []
            for p, idx in groups.items():
                stream = partition_stream(topic, p)
                size = sum([sizes[i] for i in idx])
                chunk = self._producer.enqueue(
                    stream, _pick(recs, idx), False, offsets=True, size=size
                )
                chunks.append((p, idx, chunk))
            await asyncio.wait([c.fut for _p, _i, c in chunks])
            todo, missing = [], None
            errors = [c.fut.exception() for _p, _i, c in chunks]  # every one retrieved
            for (p, idx, chunk), error in zip(chunks, errors, strict=True):
                if isinstance(error, NotFoundError) and attempt == 1:
                    todo.extend(idx)  # not written: route again with fresh metadata
                    missing = error
                elif error is not None:
                    raise error
                else:
                    for i, offset in zip(idx, chunk.fut.result(), strict=True):
                        out[i] = (p, offset)
            if missing is None:
                return out  # type: ignore[return-value]
            self._topics.forget(topic)
            todo.sort()
        raise AssertionError("unreachable")

    async def partitions_for(self, topic: str, *, refresh: bool = False) -> int:
        """The topic's partition count (cached for ``topic_metadata_max_age_ms``)."""
        return await self._topics.partitions(topic, refresh=refresh)

    # -- topics: management ---------------------------------------------------------------

    async def create_topic(
        self, name: str, partitions: int, options: TopicOptions | None = None
    ) -> TopicRecord:
        """Create a topic (``TopicAdmin.create_topic`` over HTTP); its record.
        Quorums not given are the write proxy's defaults."""
        obj = await self._topics.create(name, partitions, options or TopicOptions())
        return topic_wire.parse_topic_record(obj)

    async def list_topics(self) -> list[str]:
        obj = await self.transport.call("GET", f"{wire.API_PREFIX}/topics", None)
        return list(obj.get("topics", []))

    async def get_topic(self, name: str) -> TopicRecord:
        """The topic's record: partition count, options, ctime (one ZooKeeper read at
        the proxy). Its ``namespace`` is "" (the proxies' is not named over HTTP)."""
        obj = await self.transport.call("GET", topic_path(name), None)
        return topic_wire.parse_topic_record(obj)

    async def describe_topic(self, name: str) -> TopicInfo:
        """The topic with every partition's start and end offsets, size, segments and
        owning write proxy."""
        record, obj = await asyncio.gather(
            self.get_topic(name),
            self.transport.call("GET", topic_path(name, "/partitions"), None),
        )
        parts = [topic_wire.parse_partition_view(p) for p in obj.get("partitions", [])]
        return TopicInfo(record.topic, parts, record.options, record.ctime_ms)

    async def alter_partitions(self, name: str, partitions: int) -> TopicRecord:
        """Grow the topic to ``partitions`` (BAD_REQUEST to shrink); its record."""
        return topic_wire.parse_topic_record(await self._topics.alter(name, partitions))

    async def delete_topic(self, name: str) -> None:
        await self._topics.delete(name)

    # -- stream management ---------------------------------------------------------------

    async def create_stream(self, name: str) -> None:
        body = wire.encode_body({"name": name}, wire.MSGPACK)
        await self._transport.call("POST", f"{wire.API_PREFIX}/streams", body)

    async def list_streams(self) -> list[str]:
        obj = await self._transport.call("GET", f"{wire.API_PREFIX}/streams", None)
        return list(obj.get("streams", []))

    async def stream_info(self, name: str) -> StreamInfo:
        """The stream's segments and counters (``Namespace.stream_info`` over HTTP)."""
        return info_from_view(await self.transport.call("GET", stream_path(name), None))

    async def delete_stream(self, name: str) -> None:
        await self._transport.call("DELETE", stream_path(name), None, stream=name)
        self._proxies.forget_owner(name)

    async def truncate(self, name: str, dlsn: DLSN) -> None:
        body = wire.encode_body({"dlsn": str(dlsn)}, wire.MSGPACK)
        await self._transport.call("POST", stream_path(name, "/truncate"), body, stream=name)

    async def release(self, name: str) -> None:
        await self._transport.call("POST", stream_path(name, "/release"), None, stream=name)
        self._proxies.forget_owner(name)

    async def heartbeat(self, name: str) -> dict[str, Any]:
        return await self._transport.call(
            "POST", stream_path(name, "/heartbeat"), None, stream=name
        )

    async def owner(self, name: str) -> str | None:
        obj = await self._transport.call("GET", stream_path(name, "/owner"), None)
        owner = obj.get("owner")
        return owner if isinstance(owner, str) else None

    # -- reads ------------------------------------------------------------------------

    async def read(
        self, stream: str, start: Start = "earliest", limit: int = 100, wait_ms: int = 0
    ) -> ReadPage:
        """A page of records from ``start`` (a StartPosition or DLSN, as the core
        library's readers take, or text: earliest, latest, ``s:e:s``, ``seq:N``,
        ``txid:N``, ``time:MS``); ``wait_ms`` long-polls for the first record."""
        return await reads.read_page(self._transport, stream, position_text(start), limit, wait_ms)

    def catch_up(
        self, stream: str, start: Start = "earliest", wait_ms: int = 0
    ) -> AsyncGenerator[list[ReadRecord], None]:
        """Batches of records from ``start``, read as record sets the read proxy hands
        through as stored (the fast way to read a stream's history: no per-record work
        in the proxy, the core's decoder here). Ends with the stream; ``wait_ms`` > 0
        long-polls at the written end (empty batches meanwhile)."""
        return reads.catch_up(self._transport, stream, position_text(start), wait_ms)

    def tail(self, stream: str, start: Start = "latest") -> AsyncGenerator[ReadRecord, None]:
        """Every record from ``start`` on, following the stream (WebSocket), across
        read proxy failures (it resumes where it stopped)."""
        return reads.tail(self._transport, stream, position_text(start))

    # -- topic partitions by offset and core subscriptions (read proxy) ----------------

    async def read_partition(
        self, topic: str, partition: int, offset: int, limit: int = 500, wait_ms: int = 0
    ) -> reads.PartitionPage:
        """Records of a topic partition from ``offset`` (rows ``(offset, ts, key,
        value, headers, ts_type)``); OUT_OF_RANGE past the end or truncated. Consumer groups:
        ``groups.consumer.GroupConsumer``."""
        return await reads.read_partition(
            self._transport, topic, partition, offset, limit=limit, wait_ms=wait_ms
        )

    async def partition_offset(self, topic: str, partition: int, at: str = "latest") -> int:
        """``earliest`` (first offset kept), ``latest`` (end offset) or ``time:MS``."""
        return await reads.partition_offset(self._transport, topic, partition, at)

    async def committed(self, stream: str, subscriber: str) -> DLSN | None:
        """A core subscription's position (``Namespace.committed`` over HTTP)."""
        return await reads.read_subscription(self._transport, stream, subscriber)

    async def commit(self, stream: str, subscriber: str, dlsn: DLSN) -> bool:
        """Advance a core subscription (``Namespace.commit`` over HTTP)."""
        return await reads.commit_subscription(self._transport, stream, subscriber, dlsn)

    async def list_subscribers(self, stream: str) -> list[str]:
        return await reads.list_subscribers(self._transport, stream)


def _pick(records: Records, idx: list[int]) -> Records:
    return cast("Records", [records[i] for i in idx])
