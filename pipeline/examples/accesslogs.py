"""A deterministic web access-log generator (Common Log Format) and its stream writer.

Lines look like ``203.0.113.9 - - [22/Nov/2026:10:04:31 +0000] "GET /cart HTTP/1.1" 200
5120``. Event times are spread evenly over ``minutes`` minutes from ``start_ms`` so the
per-minute aggregates are predictable; the record's txid is the event time (ms) and its
key the client address. :func:`generate` is pure; :func:`write_logs` does the I/O.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streams.records import LogRecord

if TYPE_CHECKING:
    from streams.sync import SyncNamespace

__all__ = ["AccessLog", "flush_line", "generate", "write_logs"]

# Paths and statuses with skewed weights, so "top paths" has a clear answer.
PATHS = (
    ("/", 30),
    ("/products", 20),
    ("/cart", 12),
    ("/checkout", 8),
    ("/search", 15),
    ("/login", 6),
    ("/static/app.js", 25),
    ("/static/logo.png", 18),
    ("/api/orders", 9),
)
STATUSES = ((200, 80), (304, 8), (404, 6), (500, 2), (302, 4))
METHODS = (("GET", 90), ("POST", 10))
# Records per write_many call of the generator.
WRITE_BATCH_RECORDS = 1_000
# The flush line's event time is this far after the last line, past every watermark.
FLUSH_AFTER_MS = 10 * 60_000
FLUSH_PATH = "/__flush__"


@dataclass(frozen=True, slots=True)
class AccessLog:
    client: str
    time_ms: int
    method: str
    path: str
    status: int
    size_bytes: int

    def line(self) -> str:
        when = dt.datetime.fromtimestamp(self.time_ms / 1000, dt.UTC)
        stamp = when.strftime("%d/%b/%Y:%H:%M:%S +0000")
        return (
            f'{self.client} - - [{stamp}] "{self.method} {self.path} HTTP/1.1" '
            f"{self.status} {self.size_bytes}"
        )


def _pick(rng: random.Random, table: tuple[tuple[object, int], ...]) -> object:
    return rng.choices([v for v, _w in table], weights=[w for _v, w in table])[0]


def generate(count: int, *, seed: int, start_ms: int, minutes: int) -> Iterator[AccessLog]:
    """``count`` access logs with event times evenly over ``minutes`` from ``start_ms``."""
    rng = random.Random(seed)
    span_ms = minutes * 60_000
    for i in range(count):
        yield AccessLog(
            client=f"198.51.100.{rng.randrange(1, 255)}",
            time_ms=start_ms + i * span_ms // max(1, count),
            method=str(_pick(rng, METHODS)),
            path=str(_pick(rng, PATHS)),
            status=int(str(_pick(rng, STATUSES))),
            size_bytes=rng.randrange(200, 20_000),
        )


def flush_line(last_ms: int) -> AccessLog:
    """A line far after the others: it moves the streaming job's watermark past the last
    minute so that minute is emitted; the job drops it from every result."""
    return AccessLog("0.0.0.0", last_ms + FLUSH_AFTER_MS, "GET", FLUSH_PATH, 200, 0)


def write_logs(ns: SyncNamespace, stream: str, logs: Iterator[AccessLog]) -> int:
    """Append ``logs`` to ``stream`` (created if missing); returns the records written."""
    if not ns.exists(stream):
        ns.create_stream(stream)
    writer = ns.open_writer(stream, identity="access-log-generator")
    written = 0
    try:
        batch: list[LogRecord] = []
        for log in logs:
            batch.append(LogRecord(log.line().encode(), txid=log.time_ms, key=log.client.encode()))
            if len(batch) >= WRITE_BATCH_RECORDS:
                writer.write_many(batch)
                written += len(batch)
                batch = []
        if batch:
            writer.write_many(batch)
            written += len(batch)
    finally:
        writer.close()
    return written
