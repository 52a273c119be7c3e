"""asyncio client of the bookie wire protocol (:mod:`bookie.protocol`).

:class:`BookieConnection` is one pipelined TCP connection to one bookie:

* every request gets a request id; responses are matched by id, in any order;
* at most ``inflight_max`` requests are outstanding -- further callers wait for room
  instead of growing a queue;
* every request has a deadline (:class:`~foundation.errors.TimeoutError_`), checked by one
  sweep per connection every ``TIMEOUT_SWEEP_S`` rather than a timer per request;
* adds go through a per-ledger handle, :meth:`BookieConnection.adder` ->
  :class:`LedgerAdder`, binding ledger id, master key, recovery flag and deadline once;
  its ``add(entry_id, lac, payload)`` returns a future without a coroutine or task
  (what the benchmark and a ledger writer with many adds in flight want), its
  ``add_callback`` calls back instead;
* frames queued during one loop iteration go out in one ``transport.write``;
* a broken connection fails everything pending with
  :class:`~foundation.errors.ConnectionLostError` and the next call reconnects;
  ``close()`` fails pending calls and all later ones with
  :class:`~foundation.errors.ClosedError`;
* a non-OK status raises the matching :mod:`foundation.errors` class (``for_code``);
* the connection is TLS when ``ClientOptions.ssl`` or the process's ``[tls]`` says so
  (:mod:`foundation.tls`): the bookie's certificate must chain to the CA and name the
  address dialled, so every user of the pool -- writers, readers, autorecovery, scrub,
  the CLI -- gets it without a parameter of its own.

:class:`BookieClientPool` keeps one connection per bookie address ("host:port", the
bookie id as registered) for the ledger layer. The transport side -- decoding, matching
ids, the deadline sweep, batched writes -- and the options are in client_wire.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from bookie import protocol as p
from bookie.client_wire import (
    CLOSE_WAIT_S,
    AddCallback,
    CallbackWaiter,
    ClientOptions,
    Wire,
    parse_address,
)
from bookie.identity import BookieIdentity
from foundation import tls
from foundation.auth import env_token, token_expiry
from foundation.errors import (
    BooklineError,
    ClosedError,
    ConnectionLostError,
    TimeoutError_,
    UnauthenticatedError,
)

_R = TypeVar("_R")

log = logging.getLogger(__name__)

# A connection re-authenticates this long before its token expires (or after 4/5 of
# what is left, for short-lived tokens), so a bookie never holds it past the expiry.
RENEW_BEFORE_EXPIRY_S = 30.0

# Where a connection without a token of its own finds one when it connects: what
# use_token() installed for this process, else $BOOKLINE_TOKEN (foundation.auth).
TokenSource = Callable[[], str | None]
_process_token: list[TokenSource] = [env_token]


def use_token(token: str | TokenSource | None) -> None:
    """Present ``token`` -- or, for a callable, what it returns at each connect (a
    service signing short-lived tokens) -- on every new bookie connection of this
    process that was given none; None: back to ``$BOOKLINE_TOKEN``. A bookie with auth
    on serves a connection only after it (bookie/access.py)."""
    if token is None:
        _process_token[0] = env_token
    elif isinstance(token, str):
        _process_token[0] = lambda: token
    else:
        _process_token[0] = token


__all__ = [
    "AddCallback",
    "BookieClientPool",
    "BookieConnection",
    "ClientOptions",
    "LedgerAdder",
    "TokenSource",
    "parse_address",
    "use_token",
]


class BookieConnection:
    """One pipelined connection to one bookie. Connects lazily, reconnects on next use
    after a loss. Use from one event loop."""

    def __init__(
        self,
        address: str,
        options: ClientOptions | None = None,
        *,
        token: str | TokenSource | None = None,
        identity: BookieIdentity | None = None,
    ) -> None:
        """``token``: presented in an AUTH request on every connect -- for a callable,
        what it returns then and at each renewal (a service signing its own) -- else
        the process's, see :func:`use_token`. ``identity``: the bookie must prove it
        belongs to the cluster (HELLO, bookie/identity.py) before anything else is
        sent on a connection; None: not checked (no ledger secret to check with)."""
        self.address = address
        self.options = options or ClientOptions()
        self._token = token
        self._identity = identity
        self._host, self._port = parse_address(address)
        self._wire: Wire | None = None
        self._connect_lock = asyncio.Lock()
        # In-flight bound: a counter plus FIFO waiters (asyncio.Semaphore costs more per
        # call, and this is the hot path).
        self._inflight = 0
        self._room_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # add_future calls that took the slow path and have not been sent yet: while
        # any exist, later ones queue behind them so adds leave in call order.
        self._queued_adds = 0
        self._ids = itertools.count(1)
        self._closed = False
        # Optional ops of the bookie (INFO "features"), asked once per connection.
        self._features: frozenset[str] | None = None
        # Re-authenticates before the token presented on this connection expires.
        self._renewal: asyncio.TimerHandle | None = None
        self._renewing: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"BookieConnection({self.address!r})"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def inflight(self) -> int:
        """Requests sent and not yet answered (or waiting for a connection)."""
        return self._inflight

    # -- public API ------------------------------------------------------------------

    def adder(
        self,
        ledger_id: int,
        master_key: bytes,
        *,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> LedgerAdder:
        """A handle for adds to ``ledger_id`` through this connection: the master key,
        the RECOVERY flag and the deadline of each add (default: the options'
        ``request_timeout_s``) are bound once. Cheap to make; a writer keeps one per
        (ledger, bookie). It follows this connection through reconnects and fails like
        it once it is closed."""
        deadline_s = self.options.request_timeout_s if timeout_s is None else timeout_s
        return LedgerAdder(self, ledger_id, master_key, recovery, deadline_s)

    async def add(
        self,
        ledger_id: int,
        entry_id: int,
        lac: int,
        master_key: bytes,
        payload: bytes,
        *,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """One add without keeping a handle: ``await self.adder(...).add(...)`` (a
        writer with many adds keeps the :class:`LedgerAdder` instead)."""
        adder = self.adder(ledger_id, master_key, recovery=recovery, timeout_s=timeout_s)
        await adder.add(entry_id, lac, payload)

    def add_future(
        self,
        ledger_id: int,
        entry_id: int,
        lac: int,
        master_key: bytes,
        payload: bytes,
        *,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> asyncio.Future[None]:
        """One add without keeping a handle: ``self.adder(...).add(...)``."""
        adder = self.adder(ledger_id, master_key, recovery=recovery, timeout_s=timeout_s)
        return adder.add(entry_id, lac, payload)

    def _fast_wire(self) -> Wire | None:
        """The wire when an add can go out at once: connected, writable, a free in-flight
        slot, and no earlier add still waiting (adds leave in call order); else None."""
        wire = self._wire
        if (
            wire is not None
            and not wire.lost
            and wire.writable
            and self._inflight < self.options.inflight_max
            and not self._room_waiters
            and not self._queued_adds
            and not self._closed
        ):
            return wire
        return None

    def _take_slot(self) -> int:
        """Fast path: take an in-flight slot (checked free by _fast_wire) and an id."""
        self._inflight += 1
        return next(self._ids)

    def _queue_add(
        self, encoder: p.AddEncoder, entry_id: int, lac: int, payload: bytes, timeout_s: float
    ) -> asyncio.Task[None]:
        """Slow path: a task that waits for room or the connection, behind earlier adds."""
        self._queued_adds += 1
        return asyncio.ensure_future(self._queued_add(encoder, entry_id, lac, payload, timeout_s))

    async def _queued_add(
        self, encoder: p.AddEncoder, entry_id: int, lac: int, payload: bytes, timeout_s: float
    ) -> None:
        try:
            fut = await self._start(
                lambda rid: encoder.encode(rid, entry_id, lac, payload), p.AddResponse, timeout_s
            )
        finally:
            self._queued_adds -= 1
        await fut

    async def read(
        self,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes = b"",
        timeout_s: float | None = None,
    ) -> p.ReadResponse:
        """Read one entry (``entry_id=-1``: the last one held) with the ledger's
        ``master_key``. With ``fence=True`` the bookie first fences the ledger and the
        response's ``lac`` is its LAC after fencing. Raises NoLedgerError, NoEntryError,
        UnauthorizedError (not the ledger's key), ..."""
        return await self._call(
            lambda rid: p.ReadRequest(rid, ledger_id, entry_id, fence, master_key),
            p.ReadResponse,
            timeout_s,
        )

    async def read_lac(
        self,
        ledger_id: int,
        previous_lac: int,
        timeout_ms: int = 0,
        *,
        timeout_s: float | None = None,
        piggyback_bytes_max: int = 0,
        master_key: bytes = b"",
    ) -> p.ReadLacResponse:
        """Long poll: answers as soon as the bookie's LAC > ``previous_lac`` or after
        ``timeout_ms`` (capped by the bookie) with the current LAC. The entry
        ``previous_lac + 1`` rides along when the bookie holds it; with
        ``piggyback_bytes_max`` (only for bookies whose :meth:`features` include
        ``p.FEATURE_LAC_ENTRIES``) a run of entries after it does too."""
        base = self.options.request_timeout_s if timeout_s is None else timeout_s
        return await self._call(
            lambda rid: p.ReadLacRequest(
                rid, ledger_id, previous_lac, timeout_ms, piggyback_bytes_max, master_key
            ),
            p.ReadLacResponse,
            base + timeout_ms / 1000.0,
        )

    async def write_lac(
        self, ledger_id: int, lac: int, master_key: bytes, *, timeout_s: float | None = None
    ) -> int:
        """Explicit LAC: tell the bookie ``lac`` is confirmed; returns its LAC after.
        Send only to bookies whose :meth:`features` include ``p.FEATURE_WRITE_LAC``."""
        resp = await self._call(
            lambda rid: p.WriteLacRequest(rid, ledger_id, lac, master_key),
            p.WriteLacResponse,
            timeout_s,
        )
        return resp.lac

    async def features(self, *, timeout_s: float | None = None) -> frozenset[str]:
        """Optional ops the bookie serves (from INFO; cached until the connection is
        lost, since the process behind the address may change)."""
        if self._features is None:
            info = await self.info(timeout_s=timeout_s)
            self._features = frozenset(info.features)
        return self._features

    async def info(self, *, timeout_s: float | None = None) -> p.BookieInfo:
        """State, disk usage and id of the bookie."""
        resp = await self._call(p.InfoRequest, p.InfoResponse, timeout_s)
        return resp.info

    async def list_ledgers(self, *, timeout_s: float | None = None) -> tuple[int, ...]:
        """Ids of the ledgers the bookie holds, sorted."""
        resp = await self._call(p.ListLedgersRequest, p.ListLedgersResponse, timeout_s)
        return resp.ledger_ids

    async def list_entries(
        self, ledger_id: int, *, master_key: bytes = b"", timeout_s: float | None = None
    ) -> tuple[int, ...]:
        """Entry ids the bookie holds for ``ledger_id``, sorted (NoLedgerError if none,
        UnauthorizedError if ``master_key`` is not the ledger's)."""
        resp = await self._call(
            lambda rid: p.ListEntriesRequest(rid, ledger_id, master_key),
            p.ListEntriesResponse,
            timeout_s,
        )
        return resp.entry_ids

    async def list_damaged(
        self, from_ledger_id: int = 0, from_entry_id: int = 0, *, timeout_s: float | None = None
    ) -> p.ListDamagedResponse:
        """One page of the ``(ledger_id, entry_id)`` pairs the bookie found damaged, from
        the given pair on; ``next_from`` says where the next page starts (None: done).
        Send only to bookies whose :meth:`features` include ``p.FEATURE_REPLICA_CHECK``."""
        return await self._call(
            lambda rid: p.ListDamagedRequest(rid, from_ledger_id, from_entry_id),
            p.ListDamagedResponse,
            timeout_s,
        )

    async def entry_checksums(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        timeout_s: float | None = None,
    ) -> p.EntryChecksumsResponse:
        """CRC32C and length of the stored blobs of ``first..last`` that read intact, and
        the damaged ids; the answer may stop early (its ``last_entry_id``). NoLedgerError
        when the bookie holds nothing of the ledger. Send only to bookies whose
        :meth:`features` include ``p.FEATURE_REPLICA_CHECK``."""
        return await self._call(
            lambda rid: p.EntryChecksumsRequest(rid, ledger_id, first_entry_id, last_entry_id),
            p.EntryChecksumsResponse,
            timeout_s,
        )

    async def connect(self) -> None:
        """Connect now (otherwise the first request does)."""
        await self._ensure_wire()

    async def close(self) -> None:
        """Close the connection; pending and later calls fail with ClosedError."""
        if self._closed:
            return
        self._closed = True
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None
        if self._renewing is not None:
            self._renewing.cancel()
        waiters, self._room_waiters = self._room_waiters, collections.deque()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(self._closed_error())
        wire, self._wire = self._wire, None
        if wire is not None:
            wire.fail_all(self._closed_error())
            if wire.transport is not None:
                wire.transport.close()
                if not await wire.wait_gone(CLOSE_WAIT_S):
                    wire.transport.abort()  # a peer not reading (paused): drop it now

    # -- internals -------------------------------------------------------------------

    async def _call(
        self, make: Callable[[int], p.Request], expected: type[_R], timeout_s: float | None
    ) -> _R:
        deadline_s = self.options.request_timeout_s if timeout_s is None else timeout_s
        fut = await self._start(lambda rid: p.encode_request(make(rid)), expected, deadline_s)
        return cast(_R, await fut)

    async def _start(
        self, encode: Callable[[int], bytes], expected: type, timeout_s: float
    ) -> asyncio.Future[Any]:
        """Take an in-flight slot (FIFO), make sure of the connection, send. The slot
        goes back when the request leaves the wire's pending map."""
        if self._closed:
            raise self._closed_error()
        await self._acquire_room()
        try:
            wire = self._wire
            if wire is None or wire.lost:
                wire = await self._ensure_wire()
            if not wire.writable:
                await wire.wait_writable()
            if wire.lost or self.closed:
                raise self._gone_error()
            rid = next(self._ids)
            frame = encode(rid)
        except BaseException:
            self._release_room()
            raise
        return wire.send(rid, frame, timeout_s, expected)

    async def _acquire_room(self) -> None:
        """Take one in-flight slot, waiting FIFO when all are taken."""
        if self._inflight < self.options.inflight_max and not self._room_waiters:
            self._inflight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room_waiters.append(fut)
        try:
            await fut  # _release_room took the slot for us before waking us
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release_room()  # handed a slot while being cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):  # close() already cleared it
                    self._room_waiters.remove(fut)
            raise

    def _release_room(self) -> None:
        self._inflight -= 1
        while self._room_waiters:
            fut = self._room_waiters.popleft()
            if not fut.done():
                self._inflight += 1
                fut.set_result(None)
                return

    def _closed_error(self) -> ClosedError:
        return ClosedError(f"connection to bookie {self.address} closed")

    def _gone_error(self) -> BooklineError:
        if self._closed:
            return self._closed_error()
        return ConnectionLostError(f"connection to bookie {self.address} lost")

    async def _ensure_wire(self) -> Wire:
        wire = self._wire
        if wire is not None and not wire.lost:
            return wire
        async with self._connect_lock:
            if self._closed:
                raise self._closed_error()
            wire = self._wire
            if wire is not None and not wire.lost:
                return wire
            loop = asyncio.get_running_loop()
            try:
                _transport, new_wire = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: Wire(self), self._host, self._port, ssl=self._ssl_context()
                    ),
                    self.options.connect_timeout_s,
                )
            except TimeoutError as exc:
                raise TimeoutError_(f"connect to bookie {self.address} timed out") from exc
            except OSError as exc:
                raise ConnectionLostError(
                    f"cannot connect to bookie {self.address}: {exc.strerror or exc}"
                ) from exc
            if self.closed:  # closed while connecting
                if new_wire.transport is not None:
                    new_wire.transport.close()
                raise self._closed_error()
            await self._verify(new_wire)
            await self._authenticate(new_wire)
            self._wire = new_wire
            return new_wire

    async def _verify(self, wire: Wire) -> None:
        """HELLO first, with an identity to check: the bookie proves its credential
        for the address dialled, or the wire is dropped with UnauthenticatedError
        before a token, a key or an entry went out (issue 21)."""
        identity = self._identity
        if identity is None:
            return
        nonce = identity.nonce()
        self._inflight += 1  # released as the answer leaves the wire's pending map
        rid = next(self._ids)
        frame = p.encode_request(p.HelloRequest(rid, nonce))
        try:
            hello = await wire.send(rid, frame, self.options.request_timeout_s, p.HelloResponse)
            if hello.address != self.address or not identity.hello_ok(
                nonce, hello.bookie_id, hello.address, hello.proof
            ):
                raise UnauthenticatedError(
                    f"bookie at {self.address} did not prove it belongs to the cluster"
                )
        except BaseException:
            if wire.transport is not None:
                wire.transport.close()
            raise

    def _current_token(self) -> str | None:
        """What to present now: this connection's token (or its source's), else the
        process's."""
        if callable(self._token):
            return self._token()
        return self._token or _process_token[0]()

    async def _authenticate(self, wire: Wire) -> None:
        """Send AUTH first when there is a token (the bookie answers everything else
        UNAUTHENTICATED until then); its error is the caller's, the wire is dropped."""
        token = self._current_token()
        if not token:
            return
        try:
            await self._send_auth(wire, token)
        except BaseException:
            if wire.transport is not None:
                wire.transport.close()
            raise

    async def _send_auth(self, wire: Wire, token: str) -> None:
        """AUTH with ``token`` on ``wire``, then schedule its renewal: a bookie refuses
        a connection's requests once its token has expired (issue 21)."""
        self._inflight += 1  # released as the answer leaves the wire's pending map
        rid = next(self._ids)
        frame = p.encode_request(p.AuthRequest(rid, token))
        await wire.send(rid, frame, self.options.request_timeout_s, p.AuthResponse)
        expires_at = token_expiry(token)
        if expires_at is None:
            return  # a static token: nothing to renew
        left_s = expires_at - time.time()
        delay_s = max(left_s - RENEW_BEFORE_EXPIRY_S, left_s * 0.8, 0.0)
        if self._renewal is not None:
            self._renewal.cancel()
        self._renewal = asyncio.get_running_loop().call_later(
            delay_s, self._renew, wire, expires_at
        )

    def _renew(self, wire: Wire, expires_at: float) -> None:
        self._renewal = None
        if wire is self._wire and not wire.lost and not self._closed:
            self._renewing = asyncio.ensure_future(self._reauthenticate(wire, expires_at))

    async def _reauthenticate(self, wire: Wire, expires_at: float) -> None:
        """Present a fresher token on the open connection, if the source has one (a
        service signing its own does; a fixed token lapses, and the bookie then refuses
        the connection's requests: the caller sees UNAUTHENTICATED)."""
        token = self._current_token()
        fresh = token_expiry(token) if token else None
        if token is None or fresh is None or fresh <= expires_at:
            log.warning("bookie %s: the token expires and no fresher one is at hand", self.address)
            return
        try:
            await self._send_auth(wire, token)
        except BooklineError as exc:  # the connection is refused or lost: next call reconnects
            log.warning("bookie %s: renewing the token failed: %s", self.address, exc)

    def _ssl_context(self) -> ssl.SSLContext | None:
        return self.options.ssl or tls.client_context()

    def _wire_lost(self, wire: Wire) -> None:
        if self._wire is wire:
            self._wire = None
            self._features = None


