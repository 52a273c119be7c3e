"""Typed configuration of the core library (:class:`NamespaceConfig`).

Loaded like every other config with :func:`foundation.config.load_config` (section
``[core]``, environment prefix ``BOOKLINE_CORE_``); the nested ledger settings keep
their own section (``[ledger]``) and are passed in as a :class:`LedgerConfig`.
"""

from __future__ import annotations

import dataclasses

from foundation.config import check_bounds
from foundation.errors import ConfigError
from foundation.limits import RECORD_BYTES_MAX
from foundation.quorum import check_quorum
from ledger.config import LedgerConfig
from metadata.ledger_metadata import DigestType

__all__ = ["NamespaceConfig"]

# A record set's header, one record's framing and the ledger digest fit well inside this.
_RECORD_SET_FRAMING_BYTES_MAX = 64 << 10


@dataclasses.dataclass(frozen=True, slots=True)
class NamespaceConfig:
    # --- new segments' ledgers ------------------------------------------------------
    # Ensemble size E, write quorum Qw, ack quorum Qa of each segment's ledger.
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    # Entry digest: "crc32c" (corruption) or "hmac" (also forgery, keyed by the ledger's
    # key). The same name and values as [ledger] digest_type and the ledger metadata.
    digest_type: str = "crc32c"
    # Password of legacy ledgers only (made before per-ledger keys): opening one compares
    # it with the ledger's own. New ledgers each get a key of their own (see
    # ledger.secret_file) and ignore it.
    password: str = "bookline"
    # Record-set compression: "none", "lz4" or "zstd".
    compression: str = "none"

    # --- writer batching -------------------------------------------------------------
    # Transmit the buffer as one entry once it holds this many bytes (records + framing).
    buffer_bytes_max: int = 512 << 10
    # ...or this long after the first buffered record (0: at the next loop iteration).
    flush_interval_ms: int = 1
    # ...or at the next loop iteration while fewer entries than this are in flight or
    # queued (the pipe counts as idle). 1 sends a busy writer's records when its pipe
    # has drained (or flush_interval_ms passed): fewer, larger entries, fewer messages
    # per record for every process on the path (bookie CPU per record -23 % at
    # 10,000 records/s with flush_interval_ms 2; docs/benchmarks.md), a lone write
    # waiting out the one in flight. 2 (the default) keeps one entry overlapping.
    idle_pipe_entries: int = 2
    # Idle this long after an acknowledged entry, write a control record so readers
    # learn the new LAC (the LAC rides on the next entry; without one it would stall).
    control_interval_ms: int = 2
    # Bytes accepted but not yet acknowledged; write()/write_many() wait beyond this,
    # write_nowait() raises TooManyRequestsError (backpressure, not memory growth).
    pending_bytes_max: int = 64 << 20

    # --- segments --------------------------------------------------------------------
    # Roll to a new segment past this many payload bytes (a stream option overrides).
    segment_rollover_bytes: int = 256 << 20
    # ...or past this age (a stream option overrides).
    segment_rollover_ms: int = 3_600_000
    # How often the writer applies the stream's retention policy.
    retention_check_interval_ms: int = 60_000

    # --- readers ---------------------------------------------------------------------
    # Decoded entries a reader keeps ahead of the application (bounded read-ahead cache).
    read_ahead_entries: int = 64
    # Byte bound of that cache (whichever bound is hit first stops the read-ahead).
    read_cache_bytes_max: int = 64 << 20
    # A tailing reader's long poll; shorter only costs a few more requests when idle.
    long_poll_timeout_ms: int = 2_000
    # Ledger readers of sealed segments kept open by a namespace (direct entry reads).
    open_ledgers_max: int = 64

    # --- metadata --------------------------------------------------------------------
    # ZooKeeper session timeout: how long a crashed writer keeps the stream's lock.
    session_timeout_ms: int = 10_000

    # --- ledger client ---------------------------------------------------------------
    # The ledger client's settings (timeouts, in-flight bounds): the [ledger] section.
    ledger: LedgerConfig = dataclasses.field(default_factory=LedgerConfig)

    def __post_init__(self) -> None:
        check_quorum(self.ensemble_size, self.write_quorum, self.ack_quorum, "core")
        try:
            DigestType.parse(self.digest_type)
        except ConfigError as exc:
            raise ConfigError(
                f"core.digest_type must be crc32c or hmac, got {self.digest_type!r}"
            ) from exc
        if self.compression.lower() not in ("none", "lz4", "zstd"):
            raise ConfigError(f"core.compression must be none, lz4 or zstd: {self.compression!r}")
        if self.ledger.entry_bytes_max < RECORD_BYTES_MAX + _RECORD_SET_FRAMING_BYTES_MAX:
            raise ConfigError(
                f"ledger.entry_bytes_max must hold a record of RECORD_BYTES_MAX "
                f"({RECORD_BYTES_MAX}) bytes with its framing"
            )
        if self.buffer_bytes_max > self.ledger.entry_bytes_max // 2:
            raise ConfigError("core.buffer_bytes_max must be at most half the ledger entry limit")
        positive = (
            "buffer_bytes_max",
            "control_interval_ms",
            "pending_bytes_max",
            "segment_rollover_bytes",
            "segment_rollover_ms",
            "retention_check_interval_ms",
            "read_ahead_entries",
            "read_cache_bytes_max",
            "long_poll_timeout_ms",
            "open_ledgers_max",
        )
        check_bounds("core", self, positive=positive, non_negative=("flush_interval_ms",))
        if self.idle_pipe_entries < 1:
            raise ConfigError("core.idle_pipe_entries must be at least 1")
        if self.pending_bytes_max < self.buffer_bytes_max:
            raise ConfigError("core.pending_bytes_max must be >= buffer_bytes_max")

    @property
    def ledger_digest(self) -> DigestType:
        return DigestType.parse(self.digest_type)

    @property
    def password_bytes(self) -> bytes:
        return self.password.encode()
