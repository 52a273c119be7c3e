"""What the Kafka handlers serve from (:class:`KafkaServing`: the hosting proxy's read
and write cores, its namespace and its grants) and one connection's state
(:class:`Session`: who authenticated on it)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, NamedTuple

from foundation.auth import SERVICE_PRINCIPAL, Authority
from foundation.errors import ForbiddenError
from kafkaapi.classic_host import ClassicGroups
from kafkaapi.fetch_ends import PartitionEnds
from metadata.proxies import ProxyInfo

if TYPE_CHECKING:
    from metadata.client import MetadataClient
    from serving.read.pages import Pages
    from serving.write.core import WriteCore
    from serving.write.groups import GroupHosting
    from serving.write.topics import TopicHosting
    from streams.namespace import Namespace

__all__ = ["KafkaServing", "Session", "Subscription"]


# KIP-848 members remembered at most (least recently heard dropped).
_CONSUMERS_MAX: Final = 100_000


class Subscription(NamedTuple):
    """What a KIP-848 member subscribed to: topic names and a regex (None: none)."""

    names: tuple[str, ...] | None = None
    regex: str | None = None


_NO_SUBSCRIPTION: Final = Subscription()


class ConsumerMembers:
    """The (group, member) pairs that joined with ConsumerGroupHeartbeat (KIP-848)
    through this proxy, whose commits carry member epochs (kafkaapi.consumer_groups),
    with the subscription each declared (a heartbeat sends it only when it changed)."""

    def __init__(self) -> None:
        self._members: collections.OrderedDict[tuple[str, str], Subscription] = (
            collections.OrderedDict()
        )

    def add(self, group: str, member: str, subscription: Subscription = _NO_SUBSCRIPTION) -> None:
        self._members[(group, member)] = subscription
        self._members.move_to_end((group, member))
        while len(self._members) > _CONSUMERS_MAX:
            self._members.popitem(last=False)

    def has(self, group: str, member: str) -> bool:
        return (group, member) in self._members

    def subscription(self, group: str, member: str) -> Subscription:
        return self._members.get((group, member), _NO_SUBSCRIPTION)

    def drop(self, group: str, member: str) -> None:
        self._members.pop((group, member), None)


@dataclass(slots=True)
class Session:
    """One connection: its peer, and its principal once SASL authenticated it."""

    peer: str
    mechanism: str | None = None  # chosen by SaslHandshake, used by SaslAuthenticate
    principal: str | None = None
    # When the token it authenticated with expires (unix s; None: never, or auth off).
    expires_at: float | None = None
    # Per (topic, partition): the turn of this connection's last Produce to it, done
    # once its batch is handed to the writer (kafkaapi.produce keeps each partition's
    # batches of pipelined requests in order).
    partition_tails: dict[tuple[str, int], asyncio.Future[None]] = field(default_factory=dict)


@dataclass(slots=True)
class KafkaServing:
    """The hosting proxy's side of the listener. ``ns`` and ``pages`` raise UNAVAILABLE
    while the proxy starts or stops (it owns that lifecycle); ``write`` is None in a
    read proxy (Produce then answers NOT_LEADER_OR_FOLLOWER: leaders are write
    proxies); ``authority`` None means auth is off."""

    registration_id: str
    node_id: int
    ns: Callable[[], Namespace]
    pages: Callable[[], Pages]
    write: WriteCore | None
    authority: Authority | None
    # The write proxy's topic hosting (partition checks, deletes that drop owned
    # partitions); None in a read proxy.
    topics: TopicHosting | None = None
    # The write proxy's group coordinators; None in a read proxy.
    groups: GroupHosting | None = None
    cluster_id: str = "bookline"
    # The Kafka classic groups this proxy coordinates (kafkaapi.membership).
    classic: ClassicGroups = field(default_factory=ClassicGroups)
    # The members of KIP-848's protocol (kafkaapi.consumer_groups).
    consumers: ConsumerMembers = field(default_factory=ConsumerMembers)
    # Fetched partitions' high watermarks and log start offsets (kafkaapi.fetch_ends).
    ends: PartitionEnds = field(default_factory=PartitionEnds)
    # This broker's registration (address, listener); set when the listener is bound.
    me: ProxyInfo | None = None

    @property
    def md(self) -> MetadataClient:
        return self.ns().context.md

    def registration(self) -> ProxyInfo:
        if self.me is None:
            raise RuntimeError("the Kafka listener is not bound yet")
        return self.me

    @property
    def auth_required(self) -> bool:
        return self.authority is not None

    def allowed(self, session: Session, permission: str, kind: str, name: str) -> bool:
        """Whether the connection's principal may ``permission`` on ``name`` (always,
        with auth off). The services' principal may touch no tenant's data."""
        if self.authority is None:
            return True
        principal = session.principal
        if principal is None or principal == SERVICE_PRINCIPAL:
            return False
        return self.authority.grants.allows(principal, permission, kind, name)

    def require(self, session: Session, permission: str, kind: str, name: str) -> None:
        if not self.allowed(session, permission, kind, name):
            raise ForbiddenError(f"{session.principal!r} may not {permission} on {kind} {name!r}")
