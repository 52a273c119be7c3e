"""Topic administration as the write core serves it (:class:`TopicHosting`), for
every front end.

Admin runs on the core library's :class:`~groups.topics.TopicAdmin` with the
process's namespace; what it adds is what stream ownership changes: a partition's
owner in its description, owned partitions released before their topic is deleted,
and the check before a partition stream is acquired for a write (NOT_FOUND without the
topic, UNKNOWN_PARTITION for ``p >=`` its partition count: nothing is written, no
stream is created for it). No HTTP: the write proxy's routes (``writeproxy/topics.py``)
parse, check permissions and encode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from foundation.errors import UnknownPartitionError
from foundation.names import partition_stream
from groups.topics import PartitionInfo, TopicAdmin

if TYPE_CHECKING:
    from serving.write.ownership import Ownership
    from streams.namespace import Namespace

__all__ = ["OwnedPartition", "TopicHost", "TopicHosting"]


class TopicHost(Protocol):
    """What topic administration needs of the process serving it."""

    @property
    def ns(self) -> Namespace: ...  # UNAVAILABLE while starting or stopping

    @property
    def ownership(self) -> Ownership: ...


@dataclass(frozen=True, slots=True)
class OwnedPartition:
    info: PartitionInfo
    owner: str | None  # the process owning its stream now; None: nobody


class TopicHosting:
    """The namespace's topics, seen by the process that owns some of their partitions."""

    def __init__(self, host: TopicHost) -> None:
        self._host = host

    def admin(self) -> TopicAdmin:
        return TopicAdmin(self._host.ns)  # UNAVAILABLE while starting or stopping

    async def partitions(self, name: str) -> list[OwnedPartition]:
        """Every partition's offsets and size, and its owner."""
        info = await self.admin().describe_topic(name)
        ownership = self._host.ownership
        return [OwnedPartition(p, await ownership.owner_of(p.stream)) for p in info.partitions]

    async def delete(self, name: str) -> None:
        """The record first (writers of it then get NOT_FOUND), then its partition
        streams. Partitions this process owns are released first; a partition another
        process owns loses its writer lock with the stream, and that process drops it."""
        admin = self.admin()
        ownership = self._host.ownership
        record = await admin.get_topic(name)
        for stream in record.partition_names():
            await ownership.drop(stream)
        await admin.delete_topic(name)

    async def partition_for_write(self, name: str, partition: int) -> str:
        """The stream of ``partition``, checked to exist unless this process owns it."""
        stream = partition_stream(name, partition)
        if stream not in self._host.ownership.owned:
            # About to acquire it: the partition must exist (never auto-created).
            count = await self.admin().partitions(name)  # NOT_FOUND without the topic
            if partition >= count:
                raise UnknownPartitionError(
                    f"topic {name} has {count} partitions; there is no partition {partition}"
                )
        return stream
