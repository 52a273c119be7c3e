"""The read proxy's settings: ``[readproxy]`` of a TOML file, ``BOOKLINE_READPROXY_*``
environment variables, then flags (see :func:`foundation.config.load_config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from foundation.errors import ConfigError
from httpapi.proxy_config import MiB, ProxyConfig
from serving.read.config import ReadConfig


@dataclass(frozen=True, slots=True)
class ReadProxyConfig(ProxyConfig):
    SECTION: ClassVar[str] = "readproxy"

    # Unique id; registered as proxies/read@<id> so clients can discover read proxies.
    proxy_id: str = "rp-1"
    port: int = 8490
    # Records one read answers at most (bounds the answer's size and the work).
    read_records_max: int = 10_000
    # Bytes one read answers at most (a few big records stop a page early).
    read_bytes_max: int = 8 * MiB
    # Longest long poll a client may ask for.
    long_poll_ms_max: int = 30_000
    # A read that found no record yet waits this long more for its reader to get one or
    # to reach the stream's end; then it fails with TIMEOUT (retriable), never an
    # empty page for records not read yet (below the thin client's request timeout).
    range_read_timeout_ms: int = 5_000
    # Shared tail feeds (one core reader per hot stream) and their caches.
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
    # WebSocket tails: records per frame, tails at once.
    ws_frame_records_max: int = 1_000
    websockets_max: int = 10_000

    def __post_init__(self) -> None:
        self.check_common()
        self.require_positive(
            "read_records_max",
            "read_bytes_max",
            "long_poll_ms_max",
            "feeds_max",
            "feed_records_max",
            "feed_bytes_max",
            "cache_bytes_max",
            "feed_idle_ms",
            "private_readers_max",
            "private_reader_idle_ms",
            "ws_frame_records_max",
            "websockets_max",
            "range_read_timeout_ms",
        )
        if self.cache_bytes_max < self.feed_bytes_max:
            raise ConfigError("readproxy.cache_bytes_max must be >= feed_bytes_max")

    def read_config(self) -> ReadConfig:
        """The read core's settings (:mod:`serving.read`), taken from these."""
        return ReadConfig(
            read_bytes_max=self.read_bytes_max,
            range_read_timeout_ms=self.range_read_timeout_ms,
            feeds_max=self.feeds_max,
            feed_records_max=self.feed_records_max,
            feed_bytes_max=self.feed_bytes_max,
            cache_bytes_max=self.cache_bytes_max,
            feed_idle_ms=self.feed_idle_ms,
            private_readers_max=self.private_readers_max,
            private_reader_idle_ms=self.private_reader_idle_ms,
        )
