"""Fetch and ListOffsets: partition streams read by offset through the read core.

A partition's offsets are its stream's sequence ids, so a fetch at offset N is the read
core's fetch page at N (:func:`serving.read.partitions.fetch_partition`: from the
partition's feed when it covers N, else a kept private reader per consumer position;
OFFSET_OUT_OF_RANGE past the end or before the first offset kept). The asked partitions
are read at once. Each one's records go back as one record batch v2 whose offsets are
the stored ones (uncompressed: the consumer saves the CPU, loopback and LAN links the
bytes), encoded from the records' columns -- a catch-up read's cut straight from the
stored record sets (kafkaapi.fetch_sets). The high watermark is the partition's end
offset as of the LAC; the log start offset its first kept record's.

``max_wait_ms``: when no asked partition has a record at its offset, the fetch waits
on the partitions' shared feeds (one core reader per tailed partition, however many
consumers tail it) until one has, or the time is up, then reads once more.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from foundation.errors import BooklineError, NotFoundError
from foundation.names import partition_stream
from kafkaapi.brokers import BrokerView
from kafkaapi.errormap import kafka_code
from kafkaapi.fetch_sets import records_batch, sets_batch
from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.errors import KafkaProtocolError
from serving.read.partitions import fetch_partition

if TYPE_CHECKING:
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request
    from serving.read.pages import Pages
    from streams.namespace import Namespace

__all__ = ["fetch", "list_offsets"]

# Records one partition's answer from a feed holds at most (the byte limits usually stop
# it first; a catch-up read's whole record sets are bounded by their bytes alone).
PARTITION_RECORDS_MAX: Final = 10_000
# The longest long poll served (a client asking more gets this much).
FETCH_WAIT_MS_MAX: Final = 30_000
_DENIED: Final = kerr.code_named("TOPIC_AUTHORIZATION_FAILED")
_INVALID: Final = kerr.code_named("INVALID_REQUEST")
_LATEST: Final = -1
_EARLIEST: Final = -2
_MAX_TIMESTAMP: Final = -3


async def fetch(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    asked = [
        (t["topic"], p["partition"], p["fetch_offset"], p["partition_max_bytes"])
        for t in body["topics"]
        for p in t["partitions"]
    ]
    pages = serving.pages()
    followers = await _followers(serving, request, asked)
    if followers:  # KIP-392: the consumer fetches from the read proxies instead
        answers = await _read_all(serving, session, pages, asked, 0)
        for answer, follower in zip(answers, followers, strict=True):
            answer["preferred_read_replica"] = follower
    else:
        answers = await _serve(serving, session, pages, asked, body)
    it = iter(answers)
    responses = [
        {"topic": t["topic"], "partitions": [next(it) for _ in t["partitions"]]}
        for t in body["topics"]
    ]
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": responses}


async def _serve(
    serving: KafkaServing,
    session: Session,
    pages: Pages,
    asked: list[tuple[str, int, int, int]],
    body: dict[str, Any],
) -> list[dict[str, Any]]:
    budget = max(1, body["max_bytes"])
    answers = await _read_all(serving, session, pages, asked, budget)
    wait_ms = min(max(0, body["max_wait_ms"]), FETCH_WAIT_MS_MAX)
    idle = not any(a.get("records") for a in answers)
    if wait_ms and idle and await _wait_any(pages, asked, answers, wait_ms / 1000):
        answers = await _read_all(serving, session, pages, asked, budget)
    return answers


async def _followers(
    serving: KafkaServing, request: Request, asked: list[tuple[str, int, int, int]]
) -> list[int]:
    """Each partition's preferred read replica when a write proxy is asked by a
    rack-aware consumer (v11+ with a ``rack_id``) and read proxies serve Kafka; else []
    (this broker answers). Read proxies have no racks of their own: any rack given
    means "fetch from a follower", so catch-up reads leave the owners alone."""
    if serving.write is None or request.version < 11 or not request.body["rack_id"]:
        return []
    view = await BrokerView.load(serving.md, serving.registration())
    if not view.readers:
        return []
    return [view.follower(partition_stream(topic, index)) for topic, index, _, _ in asked]


async def _read_all(
    serving: KafkaServing,
    session: Session,
    pages: Pages,
    asked: list[tuple[str, int, int, int]],
    budget: int,
) -> list[dict[str, Any]]:
    """Every asked partition's answer, within ``budget`` bytes in all (the first
    partition with records gets at least one, as Kafka's broker does). The partitions
    are read all at once, their ends (kafkaapi.fetch_ends) beside them: one after
    another, each read waited for its bookies while the others' were idle."""
    allowed = [serving.allowed(session, "consume", "topic", t) for t, _, _, _ in asked]
    looked_up = [(t, i) for (t, i, _, _), ok in zip(asked, allowed, strict=True) if ok]
    ends = serving.ends
    infos = asyncio.ensure_future(asyncio.gather(*(ends.get(pages, t, i) for t, i in looked_up)))
    try:
        reads = await _read_within(pages, asked, allowed, budget)
        found = iter(await infos)
    finally:
        infos.cancel()  # a no-op once done; else (a read was cancelled) stop the look-ups
    out = []
    for (_, index, _, _), ok, read in zip(asked, allowed, reads, strict=True):
        out.append(_answer(index, read, next(found)) if ok else _denied(index))
    return out


