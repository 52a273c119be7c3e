"""Stream ownership of one process (:class:`Ownership`): acquiring and dropping.

Owning a stream takes two things, in this order:

1. the **owner record** ``owners/<ns>/<stream>`` (ephemeral, this proxy's session):
   what other proxies read to redirect clients here;
2. the stream's **writer lock**, by opening the core library's writer, which also
   recovers and seals the previous owner's last segment (fencing it) and starts a new
   segment.

Then the de-duplication table is rebuilt from the stream's tail (:mod:`serving.write.dedup`)
and the stream is served by an :class:`~serving.write.owned.OwnedStream`. A stream whose
writer fails (lost lock, bookies gone) is dropped: the writer is closed, the record
released, and the next request acquires it again from scratch, so the table is always
rebuilt from what the log really holds. An acquisition that failed is not tried again
for a back-off (0.5 s doubling to 5 s): requests meanwhile get its error at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from foundation.errors import (
    AlreadyExistsError,
    BooklineError,
    LockOwnedError,
    NotFoundError,
    OwnerMovedError,
    OwnershipLostError,
    TooManyRequestsError,
    UnavailableError,
    for_code,
)
from serving.write import dedup
from serving.write.config import WriteConfig
from serving.write.metrics import UncountedWrites, WriteMetrics
from serving.write.owned import OwnedStream
from streams.columns import read_raw_entries
from streams.records import ReadRecord
from streams.recordset import decode_with_markers

if TYPE_CHECKING:
    from metadata.client import MetadataClient
    from streams.namespace import Namespace
    from streams.vocabulary import SegmentInfo
    from streams.writer import LogWriter

log = logging.getLogger(__name__)

__all__ = ["Ownership"]

# Entries read per request while scanning a stream's tail on takeover.
SCAN_ENTRIES_PER_READ = 64
# Streams being acquired at once (each costs ZooKeeper round trips and a recovery).
ACQUIRES_CONCURRENT_MAX = 32
# A stream whose acquisition failed (too few bookies, ZooKeeper trouble) is not acquired
# again before this back-off, doubling per failure up to the max: requests meanwhile get
# the same error at once, instead of each taking the lock, recovering the last segment
# and letting go again (20 times a second under one retrying client).
ACQUIRE_BACKOFF_INITIAL_S = 0.5
ACQUIRE_BACKOFF_MAX_S = 5.0
# Failed streams remembered at most (the oldest forgotten first).
ACQUIRE_FAILURES_MAX = 10_000
# Errors that say "ask again / elsewhere" rather than "this cannot work now".
_NO_BACKOFF = (OwnerMovedError, OwnershipLostError, TooManyRequestsError, UnavailableError)


@dataclass(slots=True)
class _Failure:
    error: BooklineError
    retry_at: float
    backoff_s: float


class Ownership:
    """The streams this process owns, acquiring and dropping them."""

    def __init__(
        self,
        config: WriteConfig,
        ns: Namespace,
        md: MetadataClient,
        address: str,
        *,
        metrics: WriteMetrics | None = None,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self._failures: dict[str, _Failure] = {}
        self.ns = ns
        self.md = md
        self.address = address
        self.owned: dict[str, OwnedStream] = {}
        self._acquiring: dict[str, asyncio.Future[OwnedStream]] = {}
        self._acquire_slots = asyncio.Semaphore(ACQUIRES_CONCURRENT_MAX)
        self._on_change = on_change or (lambda: None)
        self._closing = False
        self._drops: set[asyncio.Task[None]] = set()
        self._metrics = metrics or UncountedWrites()

    @property
    def identity(self) -> str:
        return f"{self.config.proxy_id}@{self.address}"

    async def get(self, name: str) -> OwnedStream:
        """The owned stream, acquiring it when nobody owns it; OwnerMovedError if
        another proxy does."""
        stream = self.owned.get(name)
        if stream is not None and stream.failed is None:
            return stream
        if stream is not None:
            await self.drop(name)
        pending = self._acquiring.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        if self._closing:
            # Retriable: the client retries, and reaches the stream's next owner.
            raise UnavailableError("write proxy is shutting down; retry")
        if len(self.owned) >= self.config.streams_owned_max:
            raise TooManyRequestsError(
                f"this proxy owns {len(self.owned)} streams, its limit; try another proxy"
            )
        self._check_backoff(name)
        fut: asyncio.Future[OwnedStream] = asyncio.get_running_loop().create_future()
        self._acquiring[name] = fut
        try:
            async with self._acquire_slots:
                owned = await asyncio.wait_for(
                    self._acquire(name), self.config.acquire_timeout_ms / 1000
                )
        except BaseException as exc:
            self._note_failure(name, exc)
            fut.set_exception(exc)
            fut.exception()  # retrieved: concurrent waiters re-raise it themselves
            raise
        else:
            self._failures.pop(name, None)
            fut.set_result(owned)
            return owned
        finally:
            del self._acquiring[name]

    def _check_backoff(self, name: str) -> None:
        """Raise the last acquisition's error again while its back-off lasts."""
        failure = self._failures.get(name)
        if failure is None:
            return
        left_s = failure.retry_at - self._clock()
        if left_s > 0:
            raise for_code(
                failure.error.code,
                f"{failure.error.message} (stream {name} not acquired again for "
                f"{left_s * 1000:.0f} ms)",
            )

    def _note_failure(self, name: str, exc: BaseException) -> None:
        if not isinstance(exc, BooklineError) or isinstance(exc, _NO_BACKOFF):
            return
        last = self._failures.pop(name, None)
        backoff_s = (
            ACQUIRE_BACKOFF_INITIAL_S
            if last is None
            else min(last.backoff_s * 2, ACQUIRE_BACKOFF_MAX_S)
        )
        self._failures[name] = _Failure(exc, self._clock() + backoff_s, backoff_s)
        while len(self._failures) > ACQUIRE_FAILURES_MAX:
            del self._failures[next(iter(self._failures))]
        log.warning(
            "stream %s: acquisition failed (%s); not tried again for %.1f s",
            name,
            exc,
            backoff_s,
        )

    async def owner_of(self, name: str) -> str | None:
        """Address of the proxy owning ``name`` (ours included), or None."""
        if name in self.owned:
            return self.address
        record = await self.md.proxies.get_owner(self.config.namespace, name)
        return None if record is None else record.address

    async def _acquire(self, name: str) -> OwnedStream:
        ns_name = self.config.namespace
        record = await self.md.proxies.get_owner(ns_name, name)
        if record is not None and record.session_id != self.md.zk.session_id:
            if record.address == self.address:
                # An earlier process of this proxy (restarted within its session's
                # timeout) still holds it: not a redirect to ourselves; retry shortly.
                raise OwnershipLostError(
                    f"{name} is held by a previous session of this proxy until it expires"
                )
            raise OwnerMovedError(f"{name} is owned by {record.address}", owner=record.address)
        if not await self.ns.exists(name):
            if not self.config.auto_create_streams:
                raise NotFoundError(f"stream {name} does not exist")
            with contextlib.suppress(AlreadyExistsError):  # created concurrently: fine
                await self.ns.create_stream(name)
        try:
            await self.md.proxies.claim_owner(ns_name, name, self.config.proxy_id, self.address)
        except LockOwnedError as exc:
            raise OwnerMovedError(f"{name} is owned by {exc.owner}", owner=exc.owner) from exc
        try:
            writer = await self.ns.open_writer(name, identity=self.identity)
        except LockOwnedError as exc:
            await self._release_record(name)
            # Someone holds the lock without an owner record: a crashed proxy whose
            # session has not expired yet, or a direct core writer. Retriable.
            raise OwnershipLostError(
                f"{name}: writer lock held by {exc.owner}; retry shortly"
            ) from exc
        except BaseException:
            await self._release_record(name)
            raise
        try:
            table, scanned = await self._rebuild_table(name)
        except BaseException:
            await _close_writer(writer, name)
            await self._release_record(name)
            raise
        owned = OwnedStream(name, writer, table, self.config.reorder_wait_ms / 1000.0)
        self.owned[name] = owned
        self._metrics.stream_acquired(scanned)
        self._on_change()
        log.info("acquired stream %s (%d producers remembered)", name, len(table))
        return owned

    async def _rebuild_table(self, name: str) -> tuple[dedup.DedupTable, int]:
        """The stream's producers' table, and how many records were read for it."""
        cfg = self.config
        records, whole = await self._scan_tail(name)
        table = dedup.DedupTable(
            cfg.dedup_batches_per_producer, cfg.dedup_producers_max, complete=whole
        )
        dedup.rebuild(table, records)
        return table, len(records)

    async def _scan_tail(
        self, name: str
    ) -> tuple[list[tuple[ReadRecord, dedup.Marker | None]], bool]:
        """The stream's most recent records (oldest first) within the dedup window, each
        with the producer marker it carries (or None), and whether they are all the
        stream ever held (then a producer not among them never wrote to it)."""
        cfg = self.config
        horizon_ms = int(time.time() * 1000) - cfg.dedup_window_ms
        chunks: list[list[tuple[ReadRecord, dedup.Marker | None]]] = []
        total = 0
        segments = await self.ns.segments(name)
        for seg in reversed(segments):
            if seg.truncated or seg.last_entry_id is None or seg.last_entry_id < 0:
                continue
            last = seg.last_entry_id
            while last >= 0:
                first = max(0, last - SCAN_ENTRIES_PER_READ + 1)
                recs, appended_ms = await _read_marked(self.ns, name, seg.seqno, first, last)
                chunks.append(recs)
                total += len(recs)
                # The sets' append time, not the records' (a producer may set those).
                if total >= cfg.dedup_scan_records_max or appended_ms < horizon_ms:
                    # Stopped short: older producers may be forgotten.
                    return [r for chunk in reversed(chunks) for r in chunk], False
                last = first - 1
        return [r for chunk in reversed(chunks) for r in chunk], _whole(segments)

    async def _release_record(self, name: str) -> None:
        try:
            await self.md.proxies.release_owner(self.config.namespace, name)
        except BooklineError as exc:  # the session may be gone; then so is the record
            log.warning("stream %s: could not release owner record: %s", name, exc)

    async def drop(self, name: str) -> None:
        """Stop owning ``name``: close its writer, release the record."""
        owned = self.owned.pop(name, None)
        if owned is None:
            return
        await _close_writer(owned.writer, name)
        await self._release_record(name)
        self._on_change()
        log.info("released stream %s", name)

    def drop_soon(self, name: str) -> None:
        task = asyncio.get_running_loop().create_task(self.drop(name))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    def drop_all_soon(self) -> None:
        """The session that held our records is gone: so is every stream."""
        for name in list(self.owned):
            self.owned[name].failed = self.owned[name].failed or OwnershipLostError("session lost")
            self.drop_soon(name)

    def abort_all(self) -> None:
        """Shutting down: new acquisitions are refused, and every owned stream answers
        its waiting and in-flight requests now (:meth:`OwnedStream.abort`)."""
        self._closing = True
        if self.owned:
            log.info("shutting down: answering the requests of %d streams", len(self.owned))
        for stream in self.owned.values():
            stream.abort(UnavailableError("write proxy is shutting down"))

    async def close(self, writers_timeout_s: float) -> None:
        """Stop owning everything (shutdown): owner records are released first (quick),
        then the writers are closed concurrently for at most ``writers_timeout_s`` -- a
        writer whose bookies are down never finishes; the caller then closes the
        ZooKeeper session, which releases its lock, and the next owner recovers."""
        self.abort_all()
        streams = list(self.owned.items())
        self.owned.clear()
        await asyncio.gather(*(self._release_record(name) for name, _s in streams))
        closes = [asyncio.ensure_future(_close_writer(s.writer, name)) for name, s in streams]
        closes.extend(self._drops)
        if not closes:
            return
        done, pending = await asyncio.wait(closes, timeout=writers_timeout_s)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("closing a writer failed", exc_info=task.exception())
        if pending:
            log.warning(
                "%d writers not closed within %.1f s (bookies down?); their locks "
                "go with the ZooKeeper session",
                len(pending),
                writers_timeout_s,
            )
            for task in pending:
                task.cancel()


