"""The bookie's TCP server: wire protocol in, :class:`~bookie.storage.api.Storage` calls.

One :class:`_Connection` per client: frames are decoded by the sans-I/O
:class:`bookie.protocol.Decoder`; responses go back in completion order, matched by
request id, and those finished in one loop iteration leave in one ``writelines``.
ADD, the hot path, runs without a task: storage queues the journal record and an
:class:`_AddReply` encodes the response when the group's fsync is done. Every other
request runs as its own task.

Limits and failure handling:

* at most ``inflight_requests_per_connection_max`` requests (ADDs included) run per
  connection; more
  are answered TOO_MANY_REQUESTS at once (no queue grows);
* a malformed frame whose boundaries are intact is answered BAD_REQUEST; a frame that
  breaks the stream (bad magic / version / CRC / oversize) closes that connection only;
* a client that does not read its responses stops being read (transport flow control);
* READ_LAC long polls are capped at ``long_poll_timeout_ms_max``;
* an :class:`~foundation.errors.IOFailureError` from a write path (ADD, fence) or an
  :class:`~foundation.errors.InvariantViolation` anywhere is *fatal*: the journal could
  not be made durable, so the bookie stops acknowledging at once, closes every
  connection and reports through :attr:`BookieServer.failed` (main exits non-zero);
* a disk-health loop turns the bookie read-only above ``disk_usage_threshold`` and
  writable again below ``disk_usage_lwm`` (thresholds changeable at runtime through
  :meth:`BookieServer.set_disk_thresholds`), telling the registry through a callback.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, cast

import crc32c

from bookie import protocol as p
from bookie.config import BookieConfig
from bookie.metrics import BookieMetrics, MetricsHttpServer
from bookie.storage.api import DiskUsage, LacResult, Storage
from foundation.errors import (
    BooklineError,
    ChecksumError,
    ConfigError,
    InvariantViolation,
    IOFailureError,
    NoEntryError,
    TooManyRequestsError,
)
from foundation.invariants import invariant

log = logging.getLogger(__name__)

__all__ = ["BookieServer", "install_uvloop"]

# How long a clean shutdown waits for in-flight requests before closing anyway.
DRAIN_TIMEOUT_S_DEFAULT: Final = 10.0
# How often a draining shutdown looks at fast-path ADDs still waiting for the journal.
DRAIN_POLL_S: Final = 0.005
# Metrics refresh cadence, independent of the (possibly slow) disk check interval.
STATS_INTERVAL_S: Final = 1.0
# Entry bytes one ENTRY_CHECKSUMS request reads before answering the part it covered:
# bounds the disk work and the time of one replica-check request.
CHECKSUM_READ_BYTES_MAX: Final = 16 << 20

StateCallback = Callable[[bool], Awaitable[None]]


def install_uvloop() -> bool:
    """Use uvloop's event loop policy when it is installed; say whether it is."""
    try:
        import uvloop  # optional dependency
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