async def _read_within(
    pages: Pages, asked: list[tuple[str, int, int, int]], allowed: list[bool], budget: int
) -> list[_Read | BooklineError]:
    """The allowed partitions' reads within ``budget``: those whose limits fit in it
    (in the asked order) at once, then any left out, in order, with what the first
    ones left of it (all of them at once when the limits fit, as librdkafka's do:
    1 MiB a partition of 50 MiB)."""
    shares = []
    for (_, _, _, bytes_max), ok in zip(asked, allowed, strict=True):
        share = min(bytes_max, budget) if ok else 0
        shares.append(share)
        budget -= share
    reads: list[_Read | BooklineError] = list(
        await asyncio.gather(*(
            _records(pages, topic, index, offset, share)
            for (topic, index, offset, _), share in zip(asked, shares, strict=True)
        ))
    )  # fmt: skip
    left = sum(shares) + budget - sum(len(r.batch) for r in reads if isinstance(r, _Read))
    for i, ((topic, index, offset, bytes_max), ok) in enumerate(zip(asked, allowed, strict=True)):
        if ok and not shares[i] and left > 0:
            read = await _records(pages, topic, index, offset, min(bytes_max, left))
            reads[i] = read
            left -= len(read.batch) if isinstance(read, _Read) else 0
    return reads


class _Read(NamedTuple):
    """A partition's record batch read (b"": none) and the offset after its records
    (-1: not read). The partition ends no earlier than that offset: a read checks its
    offset against the end when it opens its reader (OFFSET_OUT_OF_RANGE)."""

    batch: bytes
    after: int


_NONE: Final = _Read(b"", -1)


async def _records(
    pages: Pages, topic: str, index: int, offset: int, bytes_max: int
) -> _Read | BooklineError:
    if bytes_max <= 0:
        return _NONE
    try:
        recs, sets = await fetch_partition(
            pages, topic, index, offset, limit=PARTITION_RECORDS_MAX, bytes_max=bytes_max
        )
        if sets:  # a catch-up read: the batch is cut from the stored sets' columns
            return _Read(*sets_batch(sets, offset, partition_stream(topic, index)))
    except BooklineError as exc:
        return exc
    if not recs:
        return _Read(b"", offset)
    return _Read(records_batch(recs), recs[-1].sequence_id + 1)


def _failed(exc: BooklineError) -> dict[str, Any]:
    return {"error_code": kafka_code(exc).code, "high_watermark": -1, "records": b""}


def _denied(index: int) -> dict[str, Any]:
    return {"partition_index": index, "error_code": _DENIED.code, "aborted_transactions": None,
            "high_watermark": -1, "records": b""}  # fmt: skip


def _answer(
    index: int, read: _Read | BooklineError, info: tuple[int, int] | BooklineError
) -> dict[str, Any]:
    answer: dict[str, Any] = {"partition_index": index, "error_code": 0,
                              "aborted_transactions": None}  # fmt: skip
    if isinstance(read, BooklineError):
        return answer | _failed(read)
    if isinstance(info, BooklineError):
        return answer | _failed(info)
    end, start = info
    # The end last looked up may trail what was read (kafkaapi.fetch_ends); a high
    # watermark below the fetch offset would tell the consumer it is ahead of the log.
    high = max(end, read.after)
    return answer | {
        "high_watermark": high,
        "last_stable_offset": high,
        "log_start_offset": start,
        "records": read.batch,
    }


async def _wait_any(
    pages: Pages,
    asked: list[tuple[str, int, int, int]],
    answers: list[dict[str, Any]],
    wait_s: float,
) -> bool:
    """Wait until one asked partition (answered without error) has a record at its
    offset; False when the time is up first."""
    waits = []
    for (topic, index, offset, _), answer in zip(asked, answers, strict=True):
        if answer["error_code"] != 0:
            continue
        feed = await pages.feeds.open(partition_stream(topic, index), offset)
        if not feed.covers(offset):
            return True  # the feed is elsewhere: read again rather than wait on it
        waits.append(asyncio.ensure_future(feed.wait_beyond(offset, wait_s)))
    if not waits:
        return False
    try:
        done, _ = await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        return any(not t.cancelled() and t.exception() is None and t.result() for t in done)
    finally:
        for task in waits:
            task.cancel()
        for task in waits:
            with contextlib.suppress(asyncio.CancelledError, BooklineError):
                await task


async def list_offsets(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    ns = serving.ns()
    topics = []
    for topic in request.body["topics"]:
        name = topic["name"]
        parts = []
        for part in topic["partitions"]:
            answer: dict[str, Any] = {"partition_index": part["partition_index"]}
            if not serving.allowed(session, "consume", "topic", name):
                parts.append(answer | {"error_code": _DENIED.code})
                continue
            try:
                offset, stamp = await _offset(ns, name, part["partition_index"], part["timestamp"])
            except BooklineError as exc:
                parts.append(answer | {"error_code": kafka_code(exc).code})
                continue
            parts.append(answer | {"error_code": 0, "offset": offset, "timestamp": stamp,
                                   "old_style_offsets": [offset]})  # fmt: skip
        topics.append({"name": name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}


async def _offset(ns: Namespace, topic: str, index: int, at: int) -> tuple[int, int]:
    """(offset, timestamp) of ListOffsets' ``timestamp``: -1 the end offset, -2 the
    first kept, otherwise the first record at or after that time (-1, -1: none)."""
    name = partition_stream(topic, index)
    if not await ns.exists(name):
        raise NotFoundError(f"topic {topic} has no partition {index}")
    if at == _LATEST:
        return int(await ns.end_offset(name)), -1
    if at == _EARLIEST:
        return int((await ns.stream_info(name)).first_sequence_id), -1
    if at == _MAX_TIMESTAMP or at < 0:
        raise KafkaProtocolError(_INVALID, f"offset lookup {at} is not supported (docs/kafka.md)")
    record = await ns.record_at_time(name, at)
    if record is None:
        return -1, -1
    return int(record.sequence_id), int(record.timestamp_ms)