class LedgerAdder:
    """Adds to one ledger through one :class:`BookieConnection` (see
    :meth:`BookieConnection.adder`): ledger id, master key, RECOVERY flag and deadline
    are bound once, each add takes ``(entry_id, lac, payload)``.

    Adds from successive calls -- through any of the connection's adders -- are sent in
    call order. When the connection is up, writable and below ``inflight_max`` the
    frame is queued at once (no task, no coroutine); else a task waits for room or the
    connection. The outcome arrives once the bookie has the entry fsynced: None, or
    UnauthorizedError, FencedError (unless ``recovery``), ReadOnlyError,
    TooManyRequestsError, IOFailureError, TimeoutError_, ConnectionLostError, ClosedError.
    """

    __slots__ = ("_conn", "_encoder", "ledger_id", "master_key", "recovery", "timeout_s")

    def __init__(
        self,
        conn: BookieConnection,
        ledger_id: int,
        master_key: bytes,
        recovery: bool,
        timeout_s: float,
    ) -> None:
        self._conn = conn
        self._encoder = p.AddEncoder(ledger_id, master_key, recovery)
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.recovery = recovery
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"LedgerAdder({self._conn.address!r}, ledger {self.ledger_id})"

    def add(self, entry_id: int, lac: int, payload: bytes) -> asyncio.Future[None]:
        """Store one packaged entry: a future that resolves (None) once the bookie has
        it fsynced, or fails with the errors above (``await`` it for the one-shot form).
        ``lac`` is the writer's LastAddConfirmed carried by this entry."""
        conn = self._conn
        wire = conn._fast_wire()
        if wire is None:
            return conn._queue_add(self._encoder, entry_id, lac, payload, self.timeout_s)
        rid = conn._take_slot()
        frame = self._encoder.encode(rid, entry_id, lac, payload)
        return wire.send(rid, frame, self.timeout_s, p.AddResponse)

    def add_callback(
        self, entry_id: int, lac: int, payload: bytes, callback: AddCallback
    ) -> asyncio.Task[None] | None:
        """:meth:`add` calling ``callback(None)`` on success or ``callback(error)``
        instead of resolving a future: called directly from the connection's read or
        timeout path (no future, no loop round trip). Returns the task of the slow path
        (waiting for room or a connection) so the caller can cancel it -- a cancelled
        add never calls back -- else None."""
        conn = self._conn
        wire = conn._fast_wire()
        if wire is not None:
            rid = conn._take_slot()
            frame = self._encoder.encode_parts(rid, entry_id, lac, payload)
            wire.send_to(rid, frame, self.timeout_s, CallbackWaiter(callback))
            return None
        task = conn._queue_add(self._encoder, entry_id, lac, payload, self.timeout_s)

        def done(t: asyncio.Task[None]) -> None:
            if not t.cancelled():
                callback(t.exception())

        task.add_done_callback(done)
        return task


class BookieClientPool:
    """One :class:`BookieConnection` per bookie address, created on first use."""

    def __init__(
        self,
        options: ClientOptions | None = None,
        *,
        token: str | TokenSource | None = None,
        identity: BookieIdentity | None = None,
    ) -> None:
        """``token`` and ``identity``: every connection's (see :class:`BookieConnection`)."""
        self.options = options or ClientOptions()
        self._token = token
        self.identity = identity
        self._conns: dict[str, BookieConnection] = {}
        self._closed = False

    def get(self, address: str) -> BookieConnection:
        """The connection to ``address`` ("host:port"); it connects on first request."""
        if self._closed:
            raise ClosedError("bookie client pool closed")
        conn = self._conns.get(address)
        if conn is None or conn.closed:
            conn = BookieConnection(
                address, self.options, token=self._token, identity=self.identity
            )
            self._conns[address] = conn
        return conn

    async def discard(self, address: str) -> None:
        """Close and forget the connection to ``address`` (e.g. a bookie left)."""
        conn = self._conns.pop(address, None)
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        self._closed = True
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.close()

    async def __aenter__(self) -> BookieClientPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