def _whole(segments: list[SegmentInfo]) -> bool:
    """Whether reading ``segments`` (all of them) read everything the stream ever held:
    nothing removed by retention (the oldest starts the stream at offset 0) and no
    segment with records whose end is not known (skipped by the scan)."""
    if not segments or segments[0].start_sequence_id != 0:
        return not segments
    return not any(
        s.truncated or s.min_active_dlsn is not None
        or (s.last_entry_id < 0 and s.record_count > 0)
        for s in segments
    )  # fmt: skip


async def _read_marked(
    ns: Namespace, name: str, seqno: int, first: int, last: int
) -> tuple[list[tuple[ReadRecord, dedup.Marker | None]], int]:
    """Entries ``first..last`` of a segment: each record with its producer marker, and
    when the first of them was appended (ms; the current time when there is none)."""
    start, entries = await read_raw_entries(ns, name, seqno, first, last)
    out: list[tuple[ReadRecord, dedup.Marker | None]] = []
    appended_ms = int(time.time() * 1000)
    for k, (entry_id, payload) in enumerate(entries):
        header, records, markers = decode_with_markers(payload, name, seqno, entry_id, start)
        if k == 0:
            appended_ms = header.base_ts_ms
        out += ((r, markers.get(r.dlsn.slot_id)) for r in records)
    return out, appended_ms


async def _close_writer(writer: LogWriter, name: str) -> None:
    try:
        await writer.close()
    except BooklineError as exc:  # a failed writer may fail to close; the lock still goes
        log.warning("stream %s: closing its writer: %s", name, exc)
