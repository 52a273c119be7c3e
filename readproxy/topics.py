"""Topic partitions read by offset: the thin-client consumers' fetch route.

``GET /v1/topics/{topic}/partitions/{p}/offsets?at=earliest|latest|time:MS`` answers
``{"offset": N}``: the first offset kept, the end offset (the next record's), or the
first record's at or after a time (the end offset when none is yet).

``GET /v1/topics/{topic}/partitions/{p}/records?offset=N&limit=M&wait_ms=W`` answers
the records of partition stream ``topic~p`` from offset ``N`` (its sequence id) and
the offset to continue from (bodies: :mod:`httpapi.partitions`). ``wait_ms > 0`` makes
it a long poll: at the end of the partition it answers as soon as a record arrives, or
empty after ``wait_ms``.

Pages are read by the read core (:func:`serving.read.partitions.read_partition`: one
kept private reader per consumer, ``OUT_OF_RANGE`` (40) for an offset past the end or
truncated); this module decodes the request and encodes the records as rows without a
per-record object (:func:`httpapi.partitions.rows_of`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from aiohttp import web

from foundation.errors import BadRequestError
from foundation.names import PARTITIONS_MAX, validate_name
from groups.offsets import offset_at
from httpapi import wire
from httpapi.partitions import encode_page, rows_of
from httpapi.server import respond
from serving.read.partitions import read_partition

if TYPE_CHECKING:
    from readproxy.config import ReadProxyConfig
    from serving.read.pages import Pages

__all__ = ["add_routes", "query_int"]

# Records one page answers by default (a consumer asks for more).
PAGE_RECORDS_DEFAULT: Final = 500


def add_routes(app: web.Application, pages: Callable[[], Pages], config: ReadProxyConfig) -> None:
    """Register the partition routes on ``app``; ``pages`` gives the started proxy's
    read core (namespace, reader pool, settings, metrics)."""

    async def read(request: web.Request) -> web.Response:
        return await _read_partition(request, pages(), config)

    async def lookup(request: web.Request) -> web.Response:
        return await _lookup_offset(request, pages())

    base = f"{wire.API_PREFIX}/topics/{{topic}}/partitions/{{partition}}"
    app.router.add_get(f"{base}/records", read)
    app.router.add_get(f"{base}/offsets", lookup)


async def _read_partition(request: web.Request, pages: Pages, cfg: ReadProxyConfig) -> web.Response:
    topic = validate_name(request.match_info["topic"], "topic")
    partition = _path_int(request, "partition", PARTITIONS_MAX - 1)
    if "offset" not in request.query:
        raise BadRequestError("query parameter offset is required")
    offset = query_int(request, "offset", 0, 2**63 - 1)
    limit = query_int(request, "limit", PAGE_RECORDS_DEFAULT, cfg.read_records_max) or 1
    wait_ms = query_int(request, "wait_ms", 0, cfg.long_poll_ms_max)
    recs = await read_partition(pages, topic, partition, offset, limit=limit, wait_s=wait_ms / 1000)
    rows = rows_of(recs)
    media = wire.negotiate(request.headers.get("Accept"))
    # The next page starts after the last row (a compacted partition's offsets skip).
    body = encode_page(rows, rows[-1][0] + 1 if rows else offset, media)
    return web.Response(body=body, content_type=media)


async def _lookup_offset(request: web.Request, pages: Pages) -> web.Response:
    topic = validate_name(request.match_info["topic"], "topic")
    partition = _path_int(request, "partition", PARTITIONS_MAX - 1)
    at = request.query.get("at", "latest")
    offset = await offset_at(pages.ns, topic, partition, at)
    return respond(request, {"offset": offset})


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
