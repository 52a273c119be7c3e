"""The write core's settings: only what the core itself uses. A front end builds it
from its own configuration (``writeproxy.config.WriteProxyConfig.write_config``),
which is where they are loaded, documented and checked against the front end's own
limits (request sizes)."""

from __future__ import annotations

from dataclasses import dataclass

from foundation.errors import ConfigError

__all__ = ["WriteConfig"]


@dataclass(frozen=True, slots=True)
class WriteConfig:
    # The namespace whose streams this process owns.
    namespace: str
    # This process's id: owner records and writer locks name it.
    proxy_id: str
    # One record's payload+key+headers (foundation.limits.record_bytes); bigger -> 413.
    record_bytes_max: int
    # In-flight limits (batches being written): per stream and for the process -> 429.
    stream_inflight_bytes_max: int
    stream_inflight_requests_max: int
    proxy_inflight_bytes_max: int
    proxy_inflight_requests_max: int
    # Streams owned at most (each holds a writer and a ZooKeeper lock).
    streams_owned_max: int
    # Create a stream on its first write instead of answering NOT_FOUND.
    auto_create_streams: bool
    # Retries within this window of the original write are recognised after failover
    # (the new owner scans this much of the log's tail) ...
    dedup_window_ms: int
    # ... but never more records than this.
    dedup_scan_records_max: int
    # Remembered batches per producer, and producers per stream (LRU).
    dedup_batches_per_producer: int
    dedup_producers_max: int
    # How long a producer's request ahead of its next expected sequence waits for the gap.
    reorder_wait_ms: int
    # How long a write waits for ZooKeeper + recovery when acquiring a stream.
    acquire_timeout_ms: int

    def __post_init__(self) -> None:
        # The front end's loader names its own settings in its errors; these guard the
        # core's assumptions for any front end.
        if self.proxy_inflight_bytes_max < self.stream_inflight_bytes_max:
            raise ConfigError("write core: proxy_inflight_bytes_max < stream_inflight_bytes_max")
        if self.proxy_inflight_requests_max < self.stream_inflight_requests_max:
            raise ConfigError(
                "write core: proxy_inflight_requests_max < stream_inflight_requests_max"
            )
        for name in (
            "record_bytes_max",
            "stream_inflight_requests_max",
            "streams_owned_max",
            "dedup_batches_per_producer",
            "dedup_producers_max",
            "acquire_timeout_ms",
            "reorder_wait_ms",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"write core: {name} must be > 0")
