"""Settings both proxies share: identity, listening address, ZooKeeper and namespace;
and how a read proxy's registration is told from a write proxy's (``READ_PROXY_PREFIX``).

:class:`ProxyConfig` is the base of ``ReadProxyConfig`` and ``WriteProxyConfig``; each
names its TOML section in ``SECTION`` (also the prefix of its error messages) and adds
its own checks in ``__post_init__`` after :meth:`ProxyConfig.check_common`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from foundation.auth import AuthConfig
from foundation.config import MetadataConfig, check_bounds
from foundation.errors import ConfigError
from foundation.names import validate_name
from foundation.tls import scheme

MiB = 1024 * 1024
# Read proxies register as ``proxies/read@<id>`` beside the write proxies'
# ``proxies/<id>``, so clients discovering them in ZooKeeper tell the two apart.
READ_PROXY_PREFIX: Final = "read@"


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    # The TOML section (and error message prefix) of the concrete proxy's settings.
    SECTION: ClassVar[str] = "proxy"

    # Unique id of this proxy, part of its ZooKeeper registration.
    proxy_id: str = "proxy-1"
    # Interface and port to listen on (port 0 picks a free one).
    host: str = "127.0.0.1"
    port: int = 8480
    # Base URL clients use (and are redirected to); empty means http://host:port
    # (https://host:port with [tls] enabled).
    advertise_url: str = ""
    # Client connections served at once; one more is closed as soon as it is accepted.
    connections_max: int = 1024
    # A connection is closed after this long without a request: before its first one
    # (or while its headers never finish) and between requests (HTTP keep-alive).
    idle_timeout_s: float = 75.0
    # A request's body must arrive within this (a body trickled in would hold the write
    # proxy's admission budget, reserved from its declared length, for as long as it takes).
    body_timeout_s: float = 30.0
    # ZooKeeper connect string (chroot allowed) and cluster root.
    zk: str = "127.0.0.1:2181"
    root: str = "/bookline"
    # Namespace whose streams this proxy serves.
    namespace: str = "default"
    # ZooKeeper session timeout: how long a crashed proxy keeps its registration.
    session_timeout_ms: int = 10_000
    # Require a token on every API route and check its grants (docs/security.md).
    # Off for library use and tests; `bookline local` turns it on.
    auth_enabled: bool = False
    # Cluster secrets signing tokens, one per line, the first signing (mode 0600).
    auth_secret_file: str = ""
    # Grants per principal and superusers (TOML or JSON); none: superusers only.
    auth_grants_file: str = ""
    # Static tokens: SHA-256 hex per principal (TOML or JSON), beside signed ones.
    auth_tokens_file: str = ""
    # With auth on: connections that have not yet shown a valid token, at most (the
    # oldest is closed to make room; they cannot take the slots of authenticated ones).
    unauthenticated_connections_max: int = 256
    # With auth on: a connection without a valid token by then is closed (a silent or
    # slow client without credentials holds a slot this long at most).
    unauthenticated_timeout_s: float = 10.0
    # With auth on and a secret file: lifetime of the tokens of the services' principal
    # this proxy signs for its own calls (bookies, the other services' /health); each
    # bookie connection presents a fresh one before its token expires.
    auth_service_token_lifetime_s: float = 300.0
    # Serve Kafka's wire protocol beside HTTP (docs/kafka.md): this proxy is a broker.
    kafka_enabled: bool = False
    # Interface and port of the Kafka listener (port 0 picks a free one); empty: ``host``.
    kafka_host: str = ""
    kafka_port: int = 9092
    # Host Kafka clients are told to connect to (Metadata); empty: the listening host.
    kafka_advertise_host: str = ""
    # The broker's node id, stable across restarts (int32 >= 0); -1 derives it from the
    # proxy's registration id (kafkaapi.brokers.node_id_of).
    kafka_node_id: int = -1

    def __post_init__(self) -> None:
        self.check_common()

    def check_common(self) -> None:
        """The checks every proxy's settings pass (a subclass's ``__post_init__`` calls
        this first: zero-argument ``super()`` does not work in slotted dataclasses)."""
        self.require_positive(
            "connections_max",
            "idle_timeout_s",
            "body_timeout_s",
            "unauthenticated_connections_max",
            "unauthenticated_timeout_s",
            "auth_service_token_lifetime_s",
        )
        validate_name(self.proxy_id, "proxy id")
        validate_name(self.namespace, "namespace")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"{self.SECTION}.port {self.port} is not a TCP port")
        if not 0 <= self.kafka_port <= 65535:
            raise ConfigError(f"{self.SECTION}.kafka_port {self.kafka_port} is not a TCP port")
        if not -1 <= self.kafka_node_id <= 0x7FFFFFFF:
            raise ConfigError(f"{self.SECTION}.kafka_node_id must be -1 or an int32 >= 0")
        self.metadata()  # validates zk, root and session_timeout_ms
        self.auth()  # validates the auth settings

    def auth(self) -> AuthConfig:
        return AuthConfig.of(self)

    def require_positive(self, *names: str) -> None:
        check_bounds(self.SECTION, self, positive=names)

    @property
    def url(self) -> str:
        return self.advertise_url or f"{scheme()}://{self.host}:{self.port}"

    def metadata(self) -> MetadataConfig:
        return MetadataConfig(
            zk=self.zk, root=self.root, session_timeout_ms=self.session_timeout_ms
        )
