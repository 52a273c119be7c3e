"""Topic partitions read by offset: the thin-client consumers' fetch route.

``GET /v1/topics/{topic}/partitions/{p}/offsets?at=earliest|latest|time:MS`` answers
``{"offset": N}``: the first offset kept, the end offset (the next record's), or the
first record's at or after a time (the end offset when none is yet).

``GET /v1/topics/{topic}/partitions/{p}/records?offset=N&limit=M&wait_ms=W`` answers
the records of partition stream ``topic~p`` from offset ``N`` (its sequence id) and
the offset to continue from (bodies: :mod:`httpapi.partitions`). ``wait_ms > 0`` makes
it a long poll: at the end of the partition it answers as soon as a record arrives, or
empty after ``wait_ms``.

A consumer reads its partition forward page after page, so each page is served by the
private reader the previous page ended with (:class:`~readproxy.readers.ReaderPool`,
keyed by the next offset): its read-ahead keeps fetching from the bookies while the
consumer works, and only the first page of a consumer opens a reader. Opening one
checks the offset against the partition first: past the end offset, or before the
first offset still kept (truncated), answers ``OUT_OF_RANGE`` (40) -- a consumer then
applies its ``auto_offset_reset`` -- instead of a reader that would start elsewhere.
Records are handed on as rows without a per-record object (:func:`rows_of`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from aiohttp import web

from foundation.errors import BadRequestError
from foundation.invariants import invariant
from foundation.names import PARTITIONS_MAX, partition_stream, validate_name
from groups.fetchers import check_offset, offset_at
from httpapi import wire
from httpapi.partitions import encode_page, rows_of
from httpapi.server import respond
from streams.dlsn import StartPosition
from streams.records import ReadRecord

if TYPE_CHECKING:
    from readproxy.pages import Pages

__all__ = ["add_routes", "query_int"]

# A ReadRecord is a tuple: [7] is its payload, [8] its key.
_VALUE: Final = operator.itemgetter(7)
_KEY: Final = operator.itemgetter(8)
# Records one page answers by default (a consumer asks for more).
PAGE_RECORDS_DEFAULT: Final = 500


def add_routes(app: web.Application, pages: Callable[[], Pages]) -> None:
    """Register the partition route on ``app``; ``pages`` gives the started proxy's
    reads (namespace, reader pool, settings, metrics)."""

    async def read_partition(request: web.Request) -> web.Response:
        return await _read_partition(request, pages())

    async def lookup(request: web.Request) -> web.Response:
        return await _lookup_offset(request, pages())

    base = f"{wire.API_PREFIX}/topics/{{topic}}/partitions/{{partition}}"
    app.router.add_get(f"{base}/records", read_partition)
    app.router.add_get(f"{base}/offsets", lookup)


async def _read_partition(request: web.Request, pages: Pages) -> web.Response:
    cfg = pages.config
    topic = validate_name(request.match_info["topic"], "topic")
    partition = _path_int(request, "partition", PARTITIONS_MAX - 1)
    name = partition_stream(topic, partition)
    if "offset" not in request.query:
        raise BadRequestError("query parameter offset is required")
    offset = query_int(request, "offset", 0, 2**63 - 1)
    limit = query_int(request, "limit", PAGE_RECORDS_DEFAULT, cfg.read_records_max) or 1
    wait_ms = query_int(request, "wait_ms", 0, cfg.long_poll_ms_max)

    async def check() -> None:
        await check_offset(pages.ns, topic, partition, offset)

    recs = await pages.pool.read(
        name, StartPosition.sequence(offset), limit, wait_ms / 1000, before_open=check
    )
    if recs:
        # Offsets are contiguous from the asked one (the reader never skips: it was
        # opened without skip_truncated, and sequence ids have no holes).
        invariant(
            recs[0][4] == offset and recs[-1][4] == offset + len(recs) - 1,
            "partition %s page from %d holds offsets %d..%d for %d records",
            name, offset, recs[0][4], recs[-1][4], len(recs),
        )  # fmt: skip
    rows = rows_of(_within_bytes(recs, cfg.read_bytes_max))
    pages.metrics.count_served("partition", name, len(rows))
    media = wire.negotiate(request.headers.get("Accept"))
    body = encode_page(rows, offset + len(rows), media)
    return web.Response(body=body, content_type=media)


async def _lookup_offset(request: web.Request, pages: Pages) -> web.Response:
    topic = validate_name(request.match_info["topic"], "topic")
    partition = _path_int(request, "partition", PARTITIONS_MAX - 1)
    at = request.query.get("at", "latest")
    offset = await offset_at(pages.ns, topic, partition, at)
    return respond(request, {"offset": offset})


def _within_bytes(recs: list[ReadRecord], bytes_max: int) -> list[ReadRecord]:
    """The leading records within ``bytes_max`` of values and keys (at least one). A
    page cut short leaves its reader parked at the wrong offset, so the next page opens
    another: the price of pages of very large records only. The sizes are summed in C
    first (a per-record Python loop was 10 % of a page's CPU in py-spy)."""
    values = list(map(len, map(_VALUE, recs)))
    keys = sum(map(len, filter(None, map(_KEY, recs))))
    if sum(values) + keys <= bytes_max:
        return recs
    size = 0
    for i, r in enumerate(recs):
        size += values[i] + len(r[8] or b"")
        if size > bytes_max and i > 0:
            return recs[:i]
    return recs


def _path_int(request: web.Request, key: str, hi: int) -> int:
    raw = request.match_info[key]
    if not raw.isascii() or not raw.isdigit() or int(raw) > hi:
        raise BadRequestError(f"{key} must be an integer within 0..{hi}, got {raw!r}")
    return int(raw)


def query_int(request: web.Request, key: str, default: int, hi: int) -> int:
    raw = request.query.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise BadRequestError(f"query parameter {key} must be an integer") from exc
    if not 0 <= value <= hi:
        raise BadRequestError(f"query parameter {key} must be within 0..{hi}")
    return value
