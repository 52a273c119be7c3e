"""The thin client's topics: admin calls to the write proxies, and which partition a
record goes to (:class:`TopicRouter`).

* **Metadata**: a topic's partition count is cached per topic and read again (``GET
  /v1/topics/{t}``, one ZooKeeper read at the proxy) when older than
  ``topic_metadata_max_age_ms``, when a partition turns out not to exist
  (UNKNOWN_PARTITION, NOT_FOUND), or when an explicit partition is beyond the cached
  count -- so a topic's growth is picked up.
* **Partitioning** (:mod:`foundation.partitioner`): a keyed record goes to Kafka's
  ``murmur2(key) mod N``; an unkeyed one to the topic's sticky partition, which moves
  when the client cuts that partition's batch into a request (KIP-480); ``partition=``
  picks one outright (UNKNOWN_PARTITION when the topic does not have it).
* **Writes** to partition ``p`` go to stream ``t~p``'s sender (:mod:`thinclient.producer`:
  producer id, epoch, sequence), so order and idempotence per partition are the
  stream's; the request path is ``/v1/topics/{t}/partitions/{p}/records``.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from foundation.errors import BadRequestError, UnknownPartitionError
from foundation.names import parse_internal, validate_name
from foundation.partitioner import StickyPartitioner, key_hash
from httpapi import topics as topic_wire
from httpapi import wire
from httpapi.writes import WireRecord
from streams.vocabulary import TopicOptions
from thinclient.config import ClientConfig
from thinclient.transport import Transport

__all__ = ["TopicRouter", "records_path", "topic_path"]

# Keys whose hash is remembered (a key's murmur2 costs ~1 us in Python, a lookup ~0.05):
# keyed workloads send the same keys again and again. Forgotten all at once when full.
KEY_HASHES_MAX = 65_536


def topic_path(topic: str, suffix: str = "") -> str:
    return f"{wire.API_PREFIX}/topics/{validate_name(topic, 'topic')}{suffix}"


@functools.lru_cache(maxsize=4096)
def records_path(stream: str) -> str:
    """Where a stream's writes go: a partition stream ``t~p`` through its topic's
    route, any other stream through the stream route."""
    parsed = parse_internal(stream)
    if parsed is not None and parsed[0] == "partition":
        return f"{wire.API_PREFIX}/topics/{parsed[1]}/partitions/{parsed[2]}/records"
    return f"{wire.API_PREFIX}/streams/{stream}/records"


class TopicRouter:
    """Partition counts of the topics a client sends to, and partition choice."""

    def __init__(self, config: ClientConfig, transport: Transport, rng: random.Random) -> None:
        self._config = config
        self._transport = transport
        self._sticky = StickyPartitioner(rng)
        self._counts: dict[str, tuple[int, float]] = {}  # topic -> (partitions, read at)
        self._lookups: dict[str, asyncio.Future[int]] = {}
        self._hashes: dict[bytes, int] = {}  # key -> toPositive(murmur2(key))

    # -- metadata ----------------------------------------------------------------------

    def cached(self, topic: str) -> int | None:
        """The cached partition count while fresh (no I/O), else None."""
        entry = self._counts.get(topic)
        if entry is None:
            return None
        if time.monotonic() - entry[1] >= self._config.topic_metadata_max_age_ms / 1000:
            return None
        return entry[0]

    async def partitions(self, topic: str, *, refresh: bool = False) -> int:
        count = None if refresh else self.cached(topic)
        if count is not None:
            return count
        lookup = self._lookups.get(topic)
        if lookup is None:
            lookup = asyncio.ensure_future(self._read(topic))
            self._lookups[topic] = lookup
            lookup.add_done_callback(functools.partial(self._looked_up, topic))
        return await asyncio.shield(lookup)

    async def _read(self, topic: str) -> int:
        obj = await self._transport.call("GET", topic_path(topic), None)
        _name, count = topic_wire.parse_topic_view(obj)
        return count

    def _looked_up(self, topic: str, fut: asyncio.Future[int]) -> None:
        self._lookups.pop(topic, None)
        if not fut.cancelled() and fut.exception() is None:
            self._counts[topic] = (fut.result(), time.monotonic())
        else:
            self._counts.pop(topic, None)

    def forget(self, topic: str) -> None:
        self._counts.pop(topic, None)

    # -- partitions --------------------------------------------------------------------

    async def check_partition(self, topic: str, partition: object, count: int) -> int:
        """An explicit partition, checked against the count (read again once when it
        is beyond it: the topic may have grown)."""
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise BadRequestError(f"a partition is an int >= 0, not {partition!r}")
        if partition >= count:
            count = await self.partitions(topic, refresh=True)
            if partition >= count:
                raise UnknownPartitionError(
                    f"topic {topic} has {count} partitions; there is no partition {partition}"
                )
        return partition

    def choose(self, topic: str, count: int, key: bytes | None) -> int:
        """Keyed: Kafka's partition for the key; unkeyed: the sticky partition."""
        if key is None:
            return self._sticky.partition(topic, count)
        h = self._hashes.get(key)
        if h is None:
            h = self._remember(key)
        return h % count

    def _remember(self, key: bytes) -> int:
        hashes = self._hashes
        if len(hashes) >= KEY_HASHES_MAX:
            hashes.clear()
        h = hashes[key] = key_hash(key)
        return h

    def group(
        self, topic: str, count: int, records: Sequence[bytes | WireRecord], todo: Iterable[int]
    ) -> dict[int, list[int]]:
        """Records ``todo`` (indexes) by partition, in order within each (one loop, no
        call per record for a key seen before)."""
        hashes = self._hashes
        by: dict[int, list[int]] = {}
        sticky = -1
        for i in todo:
            r = records[i]
            key = None if type(r) is bytes else r.key  # type: ignore[union-attr]
            if key is None:
                if sticky < 0:
                    sticky = self._sticky.partition(topic, count)
                p = sticky
            else:
                h = hashes.get(key)
                p = (self._remember(key) if h is None else h) % count
            members = by.get(p)
            if members is None:
                by[p] = [i]
            else:
                members.append(i)
        return by

    def batch_cut(self, stream: str) -> None:
        """The client cut a request from ``stream``'s queue: when that is the topic's
        sticky partition, unkeyed records move to another one."""
        parsed = parse_internal(stream)
        if parsed is None or parsed[0] != "partition":
            return
        topic, p = parsed[1], parsed[2]
        entry = self._counts.get(topic)
        if entry is not None and self._sticky.partition(topic, entry[0]) == p:
            self._sticky.next_batch(topic, entry[0])

    # -- admin -------------------------------------------------------------------------

    async def create(
        self,
        name: str,
        partitions: int,
        options: TopicOptions,
        configs: Mapping[str, object] | None = None,
    ) -> Any:
        body: dict[str, Any] = {"name": validate_name(name, "topic"), "partitions": partitions}
        body.update(options.given())
        if configs:
            body["configs"] = dict(configs)
        obj = await self._transport.call(
            "POST", f"{wire.API_PREFIX}/topics", wire.encode_body(body, wire.MSGPACK)
        )
        self._counts[name] = (topic_wire.parse_topic_view(obj)[1], time.monotonic())
        return obj

    async def alter(self, name: str, partitions: int) -> Any:
        body = wire.encode_body({"partitions": partitions}, wire.MSGPACK)
        obj = await self._transport.call("PATCH", topic_path(name), body)
        self._counts[name] = (topic_wire.parse_topic_view(obj)[1], time.monotonic())
        return obj

    async def alter_configs(
        self, name: str, configs: Mapping[str, object], delete: Iterable[str] = ()
    ) -> Any:
        changes: dict[str, object] = {**dict.fromkeys(delete), **configs}
        body = wire.encode_body({"configs": changes}, wire.MSGPACK)
        return await self._transport.call("PATCH", topic_path(name, "/configs"), body)

    async def delete(self, name: str) -> None:
        self.forget(name)
        await self._transport.call("DELETE", topic_path(name), None)
