"""The transport side of a bookie client connection (sans the API: see client.py).

:class:`Wire` is the ``asyncio.Protocol`` of one connection: it decodes answers with
the sans-I/O :class:`bookie.protocol.Decoder`, matches them to pending requests by
request id, expires requests past their deadline with one periodic sweep (not a timer
per request), and sends the frames queued during one loop iteration in one
``writelines``. A pending request is answered through a future, or -- for an add sent
with a callback -- by calling the callback at once. Also here: the client's options.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass
from ssl import SSLContext
from typing import Any, Final, Protocol, cast

from bookie import protocol as p
from foundation.errors import (
    BadRequestError,
    BooklineError,
    ConnectionLostError,
    TimeoutError_,
)

log = logging.getLogger(__name__)

# Defaults, each bounded for a reason:
# Outstanding requests per connection: enough to keep a bookie's journal group full.
INFLIGHT_MAX_DEFAULT: Final = 1_000
# Deadline of one request (not counting a long poll's own wait).
REQUEST_TIMEOUT_S_DEFAULT: Final = 10.0
# How long to wait for a TCP connect.
CONNECT_TIMEOUT_S_DEFAULT: Final = 5.0
# close() waits this long for the socket to be closed (TLS: the peer's close_notify),
# so a caller closing its event loop next leaves no socket open.
CLOSE_WAIT_S: Final = 1.0


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``; IPv6 hosts may be bracketed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise BadRequestError(f"bookie address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class ClientOptions:
    # Outstanding requests per connection before callers wait for room.
    inflight_max: int = INFLIGHT_MAX_DEFAULT
    # Deadline of one request; a READ_LAC long poll adds its own timeout to it.
    request_timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT
    # TCP connect deadline.
    connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT
    # Largest response body accepted (an entry plus a little meta).
    frame_bytes_max: int = p.FRAME_BYTES_MAX_DEFAULT
    # TLS to the bookies; None: the process's [tls] settings (foundation.tls).
    ssl: SSLContext | None = None

    def __post_init__(self) -> None:
        if self.inflight_max <= 0 or self.request_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("client limits must be positive")


# Deadlines are checked by one periodic sweep per connection rather than a timer per
# request (a TimerHandle per add costs more than the rest of the add path). So a
# request times out up to this much after its deadline.
TIMEOUT_SWEEP_S: Final = 0.01
# The deadline heap keeps answered requests until they pop; rebuild it from the pending
# map when it holds this many more entries than are pending.
_HEAP_SLACK: Final = 1024


AddCallback = Callable[[BaseException | None], None]


class FutureWaiter:
    """A pending request answered through a future: its result is the response -- or
    None for ADD, whose answer carries nothing. ``deadline`` is on the loop clock."""

    __slots__ = ("deadline", "expected", "future")

    def __init__(self, future: asyncio.Future[Any], expected: type) -> None:
        self.future = future
        self.expected = expected
        self.deadline = 0.0  # set by Wire.send_to

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, result: object) -> None:
        self.future.set_result(result)

    def set_exception(self, exc: BaseException) -> None:
        self.future.set_exception(exc)


class CallbackWaiter:
    """A pending ADD answered by calling ``callback`` at once: no future, no loop round
    trip, no context copy, and one object per add (this one, which is also the pending
    map's entry). The callback must not raise (it is logged if it does)."""

    __slots__ = ("_callback", "_done", "deadline")
    expected: Final = p.AddResponse

    def __init__(self, callback: AddCallback) -> None:
        self._callback = callback
        self._done = False
        self.deadline = 0.0  # set by Wire.send_to

    def done(self) -> bool:
        return self._done

    def set_result(self, _result: object) -> None:
        self._fire(None)

    def set_exception(self, exc: BaseException) -> None:
        self._fire(exc)

    def _fire(self, exc: BaseException | None) -> None:
        self._done = True
        try:
            self._callback(exc)
        except Exception:
            log.exception("add callback raised")


# A pending request, keyed by request id in Wire.pending.
Pending = FutureWaiter | CallbackWaiter


class WireOwner(Protocol):
    """What a wire needs from the connection it serves."""

    @property
    def address(self) -> str: ...

    @property
    def options(self) -> ClientOptions: ...

    def _release_room(self) -> None:
        """A request left the pending map: its in-flight slot is free."""

    def _wire_lost(self, wire: Wire) -> None:
        """The transport is gone (after every pending request failed)."""


class Wire(asyncio.Protocol):
    """The transport side of one connection: decode, match ids, batch writes."""

    def __init__(self, owner: WireOwner) -> None:
        self._owner = owner
        self._loop = asyncio.get_running_loop()
        self._decoder = p.Decoder(responses=True, frame_bytes_max=owner.options.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, Pending] = {}
        self._deadlines: list[tuple[float, int]] = []  # heap of (deadline, request id)
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._writable = asyncio.Event()
        self._writable.set()
        self.lost = False
        self._gone = asyncio.Event()  # connection_lost ran: the socket is closed

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        decoder = self._decoder
        try:
            decoder.feed(data)
            while True:
                try:
                    frame = decoder.next_frame_or_add_ack()
                except p.FrameBodyError as exc:
                    self._resolve_error(exc.request_id, exc)
                    continue
                if type(frame) is int:
                    self._resolve_add_ack(frame)
                elif frame is p.NEED_DATA:
                    return
                else:
                    self._resolve(frame)  # type: ignore[arg-type]
        except BooklineError as exc:
            # The bookie sent a stream we cannot frame: this connection is done.
            log.error("bookie %s sent a bad frame: %s; closing", self._owner.address, exc)
            self.fail_all(ConnectionLostError(f"bad frame from {self._owner.address}: {exc}"))
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._gone.set()
        self._writable.set()  # wake writers so they see the loss
        reason = f": {exc}" if exc else ""
        error = ConnectionLostError(f"connection to bookie {self._owner.address} lost{reason}")
        error.__cause__ = exc
        self.fail_all(error)
        self._owner._wire_lost(self)

    async def wait_gone(self, timeout_s: float) -> bool:
        """Until the transport has closed its socket (a TLS close takes a round trip
        after ``close()``); False if that took longer than ``timeout_s``."""
        try:
            await asyncio.wait_for(self._gone.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- requests --------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        return self._writable.is_set()

    async def wait_writable(self) -> None:
        await self._writable.wait()

    def send(
        self, request_id: int, frame: bytes, timeout_s: float, expected: type
    ) -> asyncio.Future[Any]:
        """Queue ``frame``; the future resolves with the response (None for ADD) or the
        error. The caller holds one in-flight slot, released when the request leaves
        :attr:`pending` (answer, timeout or connection loss)."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        self.send_to(request_id, frame, timeout_s, FutureWaiter(fut, expected))
        return fut

    def send_to(
        self,
        request_id: int,
        frame: bytes | tuple[bytes, bytes],
        timeout_s: float,
        waiter: Pending,
    ) -> None:
        """:meth:`send` answering ``waiter`` (a future's or a callback's). ``frame``
        may come in two pieces (``AddEncoder.encode_parts``), written back to back."""
        loop = self._loop
        waiter.deadline = deadline = loop.time() + timeout_s
        self.pending[request_id] = waiter
        heapq.heappush(self._deadlines, (deadline, request_id))
        if self._sweep_handle is None:
            self._sweep_handle = loop.call_later(TIMEOUT_SWEEP_S, self._sweep)
        if isinstance(frame, tuple):
            self._out += frame
        else:
            self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if self.transport is None or self.lost or not out:
            return  # connection_lost already failed the pending calls
        self.transport.writelines(out)

    def _sweep(self) -> None:
        """Expire requests past their deadline; runs while any request is pending."""
        self._sweep_handle = None
        now = self._loop.time()
        heap, pending = self._deadlines, self.pending
        while heap and heap[0][0] <= now:
            _deadline, request_id = heapq.heappop(heap)
            entry = pending.get(request_id)
            if entry is not None:
                self._expire(request_id, entry)
        if len(heap) > len(pending) + _HEAP_SLACK:
            self._deadlines = heap = [(w.deadline, rid) for rid, w in pending.items()]
            heapq.heapify(heap)
        if pending:
            self._sweep_handle = self._loop.call_later(TIMEOUT_SWEEP_S, self._sweep)
        else:
            heap.clear()

    def _expire(self, request_id: int, entry: Pending) -> None:
        self._take(request_id)
        if not entry.done():
            entry.set_exception(
                TimeoutError_(
                    f"bookie {self._owner.address} did not answer request {request_id} in time"
                )
            )

    def _take(self, request_id: int) -> Pending | None:
        entry = self.pending.pop(request_id, None)
        if entry is not None:
            self._owner._release_room()
        return entry

    def _resolve(self, resp: p.Response) -> None:
        entry = self._take(resp.request_id)
        if entry is None:
            log.debug("late or unknown response id %d from %s", resp.request_id, self._owner)
            return
        if entry.done():
            return
        expected = entry.expected
        if type(resp) is expected:
            entry.set_result(None if expected is p.AddResponse else resp)
        elif type(resp) is p.ErrorResponse:
            entry.set_exception(resp.error())
        else:
            entry.set_exception(
                BadRequestError(
                    f"bookie {self._owner.address} answered {type(resp).__name__} to a "
                    f"request expecting {expected.__name__}"
                )
            )

    def _resolve_add_ack(self, request_id: int) -> None:
        """An OK ADD answer (the hot path of :meth:`_resolve`)."""
        entry = self.pending.pop(request_id, None)
        if entry is None:
            log.debug("late or unknown response id %d from %s", request_id, self._owner)
            return
        self._owner._release_room()
        if entry.done():
            return
        expected = entry.expected
        if expected is p.AddResponse:
            entry.set_result(None)
        else:
            entry.set_exception(
                BadRequestError(
                    f"bookie {self._owner.address} answered AddResponse to a request "
                    f"expecting {expected.__name__}"
                )
            )

    def _resolve_error(self, request_id: int, exc: BooklineError) -> None:
        entry = self._take(request_id)
        if entry is None:
            log.warning("malformed response for unknown id %d: %s", request_id, exc)
            return
        if not entry.done():
            entry.set_exception(exc)

    def fail_all(self, error: BooklineError) -> None:
        pending, self.pending = self.pending, {}
        self._deadlines = []
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        for waiter in pending.values():
            self._owner._release_room()
            if not waiter.done():
                waiter.set_exception(error)