class _Connection(asyncio.Protocol):
    def __init__(self, server: BookieServer) -> None:
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

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.peer = str(transport.get_extra_info("peername"))
        self._server._connections.add(self)
        self._server.metrics.connection_opened()
        if self._server.draining:
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server._connections.discard(self)
        self._server.metrics.connection_closed()
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
            self.close()

    # -- requests --------------------------------------------------------------------

    def _dispatch(self, req: p.Request) -> None:
        if self._server.failed.is_set():
            return  # fatal storage error: acknowledge nothing more
        if len(self.tasks) + self.adds_inflight + len(self.polls) >= self._inflight_max:
            self._server.metrics.request_rejected()
            error = TooManyRequestsError(
                f"more than {self._inflight_max} requests in flight on this connection"
            )
            self.write(p.encode_error(req.request_id, p.op_of(req), error))
            return
        if type(req) is p.AddRequest:
            self._add_fast(req)
            return
        if type(req) is p.ReadLacRequest:
            _LacPoll(self, req).start()
            return
        self.spawn(req)

    def spawn(self, req: p.Request) -> None:
        """Handle ``req`` in a task of its own, answering when it ends."""
        task = self._loop.create_task(self._server._handle(req))
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
        if exc is not None:  # _handle answers errors itself; this is a bug in it
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

    def __init__(self, conn: _Connection, req: p.AddRequest) -> None:
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
        if _is_fatal(req, error):
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
    is read by an ordinary task (READ_LAC with no wait)."""

    __slots__ = ("_bytes_max", "_conn", "_done", "_req", "_started", "_timer")

    def __init__(self, conn: _Connection, req: p.ReadLacRequest) -> None:
        self._conn = conn
        self._req = req
        self._started = time.perf_counter()
        self._timer: asyncio.TimerHandle | None = None
        self._done = False
        self._bytes_max = _piggyback_bytes(req, conn._server.config)

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
                return
        except Exception as exc:
            self._reply_error(exc)
            return
        if result is None:  # the next entry is on disk: read it in a task
            self._finish()
            self._conn.spawn(dataclasses.replace(req, timeout_ms=0))
            return
        self._finish()
        frame = _encode_lac_answer(req, result)
        self._conn._server.metrics.observe_request(
            "READ_LAC", "OK", time.perf_counter() - self._started
        )
        self._conn.write(frame)

    def _reply_error(self, exc: BaseException) -> None:
        self._finish()
        if isinstance(exc, BooklineError):
            error = exc
        else:  # a storage bug: answer IO, keep the traceback
            log.error("storage failed on READ_LAC", exc_info=exc)
            error = IOFailureError(f"{type(exc).__name__}: {exc}")
        server = self._conn._server
        server.metrics.observe_request("READ_LAC", error.name, time.perf_counter() - self._started)
        if isinstance(error, InvariantViolation):
            server.fail(error)
        self._conn.write(p.encode_error(self._req.request_id, p.Op.READ_LAC, error))

    def _finish(self) -> None:
        self._done = True
        self._conn.polls.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _piggyback_bytes(req: p.ReadLacRequest, config: BookieConfig) -> int:
    """How many bytes of entries a long poll's answer may carry: what the reader asked
    for, kept well inside one response frame."""
    return min(req.piggyback_bytes_max, config.frame_bytes_max // 2)


def _encode_lac_answer(req: p.ReadLacRequest, result: LacResult) -> bytes:
    has_entry = result.next_entry is not None
    return p.encode_response(
        p.ReadLacResponse(
            req.request_id,
            req.ledger_id,
            result.lac,
            result.next_entry_id if has_entry else None,
            result.next_entry,
            result.more_entries if has_entry else (),
            req.piggyback_bytes_max > 0,
        )
    )


def _is_fatal(req: p.Request, exc: BooklineError) -> bool:
    """An I/O failure on a path that ends in a journal fsync (ADD, fencing) means
    durability is gone; an invariant violation means a bug. Either way: fail stop."""
    if isinstance(exc, InvariantViolation):
        return True
    if not isinstance(exc, IOFailureError):
        return False
    return type(req) is p.AddRequest or (type(req) is p.ReadRequest and req.fence)


class BookieServer:
    """Serves one :class:`Storage` over TCP. ``start()``, then ``stop()``; watch
    :attr:`failed` for a fatal storage error."""

    def __init__(
        self,
        config: BookieConfig,
        storage: Storage,
        *,
        bookie_id: str = "",
        metrics: BookieMetrics | None = None,
        on_read_only_change: StateCallback | None = None,
    ) -> None:
        self.config = config
        self.storage = storage
        self.bookie_id = bookie_id or config.bookie_id
        self.metrics = metrics or BookieMetrics()
        self._on_read_only_change = on_read_only_change
        self._threshold = config.disk_usage_threshold
        self._lwm = config.disk_usage_lwm
        self._server: asyncio.Server | None = None
        self._metrics_http: MetricsHttpServer | None = None
        self._connections: set[_Connection] = set()
        self._health_task: asyncio.Task[None] | None = None
        # The read-only state the registry was last told (None = not told yet).
        self._registered_read_only: bool | None = None
        self.draining = False
        self.failed = asyncio.Event()
        self.fatal_error: BaseException | None = None
        self.port = config.port
        self.long_poll_cap_s = config.long_poll_timeout_ms_max / 1000.0

    # -- lifecycle -------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def metrics_address(self) -> str:
        return self._metrics_http.address if self._metrics_http is not None else ""

    async def start(self) -> None:
        """Listen (port 0 picks one: see :attr:`port`), start metrics and health loops."""
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _Connection(self), self.config.host, self.config.port, reuse_address=True
            )
        except OSError as exc:
            raise ConfigError(
                f"bookie cannot listen on {self.config.host}:{self.config.port}: "
                f"{exc.strerror or exc}"
            ) from exc
        self.port = int(self._server.sockets[0].getsockname()[1])
        if self.config.metrics_port >= 0:
            try:
                self._metrics_http = MetricsHttpServer(
                    self.metrics, self.config.host, self.config.metrics_port
                )
            except OSError as exc:
                self._server.close()
                raise ConfigError(
                    f"bookie metrics cannot listen on port {self.config.metrics_port}: "
                    f"{exc.strerror or exc}"
                ) from exc
        self._hook_storage()
        await self.check_disk()  # start in the right state before the first add
        self._health_task = loop.create_task(self._health_loop(), name="bookie-health")
        log.info("bookie %s serving on %s", self.bookie_id, self.address)

    async def stop(self, drain_timeout_s: float = DRAIN_TIMEOUT_S_DEFAULT) -> None:
        """Stop accepting, stop reading new requests, let in-flight ones finish (long
        polls are cut short), then close every connection. Storage is not closed here:
        its owner checkpoints and closes it after this returns."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            if conn.transport is not None:
                conn.transport.pause_reading()
        tasks: list[asyncio.Task[bytes]] = []
        for conn in list(self._connections):
            for task, req in list(conn.tasks.items()):
                if type(req) is p.ReadLacRequest:
                    task.cancel()
                tasks.append(task)
        deadline = time.monotonic() + drain_timeout_s
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=drain_timeout_s)
            if pending:
                log.warning("shutdown: %d requests still running after drain", len(pending))
        # Fast-path ADDs have no task: wait for their journal group (bounded).
        while any(c.adds_inflight for c in self._connections) and not self.failed.is_set():
            if time.monotonic() >= deadline:
                log.warning("shutdown: ADDs still waiting for the journal after drain")
                break
            await asyncio.sleep(DRAIN_POLL_S)
        await asyncio.sleep(0)  # let done-callbacks queue their responses
        for conn in list(self._connections):
            conn.close()
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self._metrics_http is not None:
            self._metrics_http.close()
            self._metrics_http = None

    def fail(self, exc: BaseException) -> None:
        """Fatal storage error: stop acknowledging and serving now; :attr:`failed` is set
        so the process can exit non-zero. Called by the engine's fatal handler too."""
        if self.failed.is_set():
            return
        self.fatal_error = exc
        self.failed.set()
        log.critical("bookie %s: fatal storage error, no longer serving: %s", self.bookie_id, exc)
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.abort()

    # -- disk health -----------------------------------------------------------------

    def watch_read_only(self, callback: StateCallback, *, registered: bool) -> None:
        """From now on tell ``callback`` when the read-only state changes; the registry
        currently shows ``registered``."""
        self._on_read_only_change = callback
        self._registered_read_only = registered

    def note_registered(self, read_only: bool) -> None:
        """The registry now shows ``read_only`` (after a re-registration)."""
        self._registered_read_only = read_only

    def set_disk_thresholds(self, threshold: float, lwm: float) -> None:
        """Change the read-only thresholds at runtime (config reload on SIGHUP, tests)."""
        if not 0.0 < lwm < threshold <= 1.0:
            raise ConfigError("disk thresholds must satisfy 0 < lwm < threshold <= 1")
        self._threshold = threshold
        self._lwm = lwm
        log.info("disk thresholds now read-only above %.3f, writable below %.3f", threshold, lwm)

    async def check_disk(self) -> DiskUsage:
        """One disk-health step: flip read-only as needed and tell the registry."""
        usage = self.storage.disk_usage()
        read_only = usage.read_only
        if not read_only and usage.used_fraction >= self._threshold:
            log.warning(
                "disk usage %.3f >= %.3f: turning read-only", usage.used_fraction, self._threshold
            )
            self.storage.set_read_only(True)
            read_only = True
        elif read_only and usage.used_fraction < self._lwm:
            log.warning("disk usage %.3f < %.3f: writable again", usage.used_fraction, self._lwm)
            self.storage.set_read_only(False)
            read_only = False
        if read_only != self._registered_read_only and self._on_read_only_change is not None:
            try:
                await self._on_read_only_change(read_only)
            except BooklineError as exc:
                log.error("could not register read_only=%s (will retry): %s", read_only, exc)
            else:
                self._registered_read_only = read_only
        return usage

    async def _health_loop(self) -> None:
        interval_s = self.config.disk_check_interval_ms / 1000.0
        next_disk = time.monotonic() + interval_s
        while True:
            await asyncio.sleep(min(interval_s, STATS_INTERVAL_S))
            if time.monotonic() >= next_disk:
                next_disk = time.monotonic() + interval_s
                usage = await self.check_disk()
            else:
                usage = self.storage.disk_usage()
            self.metrics.refresh(usage, self._storage_stats())

    def _storage_stats(self) -> Mapping[str, object]:
        # Optional engine feature (BookieStorage has it; a Storage need not).
        snapshot = getattr(self.storage, "stats", None)
        if not callable(snapshot):
            return {}
        result = snapshot()
        return cast(Mapping[str, object], result) if isinstance(result, Mapping) else {}

    def _hook_storage(self) -> None:
        """Wire optional engine features: fatal-error callback, journal observer."""
        set_fatal = getattr(self.storage, "set_fatal_handler", None)
        if callable(set_fatal):
            set_fatal(self.fail)
        journal_stats = getattr(self.storage, "journal_stats", None)
        if journal_stats is not None and hasattr(journal_stats, "observer"):
            journal_stats.observer = self.metrics.observe_journal_group

    # -- request handling ------------------------------------------------------------

    async def _handle(self, req: p.Request) -> bytes:
        """Run one request; always returns a response frame (OK or error)."""
        started = time.perf_counter()
        op = p.op_of(req).name
        status = "OK"
        try:
            frame = await self._execute(req)
        except BooklineError as exc:
            status = exc.name
            if _is_fatal(req, exc):
                self.fail(exc)
            frame = p.encode_error(req.request_id, p.op_of(req), exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a storage bug: answer IO, keep the traceback
            log.exception("storage failed on %s", op)
            status = "IO"
            frame = p.encode_error(
                req.request_id, p.op_of(req), IOFailureError(f"{type(exc).__name__}: {exc}")
            )
        self.metrics.observe_request(op, status, time.perf_counter() - started)
        return frame

    async def _execute(self, req: p.Request) -> bytes:
        storage = self.storage
        if type(req) is p.AddRequest:
            await storage.add_entry(
                req.ledger_id,
                req.entry_id,
                req.lac,
                req.master_key,
                req.payload,
                recovery=req.recovery,
            )
            return p.encode_response(p.AddResponse(req.request_id, req.ledger_id, req.entry_id))
        if type(req) is p.ReadRequest:
            if req.fence:
                lac = await storage.fence(req.ledger_id, req.master_key)
                payload, entry_id = await self._read(req.ledger_id, req.entry_id)
            else:
                payload, entry_id = await self._read(req.ledger_id, req.entry_id)
                lac = storage.last_add_confirmed(req.ledger_id)
            return p.encode_response(
                p.ReadResponse(req.request_id, req.ledger_id, entry_id, lac, payload)
            )
        if type(req) is p.ReadLacRequest:
            timeout_s = min(req.timeout_ms / 1000.0, self.long_poll_cap_s)
            result = await storage.wait_lac(
                req.ledger_id, req.previous_lac, timeout_s, _piggyback_bytes(req, self.config)
            )
            return _encode_lac_answer(req, result)
        if type(req) is p.WriteLacRequest:
            lac = storage.write_lac(req.ledger_id, req.lac, req.master_key)
            return p.encode_response(p.WriteLacResponse(req.request_id, req.ledger_id, lac))
        if type(req) is p.InfoRequest:
            usage = storage.disk_usage()
            info = p.BookieInfo(
                bookie_id=self.bookie_id,
                state="read_only" if usage.read_only else "writable",
                used_fraction=usage.used_fraction,
                free_bytes=usage.free_bytes,
                total_bytes=usage.total_bytes,
                features=(p.FEATURE_WRITE_LAC, p.FEATURE_LAC_ENTRIES, p.FEATURE_REPLICA_CHECK),
            )
            return p.encode_response(p.InfoResponse(req.request_id, info))
        if type(req) is p.ListLedgersRequest:
            ledgers = tuple(storage.ledgers())
            return p.encode_response(p.ListLedgersResponse(req.request_id, ledgers))
        if type(req) is p.ListEntriesRequest:
            entries = tuple(await storage.entries(req.ledger_id))
            return p.encode_response(p.ListEntriesResponse(req.request_id, req.ledger_id, entries))
        if type(req) is p.ListDamagedRequest:
            return p.encode_response(damaged_page(req, storage.damaged_entries()))
        if type(req) is p.EntryChecksumsRequest:
            return p.encode_response(await self._entry_checksums(req))
        raise InvariantViolation(f"no handler for {type(req).__name__}")

    async def _entry_checksums(self, req: p.EntryChecksumsRequest) -> p.EntryChecksumsResponse:
        """CRC32C and length of each stored blob of ``req``'s range that reads intact;
        the ids whose read fails a checksum. Stops after CHECKSUM_RANGE_ENTRIES_MAX
        entries or CHECKSUM_READ_BYTES_MAX bytes read.

        The read decides, not storage's damaged marks: a repaired entry is served intact
        (from memory) before the checkpoint that clears its mark, and a marked entry
        fails its read (storage's contract), so both answer what a reader would get."""
        storage = self.storage
        ledger_id = req.ledger_id
        last_held = await storage.last_entry_id(ledger_id)  # NoLedgerError: none here
        marked = [e for lid, e in storage.damaged_entries() if lid == ledger_id]
        covered = min(req.last_entry_id, req.first_entry_id + p.CHECKSUM_RANGE_ENTRIES_MAX - 1)
        scan_end = min(covered, max(last_held, *marked) if marked else last_held)
        sums: list[p.EntryChecksum] = []
        damaged: list[int] = []
        read_bytes = 0
        for entry_id in range(req.first_entry_id, scan_end + 1):
            try:
                blob = await storage.read_entry(ledger_id, entry_id)
            except NoEntryError:
                continue  # not held here: in neither list
            except ChecksumError as exc:
                log.warning("replica check: entry %d/%d is damaged: %s", ledger_id, entry_id, exc)
                damaged.append(entry_id)
                continue
            sums.append(p.EntryChecksum(entry_id, crc32c.crc32c(blob), len(blob)))
            read_bytes += len(blob)
            if read_bytes >= CHECKSUM_READ_BYTES_MAX:
                covered = entry_id
                break
        return p.EntryChecksumsResponse(
            req.request_id, ledger_id, covered, tuple(sums), tuple(damaged)
        )

    async def _read(self, ledger_id: int, entry_id: int) -> tuple[bytes, int]:
        """Read an entry; for ``LAST_ENTRY`` also find out which id that was."""
        if entry_id != -1:
            return await self.storage.read_entry(ledger_id, entry_id), entry_id
        last = await self.storage.last_entry_id(ledger_id)
        if last < 0:
            raise NoEntryError(f"ledger {ledger_id} has no entries on this bookie")
        return await self.storage.read_entry(ledger_id, last), last


def damaged_page(
    req: p.ListDamagedRequest, damaged: list[tuple[int, int]]
) -> p.ListDamagedResponse:
    """One LIST_DAMAGED answer: the sorted ``damaged`` pairs from the request's start."""
    start = bisect.bisect_left(damaged, (req.from_ledger_id, req.from_entry_id))
    page = damaged[start : start + p.DAMAGED_PAGE_ENTRIES_MAX]
    end = start + len(page)
    next_from = damaged[end] if end < len(damaged) else None
    return p.ListDamagedResponse(req.request_id, tuple(page), next_from)
