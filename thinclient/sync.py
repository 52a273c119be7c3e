""":class:`SyncProxyClient`: the thin client's blocking face, a :class:`ProxyClient` on
a private event loop thread (:class:`foundation.loopthread.LoopThread`, the one the
core library's ``SyncNamespace`` uses), for threads without an event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from foundation.auth import env_token
from foundation.cluster_file import read_cluster_file
from foundation.loopthread import LoopThread
from foundation.tls import cluster_ssl
from httpapi.writes import HeadersLike
from metadata.topics import TopicRecord
from streams.dlsn import DLSN
from streams.records import ReadRecord
from streams.vocabulary import StreamInfo, TopicInfo, TopicOptions
from thinclient.proxy_client import ProxyClient, Start
from thinclient.reads import PartitionPage, ReadPage
from thinclient.records import RecordLike

__all__ = ["SyncProxyClient"]


class SyncProxyClient:
    """Blocking facade: the calls of :class:`ProxyClient`, each run on the loop thread.
    Takes ProxyClient's keyword arguments."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = LoopThread(name="bookline-proxy-client")
        try:
            self._client: ProxyClient = self._loop.call(self._make(kwargs))
        except BaseException:
            self._loop.stop()
            raise

    @staticmethod
    async def _make(kwargs: dict[str, Any]) -> ProxyClient:
        return await ProxyClient(**kwargs).start()

    @classmethod
    def from_cluster_file(cls, path: str | Path, **kwargs: Any) -> SyncProxyClient:
        """The proxies a ``cluster.json`` lists (``bookline local``); ConfigError when
        it is missing or malformed (:func:`foundation.cluster_file.read_cluster_file`)."""
        cluster = read_cluster_file(path)
        kwargs.setdefault("ssl", cluster_ssl(cluster.raw))  # its CA (`local --tls`)
        kwargs["token"] = kwargs.get("token") or env_token() or cluster.token()
        return cls(write_urls=cluster.write_urls, read_urls=cluster.read_urls, **kwargs)

    def write(
        self,
        stream: str,
        record: RecordLike,
        key: bytes | str | None = None,
        headers: HeadersLike | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> DLSN:
        return self._loop.call(
            self._client.write(stream, record, key, headers, timestamp_ms=timestamp_ms)
        )

    def write_many(self, stream: str, records: Sequence[RecordLike]) -> list[DLSN]:
        return self._loop.call(self._client.write_many(stream, records))

    def write_async(self, stream: str, record: RecordLike) -> concurrent.futures.Future[DLSN]:
        """Pipelined: a concurrent.futures.Future resolving to the DLSN."""
        return asyncio.run_coroutine_threadsafe(self._client.write(stream, record), self._loop.loop)

    def flush(self) -> None:
        self._loop.call(self._client.flush())

    # -- topics --------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: RecordLike,
        key: bytes | str | None = None,
        headers: HeadersLike | None = None,
        partition: int | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> tuple[int, int]:
        """``(partition, offset)`` once the record is durable."""
        return self._loop.call(
            self._client.send(topic, value, key, headers, partition, timestamp_ms=timestamp_ms)
        )

    def send_async(
        self,
        topic: str,
        value: RecordLike,
        key: bytes | str | None = None,
        headers: HeadersLike | None = None,
        partition: int | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future[tuple[int, int]]:
        """Pipelined: a concurrent.futures.Future of ``(partition, offset)``."""
        send = self._client.send(topic, value, key, headers, partition, timestamp_ms=timestamp_ms)
        return asyncio.run_coroutine_threadsafe(send, self._loop.loop)

    def send_many(
        self, topic: str, records: Sequence[RecordLike], partition: int | None = None
    ) -> list[tuple[int, int]]:
        return self._loop.call(self._client.send_many(topic, records, partition))

    def partitions_for(self, topic: str) -> int:
        return self._loop.call(self._client.partitions_for(topic))

    def create_topic(
        self, name: str, partitions: int, options: TopicOptions | None = None
    ) -> TopicRecord:
        return self._loop.call(self._client.create_topic(name, partitions, options))

    def list_topics(self) -> list[str]:
        return self._loop.call(self._client.list_topics())

    def get_topic(self, name: str) -> TopicRecord:
        return self._loop.call(self._client.get_topic(name))

    def describe_topic(self, name: str) -> TopicInfo:
        return self._loop.call(self._client.describe_topic(name))

    def alter_partitions(self, name: str, partitions: int) -> TopicRecord:
        return self._loop.call(self._client.alter_partitions(name, partitions))

    def delete_topic(self, name: str) -> None:
        self._loop.call(self._client.delete_topic(name))

    def read(
        self, stream: str, start: Start = "earliest", limit: int = 100, wait_ms: int = 0
    ) -> ReadPage:
        return self._loop.call(self._client.read(stream, start, limit, wait_ms))

    def read_partition(
        self, topic: str, partition: int, offset: int, limit: int = 500, wait_ms: int = 0
    ) -> PartitionPage:
        return self._loop.call(
            self._client.read_partition(topic, partition, offset, limit, wait_ms)
        )

    def partition_offset(self, topic: str, partition: int, at: str = "latest") -> int:
        return self._loop.call(self._client.partition_offset(topic, partition, at))

    def committed(self, stream: str, subscriber: str) -> DLSN | None:
        return self._loop.call(self._client.committed(stream, subscriber))

    def commit(self, stream: str, subscriber: str, dlsn: DLSN) -> bool:
        return self._loop.call(self._client.commit(stream, subscriber, dlsn))

    def list_subscribers(self, stream: str) -> list[str]:
        return self._loop.call(self._client.list_subscribers(stream))

    def tail(self, stream: str, start: Start = "latest") -> Iterator[ReadRecord]:
        agen = self._client.tail(stream, start)

        async def step() -> ReadRecord:
            return await agen.__anext__()

        try:
            while True:
                yield self._loop.call(step())
        except StopAsyncIteration:
            return
        finally:
            with contextlib.suppress(RuntimeError):
                self._loop.call(agen.aclose())

    def create_stream(self, name: str) -> None:
        self._loop.call(self._client.create_stream(name))

    def list_streams(self) -> list[str]:
        return self._loop.call(self._client.list_streams())

    def stream_info(self, name: str) -> StreamInfo:
        return self._loop.call(self._client.stream_info(name))

    def delete_stream(self, name: str) -> None:
        self._loop.call(self._client.delete_stream(name))

    def close(self) -> None:
        try:
            self._loop.call(self._client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncProxyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
