"""The consumer protocol's bytes inside Kafka's classic group messages: a member's
subscription (JoinGroup metadata) and its assignment (SyncGroup), which the coordinator
relays without reading them -- read only to show a Kafka group's members in
``bookline group describe``, and written to describe a Bookline group's members to
DescribeGroups. Every version starts ``int16 version, [string topic ...]``."""

from __future__ import annotations

import struct

from groups.assignors import TopicPartition

__all__ = ["decode_assignment", "decode_subscription", "encode_assignment"]


def encode_assignment(parts: frozenset[TopicPartition]) -> bytes:
    """A consumer protocol assignment v0: ``int16 0, [string topic, [int32]], bytes``
    (DescribeGroups shows Bookline members' partitions so)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(parts):
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">hi", 0, len(by_topic)))
    for topic, partitions in by_topic.items():
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name
        out += struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
    out += struct.pack(">i", 0)  # no user data
    return bytes(out)


def decode_assignment(data: bytes) -> list[TopicPartition] | None:
    """The partitions of a consumer protocol assignment (any version: the topic array
    comes first), None when ``data`` is not one (a client's own protocol type)."""
    parts = _topic_arrays(data, with_partitions=True)
    return None if parts is None else [(t, p) for t, ps in parts for p in ps]


def decode_subscription(data: bytes) -> list[str] | None:
    """The topics of a consumer protocol subscription (any version), None when ``data``
    is not one."""
    parts = _topic_arrays(data, with_partitions=False)
    return None if parts is None else [t for t, _ in parts]


def _topic_arrays(data: bytes, *, with_partitions: bool) -> list[tuple[str, list[int]]] | None:
    """``int16 version, [string topic (, [int32 partition])]``, the rest ignored."""
    try:
        pos, out = 6, []
        (count,) = struct.unpack_from(">i", data, 2)
        if count < 0 or count > len(data):
            return None
        for _ in range(count):
            (size,) = struct.unpack_from(">h", data, pos)
            raw = data[pos + 2 : pos + 2 + size]
            if size < 0 or len(raw) != size:
                return None
            name = raw.decode()
            pos += 2 + size
            partitions: list[int] = []
            if with_partitions:
                (n,) = struct.unpack_from(">i", data, pos)
                if n < 0 or n > len(data):
                    return None
                partitions = list(struct.unpack_from(f">{n}i", data, pos + 4))
                pos += 4 + 4 * n
            out.append((name, partitions))
        return out
    except (struct.error, UnicodeDecodeError):
        return None  # not the consumer protocol's layout: the caller shows none
