"""The one error hierarchy of Bookline, with stable numeric codes.

Every error a user can see derives from :class:`BooklineError`. Each concrete class
carries a numeric ``code`` that is *never reused*: the same code travels in bookie wire
responses, in HTTP error bodies (``{code, name, message}``) and in CLI messages.
Policy lives on the class: ``retriable`` (a retry may succeed as is) and
``refresh_owner`` (re-learn who owns the stream, then retry). The HTTP status of each
code is the HTTP contract's business (:mod:`httpapi.status`).

``fresh(error)`` copies an error for another raise (every field, chained to it).

``for_code(code, message)`` rebuilds the right class from a code received over the wire;
an unknown code becomes :class:`UnknownError` that keeps the code.

Foreign exceptions (OSError, kazoo, rocksdict) are translated at the layer boundary with
``raise SomeError(...) from exc`` so ``__cause__`` says who failed.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

__all__ = [
    "AlreadyExistsError",
    "BadRequestError",
    "BadVersionError",
    "BooklineError",
    "ChecksumError",
    "ClosedError",
    "ConfigError",
    "ConnectionLostError",
    "CookieMismatchError",
    "DiskFullError",
    "EndOfStreamError",
    "FencedError",
    "ForbiddenError",
    "GroupNotEmptyError",
    "IOFailureError",
    "InvalidConfigError",
    "InvalidNameError",
    "InvariantViolation",
    "LedgerClosedError",
    "LockOwnedError",
    "MetadataError",
    "NoEntryError",
    "NoLedgerError",
    "NotAssignedError",
    "NotEnoughBookiesError",
    "NotFoundError",
    "OutOfOrderSequenceError",
    "OutOfRangeError",
    "OutcomeUnknownError",
    "OwnerMovedError",
    "OwnershipLostError",
    "ProducerFencedError",
    "ProtocolVersionError",
    "ReadOnlyError",
    "SessionSuspendedError",
    "StaleGenerationError",
    "TimeoutError_",
    "TooLargeError",
    "TooManyRequestsError",
    "TruncatedError",
    "UnauthenticatedError",
    "UnauthorizedError",
    "UnavailableError",
    "UnknownConfigError",
    "UnknownError",
    "UnknownPartitionError",
    "WriterFailedError",
    "for_code",
    "fresh",
    "registered_codes",
]

_REGISTRY: dict[int, type[BooklineError]] = {}


class BooklineError(Exception):
    """Root of every Bookline error. Subclasses set a unique, stable ``code``."""

    code: ClassVar[int] = 1
    name: ClassVar[str] = "UNKNOWN"
    retriable: ClassVar[bool] = False
    refresh_owner: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.name)
        self.message = message or self.name

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            return  # an intermediate base class, not a wire-visible error
        other = _REGISTRY.get(cls.code)
        if other is not None and other is not cls:
            raise RuntimeError(
                f"error code {cls.code} reused by {cls.__name__} and {other.__name__}"
            )
        _REGISTRY[cls.code] = cls

    def to_dict(self) -> dict[str, object]:
        """The body shape used over HTTP and in CLI JSON output."""
        return {"code": self.code, "name": self.name, "message": self.message}

    def __str__(self) -> str:
        return f"{self.name}({self.code}): {self.message}"


class UnknownError(BooklineError):
    """A code this build does not know (a newer peer); the code is kept."""

    code = 1
    name = "UNKNOWN"

    def __init__(self, message: str = "", *, original_code: int = 1) -> None:
        super().__init__(message)
        self.original_code = original_code

    def to_dict(self) -> dict[str, object]:
        return {"code": self.original_code, "name": self.name, "message": self.message}


class BadRequestError(BooklineError):
    code = 2
    name = "BAD_REQUEST"


class IOFailureError(BooklineError):
    """A storage or local I/O failure on the server side."""

    code = 3
    name = "IO"


class NoLedgerError(BooklineError):
    code = 4
    name = "NO_LEDGER"


class NoEntryError(BooklineError):
    code = 5
    name = "NO_ENTRY"


class UnauthorizedError(BooklineError):
    code = 6
    name = "UNAUTHORIZED"


class FencedError(BooklineError):
    """The ledger was fenced by a recovering reader: this writer is no longer the writer."""

    code = 7
    name = "FENCED"


class ReadOnlyError(BooklineError):
    code = 8
    name = "READ_ONLY"
    retriable = True


class TooManyRequestsError(BooklineError):
    code = 9
    name = "TOO_MANY_REQUESTS"
    retriable = True


class TimeoutError_(BooklineError):
    code = 10
    name = "TIMEOUT"
    retriable = True


class ConnectionLostError(BooklineError):
    """The peer or the network broke the connection (not closed by us)."""

    code = 11
    name = "CONNECTION_LOST"
    retriable = True


class ClosedError(BooklineError):
    """The object was closed by its owner (you closed it)."""

    code = 12
    name = "CLOSED"


class InvalidNameError(BooklineError):
    code = 13
    name = "INVALID_NAME"


class ConfigError(BooklineError):
    code = 14
    name = "CONFIG"


class BadVersionError(BooklineError):
    """A compare-and-set lost: the stored version moved on since it was read."""

    code = 15
    name = "BAD_VERSION"


class AlreadyExistsError(BooklineError):
    code = 16
    name = "ALREADY_EXISTS"


class NotFoundError(BooklineError):
    code = 17
    name = "NOT_FOUND"


class LockOwnedError(BooklineError):
    """Someone else holds the lock; ``owner`` says who (as they registered it)."""

    code = 18
    name = "LOCK_OWNED"
    refresh_owner = True

    def __init__(self, message: str = "", *, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class OwnershipLostError(BooklineError):
    code = 19
    name = "OWNERSHIP_LOST"
    retriable = True
    refresh_owner = True


class SessionSuspendedError(BooklineError):
    """The ZooKeeper connection is suspended: do not act as owner until it is back."""

    code = 20
    name = "SESSION_SUSPENDED"
    retriable = True


class ChecksumError(BooklineError):
    code = 21
    name = "CHECKSUM"


class TooLargeError(BooklineError):
    code = 22
    name = "TOO_LARGE"


class NotEnoughBookiesError(BooklineError):
    code = 23
    name = "NOT_ENOUGH_BOOKIES"
    retriable = True


class LedgerClosedError(BooklineError):
    code = 24
    name = "LEDGER_CLOSED"


class ProtocolVersionError(BooklineError):
    code = 25
    name = "PROTOCOL_VERSION"


class CookieMismatchError(BooklineError):
    code = 26
    name = "COOKIE_MISMATCH"


class DiskFullError(BooklineError):
    code = 27
    name = "DISK_FULL"
    retriable = True


class TruncatedError(BooklineError):
    """The requested position lies in a truncated or retention-deleted range."""

    code = 30
    name = "TRUNCATED"


class EndOfStreamError(BooklineError):
    code = 31
    name = "END_OF_STREAM"


class OwnerMovedError(BooklineError):
    """The stream is owned by another proxy; ``owner`` carries its address."""

    code = 32
    name = "OWNER_MOVED"
    retriable = True
    refresh_owner = True

    def __init__(self, message: str = "", *, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class InvariantViolation(BooklineError):
    """An internal invariant failed: a bug. Fail stop rather than corrupt data."""

    code = 33
    name = "INVARIANT_VIOLATION"


class MetadataError(BooklineError):
    """ZooKeeper failed in a way not covered by a more specific error."""

    code = 34
    name = "METADATA"
    retriable = True


class WriterFailedError(BooklineError):
    """A writer hit an error earlier and refuses further writes (fail fast, never reorder)."""

    code = 35
    name = "WRITER_FAILED"


class OutOfRangeError(BooklineError):
    """A position past the durable end of a stream (a truncation point, an offset):
    refused rather than applied, so nothing written later is ever hidden."""

    code = 40
    name = "OUT_OF_RANGE"


class OutOfOrderSequenceError(BooklineError):
    """A producer's write skipped sequence numbers the proxy has not seen yet (a request
    sent after it has not arrived in time). Retriable: the client resends in order, as a
    Kafka idempotent producer does on OUT_OF_ORDER_SEQUENCE_NUMBER."""

    code = 36
    name = "OUT_OF_ORDER_SEQUENCE"
    retriable = True


class UnavailableError(BooklineError):
    """The server is starting or stopping and did nothing with the request: retry (on
    another server, or this one after a backoff). A proxy that listens before it is
    ready answers this rather than 500, so clients wait instead of failing writes."""

    code = 41
    name = "UNAVAILABLE"
    retriable = True


class OutcomeUnknownError(BooklineError):
    """Records were handed to a writer that failed before answering (or their answer is
    no longer remembered): they may or may not be in the log. Never a definite failure:
    retry with the same producer sequence; the stream's next owner reads the outcome
    back from the log and answers the original positions, or writes what is missing."""

    code = 42
    name = "OUTCOME_UNKNOWN"
    retriable = True
    refresh_owner = True


class ProducerFencedError(BooklineError):
    """A write of a producer epoch older than one the stream already has from that
    producer (a late retry from before the producer bumped its epoch). Nothing of this
    request was written now, nor will any retry of it be: records an earlier attempt
    wrote keep their positions (the retry of a fully written batch is still answered
    with them). A client bumps its epoch only once its older requests are answered, so
    it does not see this for a write it still waits for."""

    code = 43
    name = "PRODUCER_FENCED"


class StaleGenerationError(BooklineError):
    """A consumer group member spoke for a generation the group has left behind (a
    membership change happened), or for a member the group no longer knows (its session
    expired, or a restart of the same static member replaced it). Retriable by joining
    again: a live member learns the new generation and assignment; a replaced one gets a
    new member id. A member paused and replaced can thus never commit over its
    successor."""

    code = 44
    name = "STALE_GENERATION"
    retriable = True


class NotAssignedError(BooklineError):
    """An offset commit for a partition the group does not give this member now."""

    code = 45
    name = "NOT_ASSIGNED"


class GroupNotEmptyError(BooklineError):
    """An operation that needs a group without live members (resetting its offsets,
    deleting it), as Kafka refuses them: the members would overwrite it at once."""

    code = 46
    name = "GROUP_NOT_EMPTY"


class UnknownPartitionError(NotFoundError):
    """A record sent to a partition the topic does not have (an explicit partition >=
    its partition count). Nothing was written. A producer refreshes the topic's
    partition count once before it reports this (the topic may have grown)."""

    code = 47
    name = "UNKNOWN_PARTITION"


class UnauthenticatedError(BooklineError):
    """No credentials, or credentials that do not check out (unknown principal, bad
    signature, expired token, wrong ledger key on a bookie connection). HTTP 401. The
    message never repeats the credential."""

    code = 48
    name = "UNAUTHENTICATED"


class ForbiddenError(BooklineError):
    """An authenticated principal asked for what its grants do not allow (produce,
    consume or admin on a name outside its prefixes). HTTP 403. Nothing was done."""

    code = 49
    name = "FORBIDDEN"


class MethodNotAllowedError(BadRequestError):
    """An HTTP method the path does not serve (HTTP 405, with an ``Allow`` header
    naming those it does). A BAD_REQUEST to code that catches those."""

    code = 50
    name = "METHOD_NOT_ALLOWED"


class UnsupportedMediaTypeError(BadRequestError):
    """A request body in a media type the endpoint does not read (HTTP 415): JSON,
    msgpack, or the record-set type where it is named. A BAD_REQUEST to code that
    catches those."""

    code = 51
    name = "UNSUPPORTED_MEDIA_TYPE"


class InvalidConfigError(BadRequestError):
    """A topic config with a bad value (out of its bounds, not one of its choices, or
    quorums that break ``ensemble >= write >= ack``), as Kafka's INVALID_CONFIG. HTTP
    400; nothing was changed. A BAD_REQUEST to code that catches those."""

    code = 52
    name = "INVALID_CONFIG"


class UnknownConfigError(InvalidConfigError):
    """A topic config name Bookline does not know; the message lists the known ones
    (:mod:`metadata.topic_configs`). HTTP 400; nothing was changed. An INVALID_CONFIG
    to code that catches those."""

    code = 53
    name = "UNKNOWN_CONFIG"


def for_code(code: int, message: str = "") -> BooklineError:
    """Rebuild an error from its wire code; unknown codes keep their number."""
    cls = _REGISTRY.get(code)
    if cls is None:
        return UnknownError(message, original_code=code)
    if cls is UnknownError:
        return UnknownError(message, original_code=code)
    return cls(message)


E = TypeVar("E", bound=BooklineError)


def fresh(error: E, message: str | None = None) -> E:
    """A new instance of ``error``'s class with every field of it (``owner``,
    ``original_code``, ...), its message unless ``message`` is given, caused by
    ``error``: a stored error raised to many callers gives each its own traceback
    instead of sharing (and growing) one object's. The class's ``__init__`` is not run:
    subclasses differ in their keywords, and the fields are copied as they are."""
    err = type(error).__new__(type(error))
    BooklineError.__init__(err, error.message if message is None else message)
    for field, value in vars(error).items():
        if field != "message" and not field.startswith("__"):
            setattr(err, field, value)
    err.__cause__ = error
    return err


def registered_codes() -> dict[int, type[BooklineError]]:
    """A copy of the code registry (for docs, the OpenAPI schema and tests)."""
    return dict(_REGISTRY)
