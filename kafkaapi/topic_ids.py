"""Kafka topic ids for Bookline's topics, which have none of their own: a name-based
UUID (version 5) of the namespace and the topic's name, so every proxy answers the same
id for a topic without storing or coordinating anything.

Kafka 4's consumer protocol (KIP-848) names partitions by topic id, and librdkafka
looks the ids up with Metadata v10+; Metadata answers them and resolves topics asked by
id. A topic deleted and created again with the same name gets the same id (Kafka would
give it a new one): Bookline keeps no trace of the old topic a client could confuse
with it, since a deleted topic's partitions and offsets are gone with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Final

__all__ = ["ZERO", "names_by_id", "topic_id"]

# Kafka's "no topic id" (and a null-equivalent in requests).
ZERO: Final = uuid.UUID(int=0)
# The namespace of every Bookline topic id (fixed: changing it changes every id).
_TOPICS: Final = uuid.uuid5(uuid.NAMESPACE_URL, "bookline:kafka-topic-id")


def topic_id(namespace: str, topic: str) -> uuid.UUID:
    """The stable id of ``topic`` in ``namespace``."""
    return uuid.uuid5(_TOPICS, f"{namespace}/{topic}")


def names_by_id(namespace: str, topics: Iterable[str]) -> dict[uuid.UUID, str]:
    """The topics of ``topics`` by their ids."""
    return {topic_id(namespace, t): t for t in topics}
