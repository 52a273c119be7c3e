"""Error code -> HTTP status: the one table, part of the HTTP contract. Pure.

Every error answer is ``{code, name, message}`` (:mod:`httpapi.wire`) with the status
below. The table is written by class and looked up by code, so a subclass that keeps
its parent's code (``FrameBodyError`` is a BAD_REQUEST) answers its parent's status,
and an error rebuilt from a code (:func:`foundation.errors.for_code`) the same status
as the original. A code missing here answers 500 (a test keeps the table complete).
``docs/openapi.json`` and docs/proxies.md show the statuses the routes answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BadVersionError,
    BooklineError,
    ChecksumError,
    ClosedError,
    ConfigError,
    ConnectionLostError,
    CookieMismatchError,
    DiskFullError,
    EndOfStreamError,
    FencedError,
    ForbiddenError,
    GroupNotEmptyError,
    InvalidConfigError,
    InvalidNameError,
    InvariantViolation,
    IOFailureError,
    LedgerClosedError,
    LockOwnedError,
    MetadataError,
    MethodNotAllowedError,
    NoEntryError,
    NoLedgerError,
    NotAssignedError,
    NotEnoughBookiesError,
    NotFoundError,
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    OutOfRangeError,
    OwnerMovedError,
    OwnershipLostError,
    ProducerFencedError,
    ProtocolVersionError,
    ReadOnlyError,
    SessionSuspendedError,
    StaleGenerationError,
    TimeoutError_,
    TooLargeError,
    TooManyRequestsError,
    TruncatedError,
    UnauthenticatedError,
    UnauthorizedError,
    UnavailableError,
    UnknownConfigError,
    UnknownError,
    UnknownPartitionError,
    UnsupportedMediaTypeError,
    WriterFailedError,
)

__all__ = ["HTTP_STATUS", "STATUS_UNKNOWN", "http_status"]

# Unknown codes and unexpected exceptions: the server's fault.
STATUS_UNKNOWN: Final = 500

HTTP_STATUS: Final[Mapping[type[BooklineError], int]] = {
    # 3xx: go elsewhere (the client follows at once).
    OwnerMovedError: 307,  # the owner's URL in the body's 'owner' and in Location
    # 4xx: refused for the request's own reasons. Whether a retry may succeed is the
    # error class's ``retriable`` (OUT_OF_ORDER_SEQUENCE, STALE_GENERATION and
    # TOO_MANY_REQUESTS are), not the status.
    BadRequestError: 400,
    InvalidNameError: 400,
    ProtocolVersionError: 400,
    OutOfRangeError: 400,
    InvalidConfigError: 400,  # a topic config's bad value
    UnknownConfigError: 400,  # a topic config name not known (the message lists them)
    UnauthorizedError: 403,
    UnauthenticatedError: 401,
    ForbiddenError: 403,
    NoLedgerError: 404,
    NoEntryError: 404,
    NotFoundError: 404,
    UnknownPartitionError: 404,  # a partition >= the topic's count
    FencedError: 409,
    BadVersionError: 409,
    AlreadyExistsError: 409,
    LockOwnedError: 409,
    LedgerClosedError: 409,
    OutOfOrderSequenceError: 409,  # resend in order
    ProducerFencedError: 409,
    StaleGenerationError: 409,  # join the group again first
    NotAssignedError: 409,
    GroupNotEmptyError: 409,
    TruncatedError: 410,
    EndOfStreamError: 410,
    MethodNotAllowedError: 405,  # with Allow
    TooLargeError: 413,
    UnsupportedMediaTypeError: 415,
    TooManyRequestsError: 429,  # with Retry-After
    # 5xx: the server's side (the 503s are retriable, CLOSED excepted).
    UnknownError: 500,
    IOFailureError: 500,
    ConfigError: 500,
    ChecksumError: 500,
    CookieMismatchError: 500,
    InvariantViolation: 500,
    WriterFailedError: 500,
    ReadOnlyError: 503,
    ConnectionLostError: 503,
    ClosedError: 503,
    OwnershipLostError: 503,
    SessionSuspendedError: 503,
    NotEnoughBookiesError: 503,
    MetadataError: 503,
    UnavailableError: 503,
    OutcomeUnknownError: 503,
    TimeoutError_: 504,
    DiskFullError: 507,
}

_BY_CODE: Final[Mapping[int, int]] = {cls.code: status for cls, status in HTTP_STATUS.items()}


def http_status(exc: BooklineError) -> int:
    """The status an error is answered with."""
    return _BY_CODE.get(exc.code, STATUS_UNKNOWN)
