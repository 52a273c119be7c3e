"""The read proxy's settings: ``[readproxy]`` of a TOML file, ``BOOKLINE_READPROXY_*``
environment variables, then flags (see :func:`bookline.config.load_config`)."""

from __future__ import annotations

from dataclasses import dataclass

from bookline.config import MetadataConfig
from bookline.errors import ConfigError
from bookline.names import validate_name

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReadProxyConfig:
    # Unique id; registered as proxies/read@<id> so clients can discover read proxies.
    proxy_id: str = "rp-1"
    # Interface and port to listen on (port 0 picks a free one).
    host: str = "127.0.0.1"
    port: int = 8490
    # Base URL clients use; empty means http://host:port.
    advertise_url: str = ""
    # ZooKeeper connect string (chroot allowed), cluster root, namespace served.
    zk: str = "127.0.0.1:2181"
    root: str = "/bookline"
    namespace: str = "default"
    session_timeout_ms: int = 10_000
    # Records one read answers at most (bounds the answer's size and the work).
    read_records_max: int = 10_000
    # Bytes one read answers at most (a few big records stop a page early).
    read_bytes_max: int = 8 * MiB
    # Longest long poll a client may ask for.
    long_poll_ms_max: int = 30_000
    # A read without wait gives a fresh reader this long to fetch the first records.
    range_read_timeout_ms: int = 300
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
        validate_name(self.proxy_id, "proxy id")
        validate_name(self.namespace, "namespace")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"readproxy.port {self.port} is not a TCP port")
        MetadataConfig(zk=self.zk, root=self.root, session_timeout_ms=self.session_timeout_ms)
        for name in ("read_records_max", "read_bytes_max", "long_poll_ms_max", "feeds_max",
                     "feed_records_max", "feed_bytes_max", "cache_bytes_max", "feed_idle_ms",
                     "private_readers_max", "private_reader_idle_ms", "ws_frame_records_max",
                     "websockets_max", "range_read_timeout_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"readproxy.{name} must be positive")
        if self.cache_bytes_max < self.feed_bytes_max:
            raise ConfigError("readproxy.cache_bytes_max must be >= feed_bytes_max")

    @property
    def url(self) -> str:
        return self.advertise_url or f"http://{self.host}:{self.port}"

    def metadata(self) -> MetadataConfig:
        return MetadataConfig(
            zk=self.zk, root=self.root, session_timeout_ms=self.session_timeout_ms
        )
