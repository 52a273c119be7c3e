"""The Kafka listener a write or read proxy hosts: connections, the handler table, and
the rules every request passes before its handler.

One handler per API key, in a table (:data:`HANDLERS`); each decodes nothing itself
(the codec did) and calls the serving core through :class:`~kafkaapi.context.
KafkaServing`. A connection reads frames with a bounded :class:`FrameReader` and
answers its requests in the order they came. Produce requests are *pipelined*: served
while the connection reads the next ones (a producer keeps up to 5 in flight), so one
request's quorum write does not wait behind the one before it -- answered in order all
the same, and a producer's batches to one partition still reach the write core one
after the other (:mod:`kafkaapi.produce`). Any other request waits for the answers
before it and is served alone (it may change the session: SASL). A connection holds at
most ``requests_inflight_max`` requests' frames plus the one being read and one socket
read; every frame is reserved in the listener's buffer budget from its prefix until
its answer is written.

Closed, as Kafka's broker closes them: a connection whose bytes the codec refuses, one
asking an API or version not offered, one that fails SASL, one that sends any request
but ApiVersions and the SASL ones before authenticating when auth is on (ILLEGAL_SASL_
STATE), one still unauthenticated after ``unauthenticated_timeout_s``, and one whose
token expired without re-authenticating. ApiVersions at a version the table does not
know is answered, as Kafka does, with a v0 body carrying UNSUPPORTED_VERSION and the
versions offered, so the client can retry.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from ssl import SSLContext
from typing import Any, Final

from foundation.errors import BooklineError
from foundation.tls import HANDSHAKE_TIMEOUT_S
from kafkaapi import (
    admin,
    configs,
    consumer_groups,
    fetch,
    group_admin,
    groups,
    membership,
    metadata,
    produce,
    sasl,
)
from kafkaapi.context import KafkaServing, Session
from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.apis_admin import (
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
)
from kafkaapi.protocol.apis_cluster import (
    API_VERSIONS,
    DESCRIBE_CLUSTER,
    METADATA,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
)
from kafkaapi.protocol.apis_data import FETCH, INIT_PRODUCER_ID, LIST_OFFSETS, PRODUCE
from kafkaapi.protocol.apis_groups import (
    CONSUMER_GROUP_HEARTBEAT,
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from kafkaapi.protocol.errors import KafkaProtocolError
from kafkaapi.protocol.frames import FRAME_BYTES_MAX, FrameReader, NeedData, frame
from kafkaapi.protocol.messages import (
    Request,
    UnsupportedVersionError,
    decode_request,
    encode_response,
)
from kafkaapi.protocol.schema import Api

__all__ = ["HANDLERS", "KafkaListener", "ListenerLimits"]

log = logging.getLogger(__name__)

# Bytes asked of the socket per read: bounds what one feed adds to the frame buffer.
_READ_BYTES: Final = 64 * 1024
_FRAME_PREFIX_BYTES: Final = 4  # a frame's int32 size
_API_KEY: Final = struct.Struct(">h")  # a request header's first field
_ILLEGAL_SASL: Final = kerr.code_named("ILLEGAL_SASL_STATE")
# A TLS handshake not finished by then closes the connection (foundation.tls's bound).
_HANDSHAKE_S: Final = HANDSHAKE_TIMEOUT_S
# The largest frame of a connection that has not authenticated (with auth on): its
# ApiVersions and SASL requests are small; Kafka's sasl.server.max.receive.size.
STRANGER_FRAME_BYTES_MAX: Final = 512 * 1024

Handler = Callable[[KafkaServing, Session, Request], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True, slots=True)
class Served:
    """One table row: the API, the versions offered (within the codec's advertised
    range: a handler may serve fewer), and its handler."""

    api: Api
    versions: tuple[int, int]
    handler: Handler


async def _api_versions(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    return {"error_code": 0, "api_keys": api_keys(), "throttle_time_ms": 0}


def _row(api: Api, handler: Handler, top: int | None = None, low: int | None = None) -> Served:
    floor, high = api.advertised
    return Served(
        api,
        (
            floor if low is None else max(low, api.versions[0]),
            high if top is None else min(top, high),
        ),
        handler,
    )


HANDLERS: Final[dict[int, Served]] = {
    row.api.key: row
    for row in (
        _row(API_VERSIONS, _api_versions),
        _row(METADATA, metadata.metadata),
        # Floors below the codec's advertised ones where Kafka 4 still serves them:
        # librdkafka up to 2.0 (Debian's kcat) enables record batch v2 only when
        # Produce's range holds v3, and its balanced consumer only with FindCoordinator
        # and JoinGroup v0 in range (it checks ranges overlap, then speaks the highest).
        _row(PRODUCE, produce.produce, low=3),
        _row(INIT_PRODUCER_ID, produce.init_producer_id),
        # v13+ names topics by id; Bookline's topics have none (docs/kafka.md).
        _row(FETCH, fetch.fetch, top=12),
        _row(LIST_OFFSETS, fetch.list_offsets),
        _row(CREATE_TOPICS, admin.create_topics),
        _row(DELETE_TOPICS, admin.delete_topics),
        _row(CREATE_PARTITIONS, admin.create_partitions),
        _row(DESCRIBE_CONFIGS, configs.describe_configs),
        _row(INCREMENTAL_ALTER_CONFIGS, configs.incremental_alter_configs),
        # One key, one group per request (v4+ / v8+ batch them).
        _row(FIND_COORDINATOR, groups.find_coordinator, top=3, low=0),
        _row(OFFSET_COMMIT, groups.offset_commit, top=8),
        _row(OFFSET_FETCH, groups.offset_fetch, top=7),
        _row(JOIN_GROUP, membership.join_group, low=0),
        _row(HEARTBEAT, membership.heartbeat),
        _row(LEAVE_GROUP, membership.leave_group),
        _row(SYNC_GROUP, membership.sync_group),
        _row(DESCRIBE_GROUPS, group_admin.describe_groups),
        _row(LIST_GROUPS, group_admin.list_groups),
        _row(DELETE_GROUPS, group_admin.delete_groups),
        # KIP-848 (v1: librdkafka 2.16 asks for it; v0 has no regex field).
        _row(CONSUMER_GROUP_HEARTBEAT, consumer_groups.consumer_group_heartbeat),
        _row(DESCRIBE_CLUSTER, metadata.describe_cluster),
        _row(SASL_HANDSHAKE, sasl.sasl_handshake),
        _row(SASL_AUTHENTICATE, sasl.sasl_authenticate),
    )
}
# What a connection may ask before it authenticated (with auth on).
_BEFORE_AUTH: Final = frozenset({API_VERSIONS.key, SASL_HANDSHAKE.key, SASL_AUTHENTICATE.key})


def api_keys() -> list[dict[str, int]]:
    return [
        {"api_key": key, "min_version": row.versions[0], "max_version": row.versions[1]}
        for key, row in HANDLERS.items()
    ]


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """A listener's bounds (the hosting proxy's settings)."""

    frame_bytes_max: int = FRAME_BYTES_MAX
    # Request bytes buffered by all connections together: a frame's declared size is
    # reserved before its body is read (Kafka's queued.max.request.bytes), so many
    # connections sending big frames wait instead of growing memory.
    buffered_bytes_max: int = 256 * 1024 * 1024
    connections_max: int = 1024
    # Requests of one connection served at once (pipelined Produce): librdkafka and the
    # Java client keep at most 5 in flight per connection when idempotent.
    requests_inflight_max: int = 5
    unauthenticated_connections_max: int = 256
    unauthenticated_timeout_s: float = 10.0


class KafkaListener:
    """Serves Kafka's protocol over ``serving``; :meth:`start` binds it."""

    def __init__(self, serving: KafkaServing, limits: ListenerLimits | None = None) -> None:
        self.serving = serving
        self.limits = limits or ListenerLimits()
        self._server: asyncio.Server | None = None
        # Open connections, closed by stop() (Python 3.12's wait_closed waits for them).
        self._connections: set[asyncio.StreamWriter] = set()
        self._unauthenticated = 0
        # At least one whole frame fits, or a frame could never be admitted.
        self._budget = _Budget(max(self.limits.buffered_bytes_max, self.limits.frame_bytes_max))

    @property
    def free_bytes(self) -> int:
        """Bytes of the buffer budget not reserved by a connection now."""
        return self._budget.free

    async def start(self, host: str, port: int, ssl: SSLContext | None = None) -> int:
        """Listen (TLS with ``ssl``); returns the bound port (0 picks a free one)."""
        self._server = await asyncio.start_server(
            self._serve, host, port, ssl=ssl, ssl_handshake_timeout=_HANDSHAKE_S if ssl else None
        )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections):
                writer.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(str(writer.get_extra_info("peername")))
        if len(self._connections) >= self.limits.connections_max:
            log.warning("Kafka connection from %s refused: connections_max", session.peer)
            writer.close()
            return
        stranger = self.serving.auth_required
        if stranger and self._unauthenticated >= self.limits.unauthenticated_connections_max:
            log.warning("Kafka connection from %s refused: unauthenticated ones", session.peer)
            writer.close()
            return
        self._unauthenticated += stranger
        self._connections.add(writer)
        try:
            await self._loop(reader, writer, session)
        except KafkaProtocolError as exc:
            log.warning("closing Kafka connection from %s: %s", session.peer, exc)
        except (ConnectionError, TimeoutError) as exc:
            log.info("Kafka connection from %s ended: %r", session.peer, exc)
        except BooklineError as exc:  # e.g. UNAVAILABLE while the proxy starts or stops
            log.info("closing Kafka connection from %s: %s", session.peer, exc)
        except Exception:  # a handler's bug closes its connection, never the proxy
            log.exception("Kafka connection from %s: request failed", session.peer)
        finally:
            if stranger and session.principal is None:
                self._unauthenticated -= 1
            self._connections.discard(writer)
            writer.close()

    async def _loop(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: Session
    ) -> None:
        frames = FrameReader(self.limits.frame_bytes_max)
        share = _Share(self._budget)  # of the listener's budget, for the frame being read
        pipeline = _Pipeline(writer, self._budget, self.limits.requests_inflight_max)
        deadline = time.monotonic() + self.limits.unauthenticated_timeout_s
        was_stranger = self.serving.auth_required
        try:
            while True:
                stranger = self.serving.auth_required and session.principal is None
                if stranger and frames.next_frame_bytes > STRANGER_FRAME_BYTES_MAX:
                    raise KafkaProtocolError(
                        kerr.INVALID_REQUEST, "a frame too big for a connection not authenticated"
                    )
                await share.fit(frames.next_frame_bytes)  # read the rest once it fits
                # The rest of a reserved frame in as few reads as the socket allows (a
                # 1 MB produce took 16 reads, each waiting behind other requests'
                # work); never past the frame, so the buffer stays frame + one read.
                want = max(_READ_BYTES, frames.next_frame_bytes - frames.buffered_bytes)
                if stranger:
                    async with asyncio.timeout_at(_loop_time(deadline)):
                        data = await reader.read(want)
                else:
                    data = await reader.read(want)
                pipeline.check()  # an answer that closes the connection ends the reads
                if not data:
                    await pipeline.drain()
                    return
                frames.feed(data)
                while not isinstance(item := frames.next_frame(), NeedData):
                    size = await share.hand_over(len(item) + _FRAME_PREFIX_BYTES)
                    if _pipelined(item):
                        await pipeline.submit(functools.partial(self._answer, item, session), size)
                        continue
                    await pipeline.drain()  # the answers before it go first
                    await pipeline.submit(functools.partial(self._answer, item, session), size)
                    await pipeline.drain()  # and it is served alone
                    if was_stranger and session.principal is not None:
                        was_stranger = False
                        self._unauthenticated -= 1  # no longer counts against strangers
                    if pipeline.closed:
                        return
                share.shrink(frames.next_frame_bytes)  # the reserved frame was handed over
        except KafkaProtocolError:
            await pipeline.drain()  # the requests before the bad bytes are answered first
            raise
        finally:
            share.shrink(0)
            pipeline.close()

    async def _answer(self, raw: bytes, session: Session) -> tuple[bytes | None, bool]:
        """The answer's bytes (None: acks=0) and whether to close after it."""
        try:
            request = decode_request(raw)
        except UnsupportedVersionError as exc:
            if exc.api_key != API_VERSIONS.key:
                raise
            offer = {"error_code": kerr.UNSUPPORTED_VERSION.code, "api_keys": api_keys()}
            return encode_response(API_VERSIONS, 0, exc.correlation_id, offer), False
        row = HANDLERS.get(request.api.key)
        if row is None or not row.versions[0] <= request.version <= row.versions[1]:
            raise KafkaProtocolError(
                kerr.INVALID_REQUEST, f"{request.api.name} v{request.version} is not served"
            )
        self._check_auth(request, session)
        api = row.api
        try:
            body = await row.handler(self.serving, session, request)
        except sasl.SaslFailedError as exc:
            log.warning("Kafka connection from %s: %s", session.peer, exc)
            return encode_response(api, request.version, request.correlation_id, exc.answer), True
        if body is None:
            return None, False
        return encode_response(api, request.version, request.correlation_id, body), False

    def _check_auth(self, request: Request, session: Session) -> None:
        if not self.serving.auth_required or request.api.key in _BEFORE_AUTH:
            return
        if session.principal is None:
            raise KafkaProtocolError(
                _ILLEGAL_SASL, f"{request.api.name} before SASL authentication"
            )
        if session.expires_at is not None and time.time() >= session.expires_at:
            raise KafkaProtocolError(_ILLEGAL_SASL, "the session's token expired")


