"""The bookie's TCP server: listens, serves :class:`~bookie.storage.api.Storage` to its
connections, stops cleanly or fail-stops, and watches the disks.

* each client gets a :class:`~bookie.server_connection.ServerConnection` (frames in,
  answers out; ADD and READ_LAC long polls without a task); requests that run as tasks
  are answered by :class:`~bookie.server_requests.RequestHandlers`;
* READ_LAC long polls are capped at ``long_poll_timeout_ms_max``;
* an :class:`~foundation.errors.IOFailureError` from a write path (ADD, fence) or an
  :class:`~foundation.errors.InvariantViolation` anywhere is *fatal*: the journal could
  not be made durable, so the bookie stops acknowledging at once, closes every
  connection and reports through :attr:`BookieServer.failed` (main exits non-zero);
* a clean :meth:`BookieServer.stop` stops reading, drains in-flight requests (bounded),
  then closes the connections;
* a disk-health loop turns the bookie read-only above ``disk_usage_threshold`` and
  writable again below ``disk_usage_lwm`` (thresholds changeable at runtime through
  :meth:`BookieServer.set_disk_thresholds`), telling the registry through a callback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, cast

from bookie import protocol as p
from bookie.access import LedgerGate, Lookup
from bookie.config import BookieConfig
from bookie.identity import hello_proof, load_credential
from bookie.metrics import BookieMetrics, MetricsHttpServer
from bookie.server_connection import ServerConnection
from bookie.server_requests import RequestHandlers
from bookie.storage.api import DiskUsage, Storage
from foundation import tls
from foundation.auth import load_authority
from foundation.errors import (
    BooklineError,
    ConfigError,
    UnauthenticatedError,
)
from foundation.health import State, health_body

log = logging.getLogger(__name__)

__all__ = ["BookieServer", "install_uvloop"]

# How long a clean shutdown waits for in-flight requests before closing anyway.
DRAIN_TIMEOUT_S_DEFAULT: Final = 10.0
# How often a draining shutdown looks at fast-path ADDs still waiting for the journal.
DRAIN_POLL_S: Final = 0.005
# Metrics refresh cadence, independent of the (possibly slow) disk check interval.
STATS_INTERVAL_S: Final = 1.0
# The idle sweep looks at every connection this many times per idle_timeout_s (so a
# connection is closed at most a quarter of the timeout late), at most once a second.
IDLE_SWEEPS_PER_TIMEOUT: Final = 4
IDLE_SWEEP_S_MAX: Final = 1.0
# A flood of refused connections logs one line per reason this often, with the count.
REFUSAL_LOG_INTERVAL_S: Final = 10.0

StateCallback = Callable[[bool], Awaitable[None]]


def install_uvloop() -> bool:
    """Use uvloop's event loop policy when it is installed; say whether it is."""
    try:
        import uvloop  # optional dependency
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


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
        ledger_lookup: Lookup | None = None,
    ) -> None:
        """``ledger_lookup`` reads a ledger's metadata: with it, the first ADD or fence
        of a ledger this bookie does not hold must name a ledger that exists, under its
        key (bookie/access.py)."""
        self.config = config
        self.storage = storage
        self.bookie_id = bookie_id or config.bookie_id
        self.metrics = metrics or BookieMetrics()
        self._on_read_only_change = on_read_only_change
        self._threshold = config.disk_usage_threshold
        self._lwm = config.disk_usage_lwm
        self._server: asyncio.Server | None = None
        self._metrics_http: MetricsHttpServer | None = None
        self.connections: set[ServerConnection] = set()
        self.buffered_bytes = 0
        self._refusals = _RefusalLog()
        self._health_task: asyncio.Task[None] | None = None
        self._idle_task: asyncio.Task[None] | None = None
        # The read-only state the registry was last told (None = not told yet).
        self._registered_read_only: bool | None = None
        # Read-only by an operator's request (`bookline bookie readonly`), whatever the
        # disks say, until lifted (`bookline bookie writable`).
        self.forced_read_only = False
        self.draining = False
        self.failed = asyncio.Event()
        self.fatal_error: BaseException | None = None
        self.port = config.port
        self.long_poll_cap_s = config.long_poll_timeout_ms_max / 1000.0
        self.gate = LedgerGate(storage, ledger_lookup)
        self.unauthenticated: dict[ServerConnection, None] = {}
        # This bookie's credential (bookie/identity.py), else None.
        self.credential = load_credential(config.identity_file) if config.identity_file else None
        self.authority = load_authority(config.auth)
        self._requests = RequestHandlers(
            storage,
            self.metrics,
            bookie_id=self.bookie_id,
            frame_bytes_max=config.frame_bytes_max,
            long_poll_cap_s=self.long_poll_cap_s,
            fail=self.fail,
            gate=self.gate,
        )

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
                lambda: ServerConnection(self),
                self.config.host,
                self.config.port,
                reuse_address=True,
                **tls.server_options(),  # TLS when the process's [tls] says so
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
                    self.metrics, self.config.host, self.config.metrics_port, self.authority
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
        self._idle_task = loop.create_task(self._idle_loop(), name="bookie-idle")
        self._publish_health(self.storage.disk_usage())
        log.info("bookie %s serving on %s", self.bookie_id, self.address)

    async def stop(self, drain_timeout_s: float = DRAIN_TIMEOUT_S_DEFAULT) -> None:
        """Stop accepting, stop reading new requests, let in-flight ones finish (long
        polls are cut short), then close every connection. Storage is not closed here:
        its owner checkpoints and closes it after this returns."""
        self.draining = True
        self._publish_health(None)
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.pause_reading()
        tasks: list[asyncio.Task[bytes]] = []
        for conn in list(self.connections):
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
        while any(c.adds_inflight for c in self.connections) and not self.failed.is_set():
            if time.monotonic() >= deadline:
                log.warning("shutdown: ADDs still waiting for the journal after drain")
                break
            await asyncio.sleep(DRAIN_POLL_S)
        await asyncio.sleep(0)  # let done-callbacks queue their responses
        for conn in list(self.connections):
            conn.close()
        for loop_task in (self._health_task, self._idle_task):
            if loop_task is not None:
                loop_task.cancel()
                await asyncio.gather(loop_task, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self._metrics_http is not None:
            self._metrics_http.close()
            self._metrics_http = None

    def handle(self, req: p.Request) -> Coroutine[Any, Any, bytes]:
        """Run a request (a connection's task); its response frame, OK or error."""
        return self._requests.handle(req)

    def write_lac_now(self, req: p.WriteLacRequest) -> bytes:
        """WRITE_LAC answered at once (a connection's fast path); its response frame."""
        return self._requests.write_lac_now(req)

    def fail(self, exc: BaseException) -> None:
        """Fatal storage error: stop acknowledging and serving now; :attr:`failed` is set
        so the process can exit non-zero. Called by the engine's fatal handler too."""
        if self.failed.is_set():
            return
        self.fatal_error = exc
        self.failed.set()
        log.critical("bookie %s: fatal storage error, no longer serving: %s", self.bookie_id, exc)
        self._publish_health(None)
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort()

    def hello(self, req: p.HelloRequest) -> bytes:
        """The answer to HELLO: this bookie's proof of its credential, or
        UNAUTHENTICATED without one."""
        if self.credential is None:
            error = UnauthenticatedError(f"bookie {self.bookie_id} has no cluster credential")
            return p.encode_error(req.request_id, p.Op.HELLO, error)
        proof = hello_proof(self.credential, req.nonce, self.bookie_id, self.address)
        return p.encode_response(
            p.HelloResponse(req.request_id, self.bookie_id, self.address, proof)
        )

    # -- resource limits -------------------------------------------------------------

    def refuse(self, conn: ServerConnection, reason: str, why: str) -> None:
        """Close ``conn`` for a resource limit (a reason of
        :data:`bookie.metrics.LIMIT_CLOSE_REASONS`): counted, and logged at most once
        per reason every :data:`REFUSAL_LOG_INTERVAL_S` so a flood cannot flood the log."""
        self.metrics.closed_by_limit(reason)
        self._refusals.note(reason, why, conn.peer)
        conn.close()

    async def _idle_loop(self) -> None:
        timeout_s = self.config.idle_timeout_s
        interval_s = min(timeout_s / IDLE_SWEEPS_PER_TIMEOUT, IDLE_SWEEP_S_MAX)
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for conn in list(self.connections):
                if conn.idle_for(now) >= timeout_s:
                    self.refuse(conn, "idle", f"idle for over {timeout_s:g} s")
            self.metrics.set_buffered_bytes(self.buffered_bytes)

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

    def set_forced_read_only(self, forced: bool) -> None:
        """Hold the bookie read-only (an operator's request) or let the disks decide
        again; the next :meth:`check_disk` applies it."""
        if forced != self.forced_read_only:
            log.warning(
                "bookie %s: %s by an operator",
                self.bookie_id,
                "read-only" if forced else "no longer held read-only",
            )
        self.forced_read_only = forced

    async def check_disk(self) -> DiskUsage:
        """One disk-health step: flip read-only as needed and tell the registry."""
        usage = self.storage.disk_usage()
        read_only = usage.read_only
        if self.forced_read_only:
            if not read_only:
                self.storage.set_read_only(True)
                read_only = True
        elif not read_only and usage.used_fraction >= self._threshold:
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
            self._publish_health(usage)

    def _publish_health(self, usage: DiskUsage | None) -> None:
        """What ``/health`` answers from now on (see :mod:`foundation.health`)."""
        details: dict[str, Any] = {
            "address": self.address,
            "connections": len(self.connections),
            "requests": self.metrics.request_totals(),
        }
        if self.failed.is_set():
            state, why = State.DOWN, "fatal storage error"
            details["error"] = str(self.fatal_error)  # may name files: a detail
        elif self.draining:
            state, why = State.STOPPING, "stopping: draining requests"
        elif usage is None:
            state, why = State.STARTING, "starting"
        elif usage.read_only:
            state = State.DEGRADED
            why = (
                f"read-only: disk {usage.used_fraction:.1%} used, writable again below "
                f"{self._lwm:.1%}"
                if usage.used_fraction >= self._lwm
                else "read-only"
            )
        else:
            state, why = State.OK, "writable"
        if usage is not None:
            details["read_only"] = usage.read_only
            details["disk"] = {
                "used_ratio": usage.used_fraction,
                "free_bytes": usage.free_bytes,
                "total_bytes": usage.total_bytes,
                "read_only_above_ratio": self._threshold,
            }
        self.metrics.publish_health(health_body("bookie", self.bookie_id, state, why, **details))

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


class _RefusalLog:
    """Log lines for connections closed by limits: the first of each reason at once,
    then one line per :data:`REFUSAL_LOG_INTERVAL_S` with how many were closed since."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def note(self, reason: str, why: str, peer: str) -> None:
        now = time.monotonic()
        self._since[reason] = self._since.get(reason, 0) + 1
        if now - self._last.get(reason, -REFUSAL_LOG_INTERVAL_S) < REFUSAL_LOG_INTERVAL_S:
            return
        count = self._since.pop(reason)
        self._last[reason] = now
        log.warning("closing connection %s: %s (%d closed for %s lately)", peer, why, count, reason)
