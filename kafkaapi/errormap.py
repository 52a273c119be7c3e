"""Bookline's errors as Kafka error codes: what a partition's or topic's answer carries
when the serving core refused or failed. Kafka's clients act on the code (refresh
metadata and retry, reset the offset, give up), so each mapping is chosen for the
action it causes, not for the name alone."""

from __future__ import annotations

from typing import Final

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BooklineError,
    ForbiddenError,
    InvalidConfigError,
    InvalidNameError,
    NotFoundError,
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    OutOfRangeError,
    OwnerMovedError,
    OwnershipLostError,
    ProducerFencedError,
    TooLargeError,
    TooManyRequestsError,
    UnauthenticatedError,
    UnavailableError,
)
from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.errors import KafkaCode, KafkaProtocolError
from serving.write.dedup import UnknownProducerError

__all__ = ["kafka_code"]

_named = kerr.code_named

# First match wins (subclasses before their bases).
_TABLE: Final[tuple[tuple[type[BooklineError], KafkaCode], ...]] = (
    # Another proxy owns the partition (or this one is starting or stopping): the
    # client refreshes its metadata and sends to the leader named there.
    (OwnerMovedError, _named("NOT_LEADER_OR_FOLLOWER")),
    (OwnershipLostError, _named("NOT_LEADER_OR_FOLLOWER")),
    (UnavailableError, _named("NOT_LEADER_OR_FOLLOWER")),
    (NotFoundError, _named("UNKNOWN_TOPIC_OR_PARTITION")),
    (OutOfRangeError, _named("OFFSET_OUT_OF_RANGE")),
    (TooLargeError, _named("MESSAGE_TOO_LARGE")),
    (TooManyRequestsError, _named("THROTTLING_QUOTA_EXCEEDED")),
    # The write may or may not have happened: a retriable timeout ("possibly persisted"
    # to librdkafka), retried with the same sequence and answered with the first
    # write's offsets. Never an error a client reads as "not persisted": it would
    # number the records anew (docs/kafka.md, "Idempotence").
    (OutcomeUnknownError, _named("REQUEST_TIMED_OUT")),
    # The producer is not known here and may have been forgotten: a producer with
    # nothing outstanding starts a new epoch at 0, one with requests unanswered fails.
    (UnknownProducerError, _named("UNKNOWN_PRODUCER_ID")),
    # A sequence gap: the earlier requests were not written (refused, or not yet
    # retried). Not OUT_OF_ORDER_SEQUENCE_NUMBER, on which librdkafka bumps the epoch of
    # every partition and numbers anew records of other partitions that may be stored
    # (duplicates): "not written, resend", which librdkafka retries in order with the
    # same sequences once the earlier requests are resent.
    (OutOfOrderSequenceError, _named("NOT_LEADER_OR_FOLLOWER")),
    (ProducerFencedError, _named("PRODUCER_FENCED")),
    (ForbiddenError, _named("TOPIC_AUTHORIZATION_FAILED")),
    (UnauthenticatedError, _named("SASL_AUTHENTICATION_FAILED")),
    (AlreadyExistsError, _named("TOPIC_ALREADY_EXISTS")),
    (InvalidNameError, _named("INVALID_TOPIC_EXCEPTION")),
    # An unknown topic config name too (UnknownConfigError is one), as Kafka answers.
    (InvalidConfigError, _named("INVALID_CONFIG")),
)
_RETRIABLE: Final = _named("KAFKA_STORAGE_ERROR")  # retriable; clients retry the request
_INVALID: Final = _named("INVALID_REQUEST")


def kafka_code(exc: BooklineError) -> KafkaCode:
    """The Kafka error for ``exc``."""
    if isinstance(exc, KafkaProtocolError):
        return exc.kafka
    for cls, code in _TABLE:
        if isinstance(exc, cls):
            return code
    if exc.retriable:
        return _RETRIABLE
    if isinstance(exc, BadRequestError):
        return _INVALID
    return kerr.code_named("UNKNOWN_SERVER_ERROR")
