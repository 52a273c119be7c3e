"""One client connection on the bookie server: frames in, answers out.

Frames are decoded by the sans-I/O :class:`bookie.protocol.Decoder`; responses go back
in completion order, matched by request id, and those finished in one loop iteration
leave in one ``writelines``. ADD, the hot path, runs without a task: storage queues the
journal record and an :class:`_AddReply` encodes the response when the group's fsync is
done. A READ_LAC long poll waits without a task too (:class:`_LacPoll`), and WRITE_LAC,
which never waits, is answered at once. Every other request runs as its own task
(server_requests.py).

Limits: at most ``inflight_requests_per_connection_max`` requests (ADDs, reads and polls
alike) run per connection, more are answered TOO_MANY_REQUESTS at once (no queue
grows); a malformed frame whose boundaries are intact is answered BAD_REQUEST, one that
breaks the stream closes this connection only; a client that does not read its
responses stops being read (transport flow control). A connection beyond
``connections_max`` (authenticated ones, with auth on) is closed as soon as it is
accepted or authenticated; with auth on, connections not yet authenticated have a budget
of their own (``unauthenticated_connections_max``, one more closes the oldest) and
``auth_timeout_s`` to authenticate, and a token's expiry ends what it allows on an open
connection (a new AUTH renews it); one whose unfinished frame
would take the bytes all connections hold past ``buffered_bytes_max`` is closed; the
server's idle sweep closes one that stays silent (see :meth:`ServerConnection.idle_for`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol, cast

from bookie import protocol as p
from bookie.access import ConnectionAuth, LedgerGate
from bookie.config import BookieConfig
from bookie.metrics import BookieMetrics
from bookie.server_requests import encode_lac_answer, is_fatal, piggyback_bytes
from bookie.storage.api import Storage
from foundation.auth import Authority
from foundation.errors import (
    BooklineError,
    ForbiddenError,
    InvariantViolation,
    IOFailureError,
    ProtocolVersionError,
    TooManyRequestsError,
    UnauthenticatedError,
)
from foundation.invariants import invariant

log = logging.getLogger(__name__)


class Host(Protocol):
    """What a connection needs from the server that accepted it."""

    config: BookieConfig
    storage: Storage
    metrics: BookieMetrics
    # Shutting down: connections stop reading requests.
    draining: bool
    # Set on a fatal storage error: nothing more is acknowledged.
    failed: asyncio.Event
    # Longest wait of a READ_LAC long poll.
    long_poll_cap_s: float
    # Every open connection (a connection adds and removes itself).
    connections: set[ServerConnection]
    # Those not authenticated yet (auth on), oldest first: a budget of their own.
    unauthenticated: dict[ServerConnection, None]
    # Ledger key checks (bookie/access.py).
    gate: LedgerGate
    # Token checks and grants (auth on), else None.
    authority: Authority | None
    # Bytes of unfinished frames all connections hold (each keeps its share current).
    buffered_bytes: int

    def hello(self, req: p.HelloRequest) -> bytes:
        """The answer to HELLO (bookie/identity.py)."""

    def refuse(self, conn: ServerConnection, reason: str, why: str) -> None:
        """Close ``conn`` for a resource limit: log and count it."""

    def fail(self, exc: BaseException) -> None:
        """Fatal storage error: stop serving."""

    def handle(self, req: p.Request) -> Coroutine[Any, Any, bytes]:
        """Run a request (in a task); its response frame."""

    def write_lac_now(self, req: p.WriteLacRequest) -> bytes:
        """Answer WRITE_LAC at once; its response frame."""


class ServerConnection(asyncio.Protocol):
    """The server side of one client connection."""

    def __init__(self, server: Host) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._decoder = p.Decoder(responses=False, frame_bytes_max=server.config.frame_bytes_max)
        self._inflight_max = server.config.inflight_requests_per_connection_max
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.tasks: dict[asyncio.Task[bytes], p.Request] = {}
        # ADDs on the fast path (no task): handed to storage, not yet answered.
        self.adds_inflight = 0
        self._add_nowait = server.storage.add_entry_nowait
        # READ_LAC long polls waiting without a task (see _LacPoll).
        self.polls: set[_LacPoll] = set()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.closed = False
        # Who is on this connection (AUTH; ready at once with auth off).
        self.auth = ConnectionAuth(server.authority)
        # This connection's share of the server's buffered_bytes.
        self.buffered = 0
        self.last_received = time.monotonic()
        # Closes the connection unless it authenticates in time (auth on).
        self._auth_deadline: asyncio.TimerHandle | None = None
        # Ends what the connection's token allows when it expires.
        self._token_expiry: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.peer = str(transport.get_extra_info("peername"))
        server = self._server
        server.connections.add(self)
        server.metrics.connection_opened()
        if not self.auth.ready:
            self._await_auth()
        elif len(server.connections) > server.config.connections_max:
            server.refuse(self, "connections_max", "too many connections")
            return
        if server.draining:
            self.transport.pause_reading()

    def _await_auth(self) -> None:
        """An unauthenticated connection (auth on): within the budget of its kind, the
        oldest making room, and closed unless it authenticates within auth_timeout_s
        (issue 21: idle sockets held every slot for the idle timeout)."""
        server = self._server
        pending = server.unauthenticated
        pending[self] = None
        if len(pending) > server.config.unauthenticated_connections_max:
            oldest = next(iter(pending))
            del pending[oldest]
            server.refuse(oldest, "unauthenticated_max", "too many unauthenticated connections")
        timeout_s = server.config.auth_timeout_s
        self._auth_deadline = self._loop.call_later(timeout_s, self._auth_timed_out, timeout_s)

    def _auth_timed_out(self, timeout_s: float) -> None:
        self._auth_deadline = None
        if not self.auth.ready:
            self._server.unauthenticated.pop(self, None)
            self._server.refuse(self, "auth_timeout", f"not authenticated within {timeout_s:g} s")

    def _authenticated(self) -> None:
        """AUTH succeeded: the connection counts against connections_max, and its
        token's expiry is scheduled."""
        server = self._server
        if self._auth_deadline is not None:
            self._auth_deadline.cancel()
            self._auth_deadline = None
        if self._token_expiry is not None:
            self._token_expiry.cancel()
            self._token_expiry = None
        if self in server.unauthenticated:  # its first AUTH (not a renewal)
            del server.unauthenticated[self]
            authenticated = len(server.connections) - len(server.unauthenticated)
            if authenticated > server.config.connections_max:
                server.refuse(self, "connections_max", "too many connections")
                return
        expires_at = self.auth.expires_at
        if expires_at is not None:
            delay_s = max(0.0, expires_at - time.time())
            self._token_expiry = self._loop.call_later(delay_s, self._token_expired)

    def _token_expired(self) -> None:
        """Requests from now on are refused UNAUTHENTICATED (and the connection closed)
        unless a new AUTH comes first, within auth_timeout_s."""
        self._token_expiry = None
        self.auth.expire()
        timeout_s = self._server.config.auth_timeout_s
        self._auth_deadline = self._loop.call_later(timeout_s, self._auth_timed_out, timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.connections.discard(self)
        self._server.unauthenticated.pop(self, None)
        for timer in (self._auth_deadline, self._token_expiry):
            if timer is not None:
                timer.cancel()
        self._server.metrics.connection_closed()
        self._server.buffered_bytes -= self.buffered
        self.buffered = 0
        # Nobody will read the answer; long polls would otherwise linger for a minute.
        for poll in list(self.polls):
            poll.cancel()
        for task, req in list(self.tasks.items()):
            if type(req) is p.ReadLacRequest:
                task.cancel()
        if exc is not None:
            log.debug("connection %s lost: %s", self.peer, exc)

    def pause_writing(self) -> None:
        # The client is not reading its responses: stop reading its requests.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self._server.draining:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_received = time.monotonic()
        server = self._server
        if server.buffered_bytes + len(data) > server.config.buffered_bytes_max:
            server.refuse(self, "buffered_bytes", "unfinished frames over buffered_bytes_max")
            return
        try:
            self._decode(data)
        finally:
            held = self._decoder.buffered_bytes
            server.buffered_bytes += held - self.buffered
            self.buffered = held

    def idle_for(self, now: float) -> float:
        """Seconds this connection has been idle as the idle timeout counts: since its
        last byte when it holds an unfinished frame or has nothing in flight, else 0 (a
        client waiting on its answers is not idle)."""
        busy = self.tasks or self.adds_inflight or self.polls
        if busy and not self.buffered:
            return 0.0
        return now - self.last_received

    def _decode(self, data: bytes) -> None:
        decoder = self._decoder
        try:
            decoder.feed(data)
            while True:
                try:
                    req = decoder.next_frame()
                except p.FrameBodyError as exc:
                    self._server.metrics.bad_frame(fatal=False)
                    log.info("bad request from %s: %s", self.peer, exc.message)
                    self.write(p.encode_error(exc.request_id, exc.op, exc))
                    continue
                if req is p.NEED_DATA:
                    return
                self._dispatch(cast(p.Request, req))
        except BooklineError as exc:
            # Frame boundaries are lost: this connection is done, the others are not.
            self._server.metrics.bad_frame(fatal=True)
            log.warning("closing connection %s: %s", self.peer, exc)
            if isinstance(exc, ProtocolVersionError):  # say why, in this side's version
                self.write(p.encode_error(0, p.Op.INFO, exc))
            self.close()

    # -- requests --------------------------------------------------------------------

    def _dispatch(self, req: p.Request) -> None:
        if self._server.failed.is_set() or self.closed:
            return  # fatal storage error, or refused: act on nothing more
        if type(req) is p.HelloRequest:  # before AUTH: the client checks us first
            self.write(self._server.hello(req))
            return
        if not self.auth.ready or type(req) is p.AuthRequest:
            self._authenticate(req)
            return
        if len(self.tasks) + self.adds_inflight + len(self.polls) >= self._inflight_max:
            self._server.metrics.request_rejected()
            error = TooManyRequestsError(
                f"more than {self._inflight_max} requests in flight on this connection"
            )
            self.write(p.encode_error(req.request_id, p.op_of(req), error))
            return
        try:
            self.auth.authorize(req)
        except ForbiddenError as exc:
            self.write(p.encode_error(req.request_id, p.op_of(req), exc))
            return
        if type(req) is p.AddRequest:
            if self._server.gate.admits_now(req.ledger_id, req.master_key):
                self._add_fast(req)
            else:  # first contact: the ledger's metadata is looked up in a task
                self.spawn(req)
            return
        if type(req) is p.ReadLacRequest:
            if self._server.gate.holds_under(req.ledger_id, req.master_key):
                _LacPoll(self, req).start()
            else:  # not held, or another key: the gate's answer is in a task
                self.spawn(req)
            return
        if type(req) is p.WriteLacRequest:  # never waits (storage checks the key)
            self.write(self._server.write_lac_now(req))
            return
        self.spawn(req)

    def _authenticate(self, req: p.Request) -> None:
        """AUTH, or a request before it: answered; a refusal closes the connection."""
        try:
            frame = self.auth.answer(req)
        except UnauthenticatedError as exc:
            log.info("connection %s refused: %s", self.peer, exc.message)
            self.write(p.encode_error(req.request_id, p.op_of(req), exc))
            self.close()
            return
        self.write(frame)
        self._authenticated()

    def spawn(self, req: p.Request) -> None:
        """Handle ``req`` in a task of its own, answering when it ends."""
        task = self._loop.create_task(self._server.handle(req))
        self.tasks[task] = req
        task.add_done_callback(self._task_done)

    def _add_fast(self, req: p.AddRequest) -> None:
        """ADD without a task: storage queues the journal record and tells the reply
        object once the group is fsynced; it encodes the response into the write buffer."""
        reply = _AddReply(self, req)
        self.adds_inflight += 1
        try:
            self._add_nowait(req, reply)
        except BooklineError as exc:  # refused before reaching the journal
            reply.set_exception(exc)
        except Exception as exc:  # a storage bug: answer IO, keep the traceback
            log.exception("storage failed on ADD")
            reply.set_exception(IOFailureError(f"{type(exc).__name__}: {exc}"))

    def _task_done(self, task: asyncio.Task[bytes]) -> None:
        self.tasks.pop(task, None)
        if task.cancelled():
            return  # connection gone or shutting down: no one to answer
        exc = task.exception()
        if exc is not None:  # handle() answers errors itself; this is a bug in it
            log.error("request handler failed on %s", self.peer, exc_info=exc)
            self.close()
            return
        self.write(task.result())

    def write(self, frame: bytes) -> None:
        if self.closed or self._server.failed.is_set():
            return
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if self.closed or self.transport is None or not out:
            return
        # One writev for every response finished in this loop iteration.
        self.transport.writelines(out)

    def close(self) -> None:
        """Flush what is queued, then close."""
        if self.closed:
            return
        self._flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping unsent responses (fatal error)."""
        self.closed = True
        self._out.clear()
        if self.transport is not None:
            self.transport.abort()


class _AddReply:
    """Completion of one fast-path ADD (see :class:`bookie.storage.journal.Completion`):
    answers on the connection and records the request metric, on the loop thread."""

    __slots__ = ("_conn", "_done", "_req", "_started")

    def __init__(self, conn: ServerConnection, req: p.AddRequest) -> None:
        self._conn = conn
        self._req = req
        self._started = time.perf_counter()
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, _result: None, /) -> None:
        self._finish()
        req = self._req
        conn = self._conn
        conn._server.metrics.observe_request("ADD", "OK", time.perf_counter() - self._started)
        conn.write(p.encode_add_response(req.request_id, req.ledger_id, req.entry_id))

    def set_exception(self, exception: BaseException, /) -> None:
        self._finish()
        req = self._req
        server = self._conn._server
        if isinstance(exception, BooklineError):
            error = exception
        else:  # the journal only sets BooklineErrors; anything else is a bug, answer IO
            log.error("ADD failed with a non-Bookline error", exc_info=exception)
            error = IOFailureError(f"{type(exception).__name__}: {exception}")
        server.metrics.observe_request("ADD", error.name, time.perf_counter() - self._started)
        if is_fatal(req, error):
            server.fail(error)
        self._conn.write(p.encode_error(req.request_id, p.Op.ADD, error))

    def _finish(self) -> None:
        invariant(not self._done, "ADD %d answered twice", self._req.request_id)
        self._done = True
        self._conn.adds_inflight -= 1


class _LacPoll:
    """A READ_LAC long poll without a task: storage calls :meth:`set_result` when the
    ledger's LAC moves (see ``Storage.watch_lac``), a timer ends the wait, and the
    answer -- with the entries that follow, from memory -- is encoded into the
    connection's write buffer in that same callback. An entry that must come from disk
    is read by an ordinary task (READ_LAC with no wait). The time spent waiting for the
    LAC to move is counted apart from the time spent answering
    (``bookline_bookie_long_poll_wait_seconds``, not ``..._request_seconds``)."""

    __slots__ = ("_bytes_max", "_conn", "_done", "_req", "_started", "_timer", "_waited_from")

    def __init__(self, conn: ServerConnection, req: p.ReadLacRequest) -> None:
        self._conn = conn
        self._req = req
        self._started = time.perf_counter()
        self._timer: asyncio.TimerHandle | None = None
        self._done = False
        # when the poll started waiting for the LAC to move (None: it has not waited)
        self._waited_from: float | None = None
        self._bytes_max = piggyback_bytes(req, conn._server.config.frame_bytes_max)

    def start(self) -> None:
        req = self._req
        timeout_s = min(req.timeout_ms / 1000.0, self._conn._server.long_poll_cap_s)
        if timeout_s > 0:
            self._timer = self._conn._loop.call_later(timeout_s, self._expire)
        self._conn.polls.add(self)
        self._answer(expired=timeout_s <= 0)

    # Completion, as storage's LAC watchers are told
    def done(self) -> bool:
        return self._done

    def set_result(self, _result: None, /) -> None:
        if not self._done:
            self._answer(expired=False)

    def set_exception(self, exception: BaseException, /) -> None:
        if not self._done:
            self._reply_error(exception)

    def _expire(self) -> None:
        self._timer = None
        if not self._done:
            self._conn._server.storage.unwatch_lac(self._req.ledger_id, self)
            self._answer(expired=True)

    def cancel(self) -> None:
        """The connection is gone: stop waiting, answer nothing."""
        if not self._done:
            self._conn._server.storage.unwatch_lac(self._req.ledger_id, self)
            self._finish()

    def _answer(self, *, expired: bool) -> None:
        req = self._req
        storage = self._conn._server.storage
        try:
            result = storage.lac_answer_nowait(req.ledger_id, req.previous_lac, self._bytes_max)
            if not expired and result is not None and result.lac <= req.previous_lac:
                storage.watch_lac(req.ledger_id, self)  # not past the reader's yet
                if self._waited_from is None:
                    self._waited_from = time.perf_counter()
                return
        except Exception as exc:  # noqa: BLE001 - answered to the client with its code
            self._reply_error(exc)
            return
        if result is None:  # the next entry is on disk: read it in a task
            self._finish()
            self._observe_wait()  # the task's READ_LAC is observed as a request of its own
            self._conn.spawn(dataclasses.replace(req, timeout_ms=0))
            return
        self._finish()
        frame = encode_lac_answer(req, result)
        self._observe("OK")
        self._conn.write(frame)

    def _observe_wait(self) -> float:
        """Observe the wait for the LAC, if any; its seconds."""
        if self._waited_from is None:
            return 0.0
        waited = time.perf_counter() - self._waited_from
        self._conn._server.metrics.observe_long_poll_wait(waited)
        return waited

    def _observe(self, status: str) -> None:
        """The answer's serving time (the wait for the LAC is not serving)."""
        serving = time.perf_counter() - self._started - self._observe_wait()
        self._conn._server.metrics.observe_request("READ_LAC", status, max(0.0, serving))

    def _reply_error(self, exc: BaseException) -> None:
        self._finish()
        if isinstance(exc, BooklineError):
            error = exc
        else:  # a storage bug: answer IO, keep the traceback
            log.error("storage failed on READ_LAC", exc_info=exc)
            error = IOFailureError(f"{type(exc).__name__}: {exc}")
        server = self._conn._server
        self._observe(error.name)
        if isinstance(error, InvariantViolation):
            server.fail(error)
        self._conn.write(p.encode_error(self._req.request_id, p.Op.READ_LAC, error))

    def _finish(self) -> None:
        self._done = True
        self._conn.polls.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
