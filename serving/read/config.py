"""The read core's settings: only what the feeds, the reader pool and the pages use.

A front end builds one from its own configuration (the read proxy:
:meth:`readproxy.config.ReadProxyConfig.read_config`); limits of a protocol's requests
(records per answer, the longest long poll, WebSocket frames) stay with the front end.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from foundation.errors import ConfigError
from foundation.limits import MiB

__all__ = ["ReadConfig"]


@dataclass(frozen=True, slots=True)
class ReadConfig:
    # Bytes one page answers at most (a few big records stop a page early).
    read_bytes_max: int = 8 * MiB
    # A read that found no record yet waits this long more for its reader to get one or
    # to reach the stream's end; then it fails with TIMEOUT (retriable), never an empty
    # page for records not read yet.
    range_read_timeout_ms: int = 5_000
    # Shared tail feeds (one core reader per hot stream) and each one's cache.
    feeds_max: int = 256
    feed_records_max: int = 50_000
    feed_bytes_max: int = 32 * MiB
    # All feeds' caches together.
    cache_bytes_max: int = 512 * MiB
    # A feed nobody read from for this long is closed.
    feed_idle_ms: int = 30_000
    # Private readers (catch-up and range reads), kept for the next page of the same
    # reader, closed after idling this long.
    private_readers_max: int = 256
    private_reader_idle_ms: int = 10_000

    def __post_init__(self) -> None:
        for field in fields(self):
            if getattr(self, field.name) <= 0:
                raise ConfigError(f"read core: {field.name} must be positive")
        if self.cache_bytes_max < self.feed_bytes_max:
            raise ConfigError("read core: cache_bytes_max must be >= feed_bytes_max")
