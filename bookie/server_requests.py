"""The bookie's answers to requests that run as tasks: one handler per op, against
:class:`~bookie.storage.api.Storage`, each returning the encoded response frame.

ADD (and READ_LAC answered from memory) normally take the connection's task-free fast
paths (server_connection.py); their handlers here serve whatever is not answered there.
Errors are answered with their stable code; an I/O failure on a path ending in a
journal fsync (ADD, fencing) or an invariant violation anywhere is fatal (see
:func:`is_fatal`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import crc32c

from bookie import protocol as p
from bookie.access import LedgerGate
from bookie.metrics import BookieMetrics
from bookie.storage.api import LacResult, Storage
from foundation.errors import (
    BooklineError,
    ChecksumError,
    InvariantViolation,
    IOFailureError,
    NoEntryError,
)
from foundation.waits import request_waits, waiting

log = logging.getLogger(__name__)

# Entry bytes one ENTRY_CHECKSUMS request reads before answering the part it covered:
# bounds the disk work and the time of one replica-check request.
CHECKSUM_READ_BYTES_MAX: Final = 16 << 20
# What INFO advertises: the optional ops this bookie serves.
FEATURES: Final = (p.FEATURE_WRITE_LAC, p.FEATURE_LAC_ENTRIES, p.FEATURE_REPLICA_CHECK)

FatalHandler = Callable[[BaseException], None]
Handler = Callable[[Any], Awaitable[bytes]]


class RequestHandlers:
    """Runs requests: :meth:`handle` always returns a response frame (OK or error)."""

    def __init__(
        self,
        storage: Storage,
        metrics: BookieMetrics,
        *,
        bookie_id: str,
        frame_bytes_max: int,
        long_poll_cap_s: float,
        fail: FatalHandler,
        gate: LedgerGate | None = None,
    ) -> None:
        """``fail`` is told a fatal error (the server stops serving); ``gate`` checks
        ledger keys (by default: stored keys only, no metadata look-ups)."""
        self._storage = storage
        self._gate = gate or LedgerGate(storage, None)
        self._metrics = metrics
        self._bookie_id = bookie_id
        self._frame_bytes_max = frame_bytes_max
        self._long_poll_cap_s = long_poll_cap_s
        self._fail = fail
        self._handlers: dict[type, Handler] = {
            p.AddRequest: self._add,
            p.ReadRequest: self._read,
            p.ReadLacRequest: self._read_lac,
            p.WriteLacRequest: self._write_lac,
            p.InfoRequest: self._info,
            p.ListLedgersRequest: self._list_ledgers,
            p.ListEntriesRequest: self._list_entries,
            p.ListDamagedRequest: self._list_damaged,
            p.EntryChecksumsRequest: self._entry_checksums,
        }

    async def handle(self, req: p.Request) -> bytes:
        """Run one request; its response frame, or an error frame."""
        started = time.perf_counter()
        op = p.op_of(req)
        with request_waits() as waited:
            frame, status = await self._run(req, op)
        if waited.seconds > 0:  # a long poll's wait for the LAC is not serving time
            self._metrics.observe_long_poll_wait(waited.seconds)
        serving = time.perf_counter() - started - waited.seconds
        self._metrics.observe_request(op.name, status, max(0.0, serving))
        return frame

    async def _run(self, req: p.Request, op: p.Op) -> tuple[bytes, str]:
        """The request's answer frame and its status (OK or an error's name)."""
        try:
            handler = self._handlers.get(type(req))
            if handler is None:
                raise InvariantViolation(f"no handler for {type(req).__name__}")
            return await handler(req), "OK"
        except BooklineError as exc:
            return self._refused(req, op, exc)
        except Exception as exc:  # a storage bug: answer IO, keep the traceback
            log.exception("storage failed on %s", op.name)
            return _io_error(req, op, exc)

    def _refused(self, req: p.Request, op: p.Op, exc: BooklineError) -> tuple[bytes, str]:
        """The error answer to ``req`` and its status; a fatal error stops the server."""
        if is_fatal(req, exc):
            self._fail(exc)
        return p.encode_error(req.request_id, op, exc), exc.name

    def write_lac_now(self, req: p.WriteLacRequest) -> bytes:
        """WRITE_LAC without a task (it never waits; observed as :meth:`handle` does): a
        writer pushes one per acknowledgement, and the long polls it wakes answer in
        the same loop iteration (issue 26)."""
        started = time.perf_counter()
        try:
            lac = self._storage.write_lac(req.ledger_id, req.lac, req.master_key)
            resp = p.WriteLacResponse(req.request_id, req.ledger_id, lac)
            frame, status = p.encode_response(resp), "OK"
        except BooklineError as exc:
            frame, status = self._refused(req, p.Op.WRITE_LAC, exc)
        except Exception as exc:  # a storage bug: answer IO, keep the traceback
            log.exception("storage failed on WRITE_LAC")
            frame, status = _io_error(req, p.Op.WRITE_LAC, exc)
        self._metrics.observe_request("WRITE_LAC", status, time.perf_counter() - started)
        return frame

    async def _add(self, req: p.AddRequest) -> bytes:
        await self._gate.admit(req.ledger_id, req.master_key)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._storage.add_entry_nowait(req, fut)
        await fut
        return p.encode_add_response(req.request_id, req.ledger_id, req.entry_id)

    async def _read(self, req: p.ReadRequest) -> bytes:
        storage = self._storage
        if req.fence:
            await self._gate.admit(req.ledger_id, req.master_key)
            lac = await storage.fence(req.ledger_id, req.master_key)
            payload, entry_id = await self._read_entry(req.ledger_id, req.entry_id)
        else:
            await self._gate.check_read(req.ledger_id, req.master_key)
            payload, entry_id = await self._read_entry(req.ledger_id, req.entry_id)
            lac = storage.last_add_confirmed(req.ledger_id)
        resp = p.ReadResponse(req.request_id, req.ledger_id, entry_id, lac, payload)
        return p.encode_response(resp)

    async def _read_entry(self, ledger_id: int, entry_id: int) -> tuple[bytes, int]:
        """Read an entry; for ``LAST_ENTRY`` also find out which id that was."""
        if entry_id != -1:
            return await self._storage.read_entry(ledger_id, entry_id), entry_id
        last = await self._storage.last_entry_id(ledger_id)
        if last < 0:
            raise NoEntryError(f"ledger {ledger_id} has no entries on this bookie")
        return await self._storage.read_entry(ledger_id, last), last

    async def _read_lac(self, req: p.ReadLacRequest) -> bytes:
        await self._gate.check_read(req.ledger_id, req.master_key)
        timeout_s = min(req.timeout_ms / 1000.0, self._long_poll_cap_s)
        bytes_max = piggyback_bytes(req, self._frame_bytes_max)
        now = self._storage.lac_answer_nowait(req.ledger_id, req.previous_lac, bytes_max)
        caught_up = timeout_s > 0 and now is not None and now.lac <= req.previous_lac
        with waiting() if caught_up else contextlib.nullcontext():
            result = await self._storage.wait_lac(
                req.ledger_id, req.previous_lac, timeout_s, bytes_max
            )
        return encode_lac_answer(req, result)

    async def _write_lac(self, req: p.WriteLacRequest) -> bytes:
        lac = self._storage.write_lac(req.ledger_id, req.lac, req.master_key)
        return p.encode_response(p.WriteLacResponse(req.request_id, req.ledger_id, lac))

    async def _info(self, req: p.InfoRequest) -> bytes:
        usage = self._storage.disk_usage()
        info = p.BookieInfo(
            bookie_id=self._bookie_id,
            state="read_only" if usage.read_only else "writable",
            used_fraction=usage.used_fraction,
            free_bytes=usage.free_bytes,
            total_bytes=usage.total_bytes,
            features=FEATURES,
        )
        return p.encode_response(p.InfoResponse(req.request_id, info))

    async def _list_ledgers(self, req: p.ListLedgersRequest) -> bytes:
        ledgers = tuple(self._storage.ledgers())
        return p.encode_response(p.ListLedgersResponse(req.request_id, ledgers))

    async def _list_entries(self, req: p.ListEntriesRequest) -> bytes:
        await self._gate.check_read(req.ledger_id, req.master_key)
        entries = tuple(await self._storage.entries(req.ledger_id))
        return p.encode_response(p.ListEntriesResponse(req.request_id, req.ledger_id, entries))

    async def _list_damaged(self, req: p.ListDamagedRequest) -> bytes:
        return p.encode_response(damaged_page(req, self._storage.damaged_entries()))

    async def _entry_checksums(self, req: p.EntryChecksumsRequest) -> bytes:
        """CRC32C and length of each stored blob of ``req``'s range that reads intact;
        the ids whose read fails a checksum. Stops after CHECKSUM_RANGE_ENTRIES_MAX
        entries or CHECKSUM_READ_BYTES_MAX bytes read.

        The read decides, not storage's damaged marks: a repaired entry is served intact
        (from memory) before the checkpoint that clears its mark, and a marked entry
        fails its read (storage's contract), so both answer what a reader would get."""
        storage = self._storage
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
        resp = p.EntryChecksumsResponse(
            req.request_id, ledger_id, covered, tuple(sums), tuple(damaged)
        )
        return p.encode_response(resp)


def _io_error(req: p.Request, op: p.Op, exc: Exception) -> tuple[bytes, str]:
    error = IOFailureError(f"{type(exc).__name__}: {exc}")
    return p.encode_error(req.request_id, op, error), "IO"


def damaged_page(
    req: p.ListDamagedRequest, damaged: list[tuple[int, int]]
) -> p.ListDamagedResponse:
    """One LIST_DAMAGED answer: the sorted ``damaged`` pairs from the request's start."""
    start = bisect.bisect_left(damaged, (req.from_ledger_id, req.from_entry_id))
    page = damaged[start : start + p.DAMAGED_PAGE_ENTRIES_MAX]
    end = start + len(page)
    next_from = damaged[end] if end < len(damaged) else None
    return p.ListDamagedResponse(req.request_id, tuple(page), next_from)


def piggyback_bytes(req: p.ReadLacRequest, frame_bytes_max: int) -> int:
    """How many bytes of entries a long poll's answer may carry: what the reader asked
    for, kept well inside one response frame."""
    return min(req.piggyback_bytes_max, frame_bytes_max // 2)


def encode_lac_answer(req: p.ReadLacRequest, result: LacResult) -> bytes:
    """The READ_LAC response frame for ``result``, in the form the request asked for."""
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


def is_fatal(req: p.Request, exc: BooklineError) -> bool:
    """An I/O failure on a path that ends in a journal fsync (ADD, fencing) means
    durability is gone; an invariant violation means a bug. Either way: fail stop."""
    if isinstance(exc, InvariantViolation):
        return True
    if not isinstance(exc, IOFailureError):
        return False
    return type(req) is p.AddRequest or (type(req) is p.ReadRequest and req.fence)
