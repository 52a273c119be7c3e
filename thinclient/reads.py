"""The thin client's reads: a page of records from a read proxy, and a WebSocket tail
that follows a stream across read proxy failures (it resumes where it stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Final

import aiohttp

from foundation.backoff import Backoff
from foundation.errors import BadRequestError, BooklineError
from httpapi import recordsets, wire
from httpapi.partitions import PartitionRow, decode_page
from httpapi.positions import format_dlsn, parse_dlsn, parse_position
from httpapi.views import record_from_view
from streams.dlsn import DLSN, PositionKind, StartPosition
from streams.records import ReadRecord
from streams.recordset import decode_verified, verify_record_set
from thinclient.transport import Transport

log = logging.getLogger(__name__)

__all__ = [
    "PartitionPage",
    "catch_up",
    "commit_subscription",
    "decode_sets",
    "list_subscribers",
    "partition_offset",
    "position_text",
    "read_page",
    "read_partition",
    "read_subscription",
    "stream_path",
    "tail",
]


@dataclass(frozen=True, slots=True)
class ReadPage:
    records: list[ReadRecord]
    next: str  # position to continue from ("seq:N")


# A start position as the read proxies' ``from=`` names it (httpapi.positions).
_KIND_TEXT: Final = {
    PositionKind.SEQUENCE: "seq",
    PositionKind.TXID: "txid",
    PositionKind.TIMESTAMP: "time",
}


def position_text(start: StartPosition | DLSN | str) -> str:
    """``start`` as the HTTP API's text: the core library's positions (StartPosition,
    DLSN) are the thin client's too; text passes through (checked by the caller)."""
    if isinstance(start, str):
        return start
    if isinstance(start, DLSN):
        return f"dlsn:{start}"
    if start.kind is PositionKind.EARLIEST or start.kind is PositionKind.LATEST:
        return str(start.kind.value)
    if start.kind is PositionKind.DLSN:
        return f"dlsn:{start.dlsn_value}"
    return f"{_KIND_TEXT[start.kind]}:{start.value}"


def stream_path(stream: str, suffix: str = "") -> str:
    return f"{wire.API_PREFIX}/streams/{stream}{suffix}"


async def read_page(
    transport: Transport, stream: str, start: str, limit: int, wait_ms: int
) -> ReadPage:
    """A page of records from ``start``; ``wait_ms`` long-polls for the first record."""
    parse_position(start)  # fail early on a bad position
    query = f"?from={start}&limit={limit}&wait_ms={wait_ms}"
    timeout = transport.config.request_timeout_ms / 1000 + wait_ms / 1000
    obj = await transport.call(
        "GET", stream_path(stream, "/records") + query, None, read=True, timeout_s=timeout
    )
    raw = obj.get("records")
    if not isinstance(raw, list):
        raise BadRequestError("read answer without records")
    return ReadPage([record_from_view(stream, r) for r in raw], str(obj.get("next", start)))


async def tail(transport: Transport, stream: str, start: str) -> AsyncGenerator[ReadRecord, None]:
    """Every record from ``start`` on, following the stream over a WebSocket; a broken
    tail resumes on a read proxy (backoff with full jitter) at the next position."""
    parse_position(start)
    cfg = transport.config
    proxies = transport.directory
    position = start
    backoff = Backoff(cfg.retry_backoff(deadline=False), rng=transport.rng)
    while True:
        url = proxies.read_url()
        ws_url = url.replace("http", "ws", 1) + stream_path(stream, "/tail") + f"?from={position}"
        try:
            async with transport.session.ws_connect(ws_url, heartbeat=30.0, max_msg_size=0) as ws:
                backoff.reset()
                async for msg in ws:
                    if msg.type is aiohttp.WSMsgType.BINARY:
                        obj = wire.decode_body(msg.data, wire.MSGPACK)
                    elif msg.type is aiohttp.WSMsgType.TEXT:
                        obj = wire.decode_body(msg.data.encode(), wire.JSON)
                    else:
                        break
                    if "error" in obj:
                        raise wire.decode_error(obj["error"], 500)
                    for r in obj.get("records", []):
                        yield record_from_view(stream, r)
                    position = str(obj.get("next", position))
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status < 500:
                raise BadRequestError(f"tail of {stream} refused: HTTP {exc.status}") from exc
            proxies.mark_down(url)
        except (aiohttp.ClientError, OSError) as exc:
            log.info("tail of %s via %s broke (%s); resuming at %s", stream, url, exc, position)
            proxies.mark_down(url)
        await backoff.sleep()
        await proxies.discover(force=True)


# -- catch-up by record sets (issue 17) -------------------------------------------------

#: Bytes of record sets a catch-up request asks for (the read proxy caps it too).
CATCH_UP_BYTES: Final = 4 << 20


