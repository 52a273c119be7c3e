"""Topic administration on the core library (:class:`TopicAdmin`).

A topic is N partition streams ``t~0 .. t~N-1`` (:func:`foundation.names.partition_stream`)
plus its record in ZooKeeper (:mod:`metadata.topics`); a partition's offsets are its
stream's sequence ids (0, 1, 2, ... across segments), so a partition's *end offset* is
the stream's next sequence id and its *start offset* the first one still readable.

::

    admin = TopicAdmin(ns)
    await admin.create_topic("orders", 6, configs={"retention.ms": 7 * 86_400_000})
    await admin.alter_partitions("orders", 12)        # grow only
    await admin.alter_configs("orders", {"cleanup.policy": "compact"}, delete=["retention.ms"])
    configs = await admin.describe_configs("orders")  # every config, value and source
    info = await admin.describe_topic("orders")       # TopicInfo: partitions, offsets
    ends = await admin.end_offsets("orders")          # [next offset of p0, p1, ...]
    await admin.delete_topic("orders")

Configs are Kafka's (:mod:`metadata.topic_configs`: the table, checks and what each
does); ``TopicOptions`` are older aliases of some of them. The write proxy's topic routes
and ``bookline topic`` are built on this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from foundation.errors import NotFoundError
from foundation.gather import gather_bounded
from foundation.names import parse_internal, partition_stream, validate_name
from metadata.streams import StreamOptions
from metadata.topic_configs import (
    EffectiveConfig,
    NamespaceDefaults,
    check_configs,
    effective,
    merge_configs,
    stream_options,
)
from metadata.topics import TopicRecord, check_partitions
from streams.namespace import Namespace
from streams.vocabulary import PartitionInfo, TopicInfo, TopicOptions

log = logging.getLogger(__name__)

__all__ = ["PartitionInfo", "TopicAdmin", "TopicInfo", "TopicOptions"]

# Partitions described (bookie reads of their LAC) at once.
DESCRIBE_CONCURRENCY: Final = 16


class TopicAdmin:
    """Topics of one :class:`~streams.namespace.Namespace` (uses its ZooKeeper session)."""

    def __init__(self, ns: Namespace) -> None:
        self._ns = ns
        self._topics = ns.context.md.topics

    async def create_topic(
        self,
        name: str,
        partitions: int,
        options: TopicOptions | None = None,
        *,
        configs: Mapping[str, object] | None = None,
    ) -> TopicRecord:
        """Create a topic of ``partitions`` partition streams with ``configs`` (Kafka's
        names; ``options`` are aliases of some, a config given both ways is the
        config's). Quorums not given are the namespace config's when any is given
        (stored with the topic, so they hold for its life). BAD_REQUEST for a bad
        count, UNKNOWN_CONFIG / INVALID_CONFIG, INVALID_NAME, ALREADY_EXISTS (a topic
        or a stream of that name)."""
        validate_name(name, "topic")
        check_partitions(partitions)
        given = check_configs({**(options or TopicOptions()).configs(), **(configs or {})})
        ns = self._ns
        return await self._topics.create_topic(
            ns.name,
            name,
            partitions,
            stream_options(given, self.defaults()),
            ns.context.clock_ms(),
            configs=given,
        )

    def defaults(self) -> NamespaceDefaults:
        """The config defaults that are the namespace's settings (rolls, quorums)."""
        cfg = self._ns.config
        quorums = (cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum)
        return NamespaceDefaults(cfg.segment_rollover_bytes, cfg.segment_rollover_ms, quorums)

    async def alter_configs(
        self,
        name: str,
        configs: Mapping[str, object] | Callable[[Mapping[str, str]], Mapping[str, object]],
        delete: Iterable[str] = (),
    ) -> TopicRecord:
        """Set ``configs`` and return ``delete`` to their defaults (Kafka's
        incremental alter), on the topic's record and every partition stream. The
        partitions' open writers apply the record limit and retention at once, rolls
        and quorums from their next segment, the timestamp type when they next open.
        UNKNOWN_CONFIG / INVALID_CONFIG (nothing changed), NOT_FOUND. Two alters at
        once both apply: each merges into the record it compare-and-sets. ``configs``
        may be a function of the topic's current configs (Kafka's APPEND / SUBTRACT on
        a list), called on the record being compare-and-set."""
        validate_name(name, "topic")
        defaults = self.defaults()
        delete = list(delete)

        def change(record: TopicRecord) -> tuple[dict[str, str], StreamOptions]:
            changes = configs(record.configs) if callable(configs) else configs
            merged = merge_configs(record.configs, changes, delete)
            return merged, stream_options(merged, defaults)

        return await self._topics.alter_configs(self._ns.name, name, change)

    async def describe_configs(self, name: str) -> list[EffectiveConfig]:
        """Every config's value and its source (``"topic"`` or ``"default"``)."""
        return effective((await self.get_topic(name)).configs, self.defaults())

    async def alter_partitions(self, name: str, partitions: int) -> TopicRecord:
        """Grow the topic to ``partitions`` (BAD_REQUEST to shrink or for 0)."""
        validate_name(name, "topic")
        return await self._topics.alter_partitions(self._ns.name, name, partitions)

    async def get_topic(self, name: str) -> TopicRecord:
        """The topic's record (partition count, options); NOT_FOUND if there is none."""
        validate_name(name, "topic")
        record, _version = await self._topics.get_topic(self._ns.name, name)
        return record

    async def partitions(self, name: str) -> int:
        return (await self.get_topic(name)).partitions

    async def list_topics(self) -> list[str]:
        return sorted(await self._topics.list_topics(self._ns.name))

    async def delete_topic(self, name: str) -> None:
        """Delete the topic: its record first (producers then get NOT_FOUND), then its
        partition streams and their ledgers. A delete that stopped halfway leaves
        partition streams without a record; deleting again removes them."""
        validate_name(name, "topic")
        ns = self._ns
        try:
            record = await self._topics.delete_topic(ns.name, name)
            streams = record.partition_names()
        except NotFoundError:
            streams = await self._leftovers(name)
            if not streams:
                raise
            log.info("topic %s/%s: removing %d leftover partitions", ns.name, name, len(streams))
        for stream in streams:
            try:
                await ns.delete_stream(stream)
            except NotFoundError:
                log.debug("partition stream %s already gone", stream)

    async def _leftovers(self, name: str) -> list[str]:
        out = []
        for stream in await self._ns.list_streams():
            parsed = parse_internal(stream)
            if parsed is not None and parsed[0] == "partition" and parsed[1] == name:
                out.append(stream)
        return out

    async def describe_topic(self, name: str) -> TopicInfo:
        """The topic with every partition's start and end offsets and size."""
        record = await self.get_topic(name)

        async def one(p: int) -> PartitionInfo:
            stream = partition_stream(name, p)
            info = await self._ns.stream_info(stream)
            return PartitionInfo(
                partition=p,
                stream=stream,
                start_offset=info.first_sequence_id,
                end_offset=info.next_sequence_id,
                size_bytes=info.size_bytes,
                segments=len(info.segments),
            )

        parts = await gather_bounded(range(record.partitions), one, DESCRIBE_CONCURRENCY)
        configs = tuple(effective(record.configs, self.defaults()))
        return TopicInfo(name, list(parts), record.options, record.ctime_ms, configs)

    async def end_offsets(self, name: str, partitions: int | None = None) -> list[int]:
        """Each partition's end offset (the offset its next record gets), partition 0
        first; ``partitions`` saves reading the record when the caller knows it."""
        count = partitions if partitions is not None else await self.partitions(name)
        return await gather_bounded(
            range(count),
            lambda p: self._ns.end_offset(partition_stream(name, p)),
            DESCRIBE_CONCURRENCY,
        )
