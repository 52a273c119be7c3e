"""The write proxy's settings: ``[writeproxy]`` of a TOML file, ``BOOKLINE_WRITEPROXY_*``
environment variables, then flags (see :func:`foundation.config.load_config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from foundation.errors import ConfigError
from foundation.limits import RECORD_BYTES_MAX
from foundation.quorum import check_quorum
from httpapi.proxy_config import MiB, ProxyConfig
from serving.write.config import WriteConfig


@dataclass(frozen=True, slots=True)
class WriteProxyConfig(ProxyConfig):
    SECTION: ClassVar[str] = "writeproxy"

    # Unique id of this proxy; its ZooKeeper registration is proxies/<id>.
    proxy_id: str = "wp-1"
    port: int = 8480
    # ZooKeeper session timeout: how long a crashed proxy keeps its streams.
    session_timeout_ms: int = 6_000
    # One record's payload+key+headers (foundation.limits.record_bytes); bigger ones get
    # 413. At most the limit the core writer enforces (foundation.limits.RECORD_BYTES_MAX).
    record_bytes_max: int = RECORD_BYTES_MAX
    # One request body; aiohttp refuses bigger bodies before reading them all.
    request_bytes_max: int = 16 * MiB
    # Records in one request (bounds per-request work and the answer size).
    request_records_max: int = 20_000
    # In-flight limits (bodies being written): per stream and for the whole proxy -> 429.
    stream_inflight_bytes_max: int = 64 * MiB
    stream_inflight_requests_max: int = 1_000
    proxy_inflight_bytes_max: int = 256 * MiB
    proxy_inflight_requests_max: int = 10_000
    # Streams one proxy owns at most (each holds a writer and a ZK lock).
    streams_owned_max: int = 10_000
    # Create a stream on its first write instead of answering 404.
    auto_create_streams: bool = True
    # De-duplication: retries within this window of the original write are recognised,
    # also after failover (the new owner scans this much of the log's tail).
    dedup_window_ms: int = 300_000
    # ... but never scans more records than this when taking a stream over.
    dedup_scan_records_max: int = 200_000
    # Remembered batches per producer (a client has a few requests in flight per stream).
    dedup_batches_per_producer: int = 16
    # A producer's request whose sequence is ahead of the next expected one (an earlier
    # request of the same producer is still on its way over another connection) waits
    # this long for the gap to fill, then is refused with OUT_OF_ORDER_SEQUENCE.
    # (A producer this proxy does not know yet is expected to start at sequence 0;
    # one that does not -- its history was forgotten -- goes on after this wait.)
    reorder_wait_ms: int = 500
    # Producers remembered per stream (least recently used forgotten first).
    dedup_producers_max: int = 10_000
    # How long a request waits for ZooKeeper + recovery when acquiring a stream.
    acquire_timeout_ms: int = 30_000
    # Ensemble size E of the ledgers this proxy's writers create (one per segment):
    # the bookies a ledger's entries are spread over. At least this many bookies must
    # be writable when the proxy starts, and one more lets writes go on when one dies.
    ensemble_size: int = 3
    # Write quorum Qw: copies of every entry.
    write_quorum: int = 3
    # Ack quorum Qa: copies that must be durable before a write is acknowledged.
    ack_quorum: int = 2
    # Core writer batching: flush a record set after this long (0 = core default).
    writer_flush_interval_ms: int = 0
    # How often the registration's load figure is refreshed.
    load_report_interval_ms: int = 5_000
    # TEST ONLY: stall the answer of the first N writes (that wrote new records) to
    # streams whose name starts with the prefix by this long after they are durable, so
    # a client times out and retries a write that already happened.
    fault_stall_writes: int = 0
    fault_stall_ms: int = 0
    fault_stall_stream_prefix: str = "fault-"

    def __post_init__(self) -> None:
        self.check_common()
        check_quorum(self.ensemble_size, self.write_quorum, self.ack_quorum, "writeproxy")
        if self.record_bytes_max <= 0 or self.request_bytes_max < self.record_bytes_max:
            raise ConfigError("writeproxy: need 0 < record_bytes_max <= request_bytes_max")
        if self.record_bytes_max > RECORD_BYTES_MAX:
            # The core writer would refuse what this admits: one limit end to end.
            raise ConfigError(f"writeproxy: record_bytes_max above {RECORD_BYTES_MAX}")
        if self.stream_inflight_bytes_max < self.request_bytes_max:
            raise ConfigError("writeproxy: stream_inflight_bytes_max < request_bytes_max")
        if self.proxy_inflight_bytes_max < self.stream_inflight_bytes_max:
            raise ConfigError("writeproxy: proxy_inflight_bytes_max < stream_inflight_bytes_max")
        if self.proxy_inflight_requests_max < self.stream_inflight_requests_max:
            raise ConfigError("writeproxy: proxy_inflight_requests_max < stream_inflight_...")
        self.require_positive(
            "request_records_max",
            "stream_inflight_requests_max",
            "streams_owned_max",
            "dedup_batches_per_producer",
            "dedup_producers_max",
            "acquire_timeout_ms",
            "reorder_wait_ms",
        )
        if self.fault_stall_writes < 0 or self.fault_stall_ms < 0:
            raise ConfigError("writeproxy fault settings must be >= 0")
        self.write_config()  # the core's own checks (the ones above name our settings)

    def write_config(self) -> WriteConfig:
        """The write core's settings (:mod:`serving.write`)."""
        return WriteConfig(
            namespace=self.namespace,
            proxy_id=self.proxy_id,
            record_bytes_max=self.record_bytes_max,
            stream_inflight_bytes_max=self.stream_inflight_bytes_max,
            stream_inflight_requests_max=self.stream_inflight_requests_max,
            proxy_inflight_bytes_max=self.proxy_inflight_bytes_max,
            proxy_inflight_requests_max=self.proxy_inflight_requests_max,
            streams_owned_max=self.streams_owned_max,
            auto_create_streams=self.auto_create_streams,
            dedup_window_ms=self.dedup_window_ms,
            dedup_scan_records_max=self.dedup_scan_records_max,
            dedup_batches_per_producer=self.dedup_batches_per_producer,
            dedup_producers_max=self.dedup_producers_max,
            reorder_wait_ms=self.reorder_wait_ms,
            acquire_timeout_ms=self.acquire_timeout_ms,
        )
