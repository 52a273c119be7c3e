"""Topics: a topic is N partition streams ``<topic>~<p>`` plus its record. Metadata only.

``topics/<ns>/<topic>`` holds a :class:`TopicRecord` (partition count, the configs the
topic sets by Kafka's names (:mod:`metadata.topic_configs`), the partition streams'
options they make, creation time; a record from before configs has none stored: its
options, by their Kafka names, are its configs). Every change is a ZooKeeper transaction that keeps
the record and the partition streams in step, so a reader that sees partition count N
finds streams ``t~0 .. t~N-1``:

* **create**: the record, the partition streams (with the topic's options) and a check
  that no stream of the topic's name exists (its path is created and deleted in the
  same transaction: ZooKeeper has no "absent" check) -- one transaction. Creating a
  stream checks the other way (:meth:`metadata.streams.StreamStore.create_stream`).
* **grow** (:meth:`TopicStore.alter_partitions`): the new partition streams (with the
  topic's options) and a compare-and-set of the record -- one transaction. Partition
  counts never shrink.
* **configs** (:meth:`TopicStore.alter_configs`): a compare-and-set of the record and
  the options of its partition streams -- one transaction per
  :data:`PARTITIONS_PER_TRANSACTION` partitions, the record in the first (a change
  that stopped halfway is finished by making it again).
* **delete**: the record (producers and readers then see NOT_FOUND), then the partition
  streams -- by the caller, who also deletes their ledgers (:mod:`groups.topics`).

A transaction carries at most :data:`PARTITIONS_PER_TRANSACTION` new partitions (five
znodes each; ZooKeeper bounds a request at ``jute.maxbuffer``, 1 MiB). Creating or
growing by more commits in steps, each growing the record by what it adds, so the
record never names a partition that does not exist; a creator that dies halfway leaves
a consistent topic with fewer partitions, which ``alter`` can grow.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from foundation.errors import AlreadyExistsError, BadRequestError, BadVersionError, NotFoundError
from foundation.names import PARTITIONS_MAX, partition_stream, validate_name
from metadata import serde
from metadata.layout import Layout
from metadata.streams import StreamOptions, StreamRecord, StreamStore
from metadata.topic_configs import configs_of_options
from metadata.zk import Transaction, ZkClient

log = logging.getLogger(__name__)

__all__ = ["PARTITIONS_PER_TRANSACTION", "TopicRecord", "TopicStore", "check_partitions"]

TOPIC_KIND: Final = "topic"
FORMAT_VERSION: Final = 1
# New partition streams per ZooKeeper transaction: 5 znodes of < 1 KiB each, far below
# the 1 MiB request bound (jute.maxbuffer) also for long names.
PARTITIONS_PER_TRANSACTION: Final = 200


def check_partitions(partitions: object) -> int:
    """A partition count: an int in 1..PARTITIONS_MAX (BAD_REQUEST otherwise)."""
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise BadRequestError(f"a partition count is an integer, not {partitions!r}")
    if not 1 <= partitions <= PARTITIONS_MAX:
        raise BadRequestError(f"a topic has 1..{PARTITIONS_MAX} partitions; {partitions} asked for")
    return partitions


@dataclass(frozen=True, slots=True)
class TopicRecord:
    namespace: str
    topic: str
    partitions: int
    options: StreamOptions  # every partition stream's (retention, rolls, quorums)
    ctime_ms: int
    # The configs the topic sets (Kafka's names, canonical values); the others are
    # defaults. ``options`` is what they make (metadata.topic_configs.stream_options).
    configs: Mapping[str, str] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        body = {
            "namespace": self.namespace,
            "topic": self.topic,
            "partitions": self.partitions,
            "options": dataclasses.asdict(self.options),
            "ctime_ms": self.ctime_ms,
            "configs": dict(self.configs),
        }
        return serde.encode(TOPIC_KIND, FORMAT_VERSION, body)

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> TopicRecord:
        version, body = serde.decode(data, TOPIC_KIND, FORMAT_VERSION, where)
        raw = serde.field(body, "options", dict, where)
        known = {f.name for f in dataclasses.fields(StreamOptions)}
        partitions = serde.field(body, "partitions", int, where)
        if not 1 <= partitions <= PARTITIONS_MAX:
            raise serde.MetadataFormatError(f"topic at {where}: {partitions} partitions")
        options = StreamOptions(**{k: v for k, v in raw.items() if k in known})
        if "configs" in body:
            configs = serde.field(body, "configs", dict, where)
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
                raise serde.MetadataFormatError(f"topic at {where}: configs are not strings")
        else:
            configs = configs_of_options(options)  # a record from before configs
        return cls(
            namespace=serde.field(body, "namespace", str, where),
            topic=serde.field(body, "topic", str, where),
            partitions=partitions,
            options=options,
            ctime_ms=serde.field(body, "ctime_ms", int, where),
            configs=configs,
            format_version=version,
        )

    def partition_names(self) -> list[str]:
        return [partition_stream(self.topic, p) for p in range(self.partitions)]


class TopicStore:
    """Topics of every namespace (the partition streams' own metadata is
    :class:`~metadata.streams.StreamStore`'s)."""

    def __init__(self, zk: ZkClient, layout: Layout, streams: StreamStore) -> None:
        self._zk = zk
        self._layout = layout
        self._streams = streams

    async def create_topic(
        self,
        ns: str,
        topic: str,
        partitions: int,
        options: StreamOptions | None = None,
        ctime_ms: int = 0,
        *,
        configs: Mapping[str, str] | None = None,
    ) -> TopicRecord:
        """Create the topic and its partition streams. NotFoundError without the
        namespace; AlreadyExistsError if the topic, or a stream of its name, exists.
        ``configs`` (checked) are stored as the topic's; ``options`` are what they make
        (without configs: the options by their Kafka names are the configs)."""
        validate_name(topic, "topic")
        check_partitions(partitions)
        L = self._layout
        if not await self._streams.namespace_exists(ns):
            raise NotFoundError(f"namespace {ns!r} does not exist")
        await self._zk.ensure_path(L.topics(ns))
        opts = options or StreamOptions()
        first = min(partitions, PARTITIONS_PER_TRANSACTION)
        set_configs = dict(configs) if configs is not None else configs_of_options(opts)
        record = TopicRecord(ns, topic, first, opts, ctime_ms, set_configs)
        tx = self._zk.transaction()
        tx.create(L.topic(ns, topic), record.encode())
        # No stream may have the topic's name: create and delete its path here, which
        # fails the whole transaction if it exists.
        tx.create(L.stream(ns, topic)).delete(L.stream(ns, topic))
        self._add_partitions(tx, record, 0, first)
        try:
            await tx.commit()
        except AlreadyExistsError as exc:
            raise await self._why_exists(ns, topic, exc) from exc
        log.info("created topic %s/%s (%d partitions)", ns, topic, first)
        if partitions > first:
            record = await self.alter_partitions(ns, topic, partitions)
        return record

    async def _why_exists(self, ns: str, topic: str, exc: AlreadyExistsError) -> AlreadyExistsError:
        if await self._zk.exists(self._layout.topic(ns, topic)) is not None:
            return AlreadyExistsError(f"topic {ns}/{topic} already exists")
        if await self._streams.stream_exists(ns, topic):
            return AlreadyExistsError(f"{ns}/{topic} is a stream; a topic can't have the same name")
        # A partition stream without a topic: left by a delete that stopped halfway.
        return AlreadyExistsError(
            f"partition streams of an earlier topic {ns}/{topic} are still there "
            f"(delete it again to remove them): {exc.message}"
        )

    def _add_partitions(self, tx: Transaction, record: TopicRecord, start: int, end: int) -> None:
        for p in range(start, end):
            stream = partition_stream(record.topic, p)
            srec = StreamRecord(record.namespace, stream, record.options, record.ctime_ms)
            self._streams.add_create_ops(tx, srec)

    async def get_topic(self, ns: str, topic: str) -> tuple[TopicRecord, int]:
        """``(record, znode version)``; NotFoundError if there is no such topic."""
        path = self._layout.topic(ns, topic)
        try:
            data, version = await self._zk.get(path)
        except NotFoundError as exc:
            raise NotFoundError(f"topic {ns}/{topic} does not exist") from exc
        return TopicRecord.decode(data, path), version

    async def topic_exists(self, ns: str, topic: str) -> bool:
        return await self._zk.exists(self._layout.topic(ns, topic)) is not None

    async def list_topics(self, ns: str) -> list[str]:
        try:
            return await self._zk.get_children(self._layout.topics(ns))
        except NotFoundError:
            return []  # no topic was ever created in this namespace

    async def alter_partitions(self, ns: str, topic: str, partitions: int) -> TopicRecord:
        """Grow the topic to ``partitions`` (BAD_REQUEST to shrink; the same count is a
        no-op). Each step adds partition streams and CASes the record in one
        transaction; a concurrent change makes the step read again and retry."""
        check_partitions(partitions)
        L = self._layout
        while True:
            record, version = await self.get_topic(ns, topic)
            if partitions < record.partitions:
                raise BadRequestError(
                    f"topic {ns}/{topic} has {record.partitions} partitions; a partition "
                    f"count can only grow (asked {partitions})"
                )
            if partitions == record.partitions:
                return record
            end = min(partitions, record.partitions + PARTITIONS_PER_TRANSACTION)
            grown = dataclasses.replace(record, partitions=end)
            tx = self._zk.transaction()
            tx.set(L.topic(ns, topic), grown.encode(), version)
            self._add_partitions(tx, grown, record.partitions, end)
            try:
                await tx.commit()
            except BadVersionError:
                continue  # changed meanwhile (another alter): look again
            log.info("topic %s/%s grew to %d partitions", ns, topic, end)
            if end == partitions:
                return grown

    async def alter_configs(
        self, ns: str, topic: str, configs: Mapping[str, str], options: StreamOptions
    ) -> TopicRecord:
        """Set the topic's configs to ``configs`` (checked; all it sets) and every
        partition stream's options to ``options`` (what they make). The record is
        compare-and-set with the first partitions' streams; a concurrent change makes it
        read again and retry. Writers take the new options when they next open a
        partition stream."""
        L = self._layout
        while True:
            record, version = await self.get_topic(ns, topic)
            altered = dataclasses.replace(record, configs=dict(configs), options=options)
            first = min(record.partitions, PARTITIONS_PER_TRANSACTION)
            tx = self._zk.transaction()
            tx.set(L.topic(ns, topic), altered.encode(), version)
            await self._set_options(tx, altered, 0, first)
            try:
                await tx.commit()
            except BadVersionError:
                continue  # changed meanwhile (another alter): look again
            break
        for start in range(first, record.partitions, PARTITIONS_PER_TRANSACTION):
            tx = self._zk.transaction()
            end = min(record.partitions, start + PARTITIONS_PER_TRANSACTION)
            await self._set_options(tx, altered, start, end)
            await tx.commit()
        log.info("topic %s/%s configs: %s", ns, topic, dict(configs))
        return altered

    async def _set_options(
        self, tx: Transaction, record: TopicRecord, start: int, end: int
    ) -> None:
        ns = record.namespace
        for p in range(start, end):
            stream = partition_stream(record.topic, p)
            current, version = await self._streams.get_stream(ns, stream)
            new = dataclasses.replace(current, options=record.options)
            tx.set(self._layout.stream(ns, stream), new.encode(), version)

    async def delete_topic(self, ns: str, topic: str) -> TopicRecord:
        """Delete the topic's record (its partition streams are the caller's next step);
        returns the record deleted. NotFoundError if there is no such topic."""
        record, version = await self.get_topic(ns, topic)
        await self._zk.delete(self._layout.topic(ns, topic), version)
        log.info("deleted topic %s/%s (%d partitions)", ns, topic, record.partitions)
        return record