class _Budget:
    """Bytes the listener's connections may reserve for frames being read."""

    def __init__(self, bytes_max: int) -> None:
        self.free = bytes_max
        self._freed = asyncio.Event()

    async def take(self, size: int) -> None:
        while self.free < size:
            self._freed.clear()
            await self._freed.wait()
        self.free -= size

    def give(self, size: int) -> None:
        if size:
            self.free += size
            self._freed.set()


class _Share:
    """One connection's reservation of the budget: the frame it is reading."""

    def __init__(self, budget: _Budget) -> None:
        self._budget = budget
        self.held = 0

    async def fit(self, size: int) -> None:
        if size > self.held:
            await self._budget.take(size - self.held)
            self.held = size

    async def hand_over(self, size: int) -> int:
        """Move a whole frame's ``size`` bytes from this reservation to its request
        (taking what a socket read brought in past the reserved frame); the request
        gives them back once answered."""
        if size > self.held:
            await self._budget.take(size - self.held)
            self.held = size
        self.held -= size
        return size

    def shrink(self, size: int) -> None:
        if size < self.held:
            self._budget.give(self.held - size)
            self.held = size


def _pipelined(raw: bytes) -> bool:
    """Whether a request is served while the connection reads on: Produce, which
    changes nothing of the session (any other request is served alone)."""
    return len(raw) >= _API_KEY.size and _API_KEY.unpack_from(raw)[0] == PRODUCE.key


