"""The thin client's settings (:class:`ClientConfig`): timeouts, retries, batching and
buffer bounds. Frozen and checked when made."""

from __future__ import annotations

from dataclasses import dataclass

from foundation.backoff import BackoffPolicy
from foundation.config import check_bounds
from foundation.errors import ConfigError
from foundation.limits import RECORD_BYTES_MAX

__all__ = ["ClientConfig"]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    # One HTTP request's timeout (a write answers once durable: a few ms normally).
    request_timeout_ms: int = 10_000
    # Give up retrying a request after this long.
    retry_deadline_ms: int = 30_000
    # Backoff between retries: initial, doubling up to max, full jitter.
    backoff_initial_ms: int = 20
    backoff_max_ms: int = 1_000
    # OWNER_MOVED redirects followed at once per attempt before backing off.
    redirects_max: int = 5
    # A proxy that refused a connection is avoided this long.
    proxy_down_ms: int = 3_000
    # One write request carries at most this many records / bytes.
    batch_records_max: int = 10_000
    batch_bytes_max: int = 4 * 1024 * 1024
    # Bytes queued but not yet acknowledged, across streams (backpressure beyond).
    buffer_bytes_max: int = 64 * 1024 * 1024
    # A record's payload+key+headers at most (foundation.limits.record_bytes), refused
    # before sending; at most the limit every layer enforces (limits.RECORD_BYTES_MAX).
    record_bytes_max: int = RECORD_BYTES_MAX
    # HTTP connections per proxy.
    connections_per_proxy: int = 64
    # Write requests in flight per stream (like Kafka's max.in.flight.requests with an
    # idempotent producer): each carries the producer's sequence, and the owning proxy
    # appends them in sequence order whatever order they arrive in. 1 = one at a time.
    requests_in_flight_per_stream: int = 5
    # Re-list proxies from ZooKeeper at most this often.
    discovery_refresh_ms: int = 2_000
    # A topic's partition count is read again when older than this (and at once when a
    # partition turns out not to exist), so a topic's growth is picked up.
    topic_metadata_max_age_ms: int = 30_000

    def __post_init__(self) -> None:
        positive = (
            "request_timeout_ms",
            "retry_deadline_ms",
            "backoff_initial_ms",
            "backoff_max_ms",
            "batch_records_max",
            "batch_bytes_max",
            "buffer_bytes_max",
            "record_bytes_max",
            "connections_per_proxy",
            "requests_in_flight_per_stream",
            "topic_metadata_max_age_ms",
        )
        check_bounds("client", self, positive=positive)
        if self.buffer_bytes_max < self.batch_bytes_max:
            raise ConfigError("client.buffer_bytes_max must be >= batch_bytes_max")
        if self.record_bytes_max > RECORD_BYTES_MAX:
            # The proxies and the core writer would refuse what this lets through.
            raise ConfigError(f"client.record_bytes_max above {RECORD_BYTES_MAX}")

    def retry_backoff(self, *, deadline: bool = True) -> BackoffPolicy:
        """The waits between retries: doubling, full jitter, until the retry deadline
        (or without one, for loops that never give up, like a tail's)."""
        return BackoffPolicy(
            delay_s=self.backoff_initial_ms / 1000,
            max_delay_s=self.backoff_max_ms / 1000,
            jitter=1.0,
            deadline_s=self.retry_deadline_ms / 1000 if deadline else None,
        )