def decode_sets(stream: str, body: bytes) -> tuple[list[ReadRecord], int, bool]:
    """The records of a ``/recordsets`` answer (every checksum verified: the body's and
    each set's), the sequence id to continue from (-1: the same position) and whether
    the stream ended."""
    frames, next_seq = recordsets.decode(body)
    out: list[ReadRecord] = []
    ended = False
    for f in frames:
        header, raw = verify_record_set(f.payload)
        recs, eos = decode_verified(header, raw, stream, f.segment_seqno, f.entry_id,
                                    f.start_sequence_id, f.from_slot)  # fmt: skip
        out.extend(recs)
        ended = ended or eos
    return out, next_seq, ended


async def _sets_body(transport: Transport, stream: str, start: str, wait_ms: int) -> bytes:
    query = f"?from={start}&bytes_max={CATCH_UP_BYTES}&wait_ms={wait_ms}"
    timeout = transport.config.request_timeout_ms / 1000 + wait_ms / 1000
    obj = await transport.call(
        "GET", stream_path(stream, "/recordsets") + query, None, read=True, timeout_s=timeout
    )
    body = obj.get("recordsets")
    if not isinstance(body, bytes):
        raise BadRequestError("catch-up answer without record sets")
    return body


async def catch_up(
    transport: Transport, stream: str, start: str, wait_ms: int
) -> AsyncGenerator[list[ReadRecord], None]:
    """Batches of records from ``start`` on, read as record sets (nothing is decoded
    or re-encoded by the read proxy); the next request is on its way while a batch is
    decoded and handed out. Ends at the end of the stream; past the written end it
    long-polls ``wait_ms`` per request and yields empty batches meanwhile."""
    parse_position(start)
    position = start
    loop = asyncio.get_running_loop()
    pending = loop.create_task(_sets_body(transport, stream, position, wait_ms))
    try:
        while True:
            body = await pending
            frames_next = recordsets.decode(body)[1]  # cheap: framing only, then ask on
            if frames_next >= 0:
                position = f"seq:{frames_next}"
            pending = loop.create_task(_sets_body(transport, stream, position, wait_ms))
            records, _next, ended = decode_sets(stream, body)
            yield records
            if ended:
                return
    finally:
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, BooklineError):
            await pending


# -- topic partitions by offset, and core subscriptions (issue 14) ----------------------


@dataclass(frozen=True, slots=True)
class PartitionPage:
    """Records of one topic partition: ``rows`` are ``(offset, timestamp_ms, key,
    value, headers, timestamp_type)`` with contiguous offsets (:mod:`httpapi.partitions`)."""

    rows: list[PartitionRow]
    next_offset: int  # where the next page starts


async def read_partition(
    transport: Transport, topic: str, partition: int, offset: int, *, limit: int, wait_ms: int
) -> PartitionPage:
    """Records of partition ``partition`` of ``topic`` from ``offset`` (a read proxy's
    ``/v1/topics/{t}/partitions/{p}/records``); ``wait_ms`` long-polls at the end.
    OutOfRangeError when ``offset`` is past the end or truncated."""
    path = (
        f"{wire.API_PREFIX}/topics/{topic}/partitions/{partition}/records"
        f"?offset={offset}&limit={limit}&wait_ms={wait_ms}"
    )
    timeout = transport.config.request_timeout_ms / 1000 + wait_ms / 1000
    obj = await transport.call("GET", path, None, read=True, timeout_s=timeout)
    rows, nxt = decode_page(obj)
    return PartitionPage(rows, nxt)


async def partition_offset(transport: Transport, topic: str, partition: int, at: str) -> int:
    """``at`` = ``earliest`` (the first offset kept), ``latest`` (the end offset) or
    ``time:MS`` (the first record written at or after MS; the end offset if none)."""
    path = f"{wire.API_PREFIX}/topics/{topic}/partitions/{partition}/offsets?at={at}"
    obj = await transport.call("GET", path, None, read=True)
    offset = obj.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise BadRequestError(f"offset lookup answer without an offset: {obj!r}")
    return offset


def _subscription_path(stream: str, subscriber: str | None = None) -> str:
    return stream_path(stream, "/subscriptions" + (f"/{subscriber}" if subscriber else ""))


async def read_subscription(transport: Transport, stream: str, subscriber: str) -> DLSN | None:
    """A core subscription's committed position (None: it never committed)."""
    obj = await transport.call("GET", _subscription_path(stream, subscriber), None, read=True)
    raw = obj.get("dlsn")
    return None if raw is None else DLSN(*parse_dlsn(str(raw)))


async def commit_subscription(
    transport: Transport, stream: str, subscriber: str, dlsn: DLSN
) -> bool:
    """Advance a core subscription to ``dlsn``; False when it was already there or past."""
    body = wire.encode_body({"dlsn": format_dlsn(dlsn)}, wire.MSGPACK)
    obj = await transport.call("POST", _subscription_path(stream, subscriber), body, read=True)
    return bool(obj.get("advanced"))


async def list_subscribers(transport: Transport, stream: str) -> list[str]:
    obj = await transport.call("GET", _subscription_path(stream), None, read=True)
    return [str(s) for s in obj.get("subscribers", [])]