Answer = tuple[bytes | None, bool]


@dataclass(slots=True)
class _Request:
    """One request in flight: its frame's ``size`` in the budget, then its outcome."""

    size: int
    done: bool = False
    answer: bytes | None = None
    close: bool = False
    error: BaseException | None = None


class _Pipeline:
    """A connection's requests in flight, answered in the order they came. Each holds
    its frame's bytes of the listener's budget until its answer is written (or, on a
    closed connection, until it ends: a request handed to the write core is never
    cancelled -- that would fail its stream -- only its answer dropped). A request
    ending schedules one write, in the next loop turn, of the answers of the ended
    requests at the head of the queue: no task to wake through a shield (a Produce's
    answer left two turns after its request ended, each one a wait behind everything
    else a busy loop had to do), one system call for the answers a turn ended, and a
    quorum acknowledgement's LAC push to the bookies leaves before the answers it
    released. The responder task only waits for the socket to drain when its buffer is
    over the high-water mark, and frees the requests' places after (else they are
    freed at once)."""

    def __init__(self, writer: asyncio.StreamWriter, budget: _Budget, inflight_max: int) -> None:
        self._writer = writer
        self._budget = budget
        self._queue: deque[tuple[asyncio.Future[None], _Request]] = deque()
        self._room = asyncio.Semaphore(inflight_max)
        self._unfreed = 0  # requests answered whose places wait for the socket to drain
        self._written = asyncio.Event()  # the responder's cue: drain, then free them
        self._empty = asyncio.Event()
        self._empty.set()
        self._error: BaseException | None = None
        self._shut = False  # close() was called: answers are dropped
        self._flush_due = False  # a _write_ended is scheduled
        self.closed = False  # answered "close", or failed: read no more
        self._responder = asyncio.ensure_future(self._respond())

    async def submit(self, work: Callable[[], Awaitable[Answer]], size: int) -> None:
        """Serve a request (its frame of ``size`` bytes); waits while the connection
        has ``inflight_max`` of them."""
        await self._room.acquire()
        self.check()
        request = _Request(size)
        task = asyncio.ensure_future(self._serve(work, request))
        self._queue.append((task, request))
        self._empty.clear()

    async def drain(self) -> None:
        """Wait until every request submitted is answered; raises what closed it."""
        await self._empty.wait()
        self.check()

    def check(self) -> None:
        """Raise the error that ended the connection's answers, if one did."""
        if self._error is not None:
            raise self._error

    async def _serve(self, work: Callable[[], Awaitable[Answer]], request: _Request) -> None:
        try:
            request.answer, request.close = await work()
        except BaseException as exc:
            request.error = exc
            if not isinstance(exc, Exception):
                raise  # cancelled (the loop stops): the connection is gone anyway
        finally:
            request.done = True
            if not self._flush_due:
                # Once per loop turn: the answers ended in this turn in one write, after
                # what the turn's callbacks queued before (a quorum acknowledgement's
                # LAC push to the bookies, for the readers, leaves first).
                self._flush_due = True
                asyncio.get_running_loop().call_soon(self._write_ended)

    def _write_ended(self) -> None:
        """Write the answers of the ended requests at the head of the queue, in order
        (in one write: one system call for the turn's answers)."""
        self._flush_due = False
        queue, writer = self._queue, self._writer
        frames: list[bytes] = []
        while queue and queue[0][1].done and not self._shut and not self.closed:
            _task, request = queue.popleft()
            self._budget.give(request.size)
            self._unfreed += 1
            if request.error is not None:
                # The connection's end: the reader raises it (a cancelled request only
                # ends it: the loop is stopping).
                if isinstance(request.error, Exception):
                    self._error = request.error
                self.closed = True
                break
            if writer.is_closing():
                self.closed = True  # the peer left while its request waited (a JoinGroup)
                break
            if request.answer is not None:
                frames.append(frame(request.answer))
            self.closed = request.close
        if frames and not writer.is_closing():
            writer.write(b"".join(frames))
        if self.closed:
            writer.close()  # wakes the reader
        if self._unfreed:
            transport = writer.transport
            if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
                self._free()  # drain() would not wait: no task to wake for it
            else:
                self._written.set()
        if not queue or self.closed:
            self._empty.set()

    async def _respond(self) -> None:
        try:
            while True:
                await self._written.wait()
                self._written.clear()
                if not self.closed:
                    await self._writer.drain()
                self._free()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the connection's end: the reader raises it
            self._error, self.closed = exc, True
            self._writer.close()  # wakes the reader
            self._empty.set()

    def _free(self) -> None:
        """The answered requests' places are free for the next requests."""
        while self._unfreed:
            self._unfreed -= 1
            self._room.release()

    def close(self) -> None:
        """The connection ends: requests still in flight end on their own, their
        answers dropped and their bytes given back when they do."""
        self._shut = True
        self._responder.cancel()
        while self._queue:
            task, request = self._queue.popleft()
            task.add_done_callback(functools.partial(_dropped, self._budget, request))


def _dropped(budget: _Budget, request: _Request, _task: asyncio.Future[None]) -> None:
    budget.give(request.size)
    if request.error is not None:
        log.info("Kafka request of a closed connection ended with %r", request.error)


def _loop_time(deadline_monotonic: float) -> float:
    """``deadline_monotonic`` on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline_monotonic - time.monotonic())
