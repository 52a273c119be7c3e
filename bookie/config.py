"""Typed configuration of a bookie (storage + server). Loaded with
:func:`foundation.config.load_config` from the ``[bookie]`` section of a TOML file,
``BOOKLINE_BOOKIE_*`` environment variables and command-line flags.
"""

from __future__ import annotations

import dataclasses

from foundation.auth import AuthConfig
from foundation.config import check_bounds
from foundation.errors import ConfigError

# A journal record stores its offset in its group commit as a u32 (journal_format.py);
# a group is at most journal_group_bytes_max plus one record (64 MiB).
JOURNAL_GROUP_BYTES_LIMIT = 1 << 30
# BookieConfig.fault_shim values (see bookie/storage/faults.py).
FAULT_SHIM_MODES = ("", "on", "power-cut")
# Settings that must be above 0, and those that may be 0 (off, or no wait).
_POSITIVE = (
    "journal_group_bytes_max",
    "journal_prealloc_bytes",
    "journal_file_bytes_max",
    "entry_log_bytes_max",
    "checkpoint_interval_ms",
    "gc_interval_ms",
    "connections_max",
    "idle_timeout_s",
    "auth_timeout_s",
    "unauthenticated_connections_max",
)
_NON_NEGATIVE = (
    "journal_group_wait_ms",
    "read_cache_bytes_max",
    "entry_log_sync_bytes",
    "read_ahead_entries",
)


@dataclasses.dataclass(frozen=True, slots=True)
class BookieConfig:
    # --- identity and network -------------------------------------------------------
    # Bookie id as registered in ZooKeeper; defaults to "host:port".
    bookie_id: str = ""
    # Loopback by default: a local cluster never listens beyond this machine.
    host: str = "127.0.0.1"
    # TCP port of the wire protocol; 0 picks a free port (tests).
    port: int = 3181
    # Prometheus metrics HTTP port; 0 picks a free one, -1 disables it.
    metrics_port: int = -1
    # Rack or zone label used by placement to spread replicas ("" = none).
    rack: str = ""

    # --- metadata -----------------------------------------------------------------
    # ZooKeeper connect string (a chroot suffix is allowed).
    zk: str = "127.0.0.1:2181"
    # Root znode of the cluster the bookie belongs to.
    root: str = "/bookline"
    # ZooKeeper session timeout: how long a dead bookie stays registered.
    session_timeout_ms: int = 10_000

    # --- directories: three I/O paths, three disks in production -------------------
    # Journal (write-ahead log, fsynced per group commit): a disk of its own.
    journal_dir: str = "data/journal"
    # Entry logs (checkpointed entries, read by catch-up readers).
    ledgers_dir: str = "data/ledgers"
    # RocksDB index (ledger, entry) -> entry log position.
    index_dir: str = "data/index"

    # --- journal ------------------------------------------------------------------
    # Group commit: flush when this many bytes are queued...
    journal_group_bytes_max: int = 1 << 20
    # ...or when the oldest queued record has waited this long.
    journal_group_wait_ms: float = 1.0
    # Flush a group as soon as the queue is empty instead of waiting out
    # journal_group_wait_ms: records that arrive during an fsync form the next group
    # anyway, so waiting only adds latency at low load (BookKeeper's
    # journalFlushWhenQueueEmpty).
    journal_flush_when_idle: bool = True
    # Roll to a new journal file past this size; files are preallocated in chunks.
    journal_file_bytes_max: int = 256 << 20
    # A journal file grows by preallocated chunks of this size (one statvfs per chunk
    # checks the free space; see docs/architecture.md, "A small journal disk").
    journal_prealloc_bytes: int = 16 << 20
    # False only for benchmarks that want to show what fsync costs. Never in production.
    journal_sync: bool = True

    # --- memtable, entry logs, caches ----------------------------------------------
    # Checkpoint (flush the memtable to entry logs) past this many bytes.
    memtable_flush_bytes: int = 64 << 20
    # Adds get TOO_MANY_REQUESTS past this many unflushed bytes (backpressure).
    memtable_bytes_max: int = 256 << 20
    # Checkpoint this often on average even when little was written (a full memtable
    # triggers one sooner). The period is jittered, see checkpoint_jitter_fraction.
    checkpoint_interval_ms: int = 10_000
    # Each period is checkpoint_interval_ms times a uniform factor in 1 +- this, and the
    # first one starts at a random phase: bookies started together must not checkpoint
    # (and slow down) at the same moment, or a whole ack quorum stalls at once. 0 turns
    # the randomness off; at most 0.5, so no period is shorter than half the interval.
    checkpoint_jitter_fraction: float = 0.2
    # Roll to a new entry log past this size.
    entry_log_bytes_max: int = 512 << 20
    # A checkpoint fsyncs its entry log every this many bytes as it writes, not only at
    # the end: a journal on the same disk would otherwise wait behind one big fsync and
    # stall acknowledged adds for its length (BookKeeper's flushEntrylogBytes). 0 = only
    # at the end (the journal has a disk of its own).
    entry_log_sync_bytes: int = 2 << 20
    # Read cache for sequential catch-up reads (read-ahead lands here).
    read_cache_bytes_max: int = 64 << 20
    # Entries read ahead on a sequential scan of the entry logs.
    read_ahead_entries: int = 64

    # --- garbage collection and compaction -------------------------------------------
    # How often deleted ledgers are looked for and their entry logs compacted.
    gc_interval_ms: int = 60_000
    # Compact an entry log whose live fraction is below this.
    compaction_threshold: float = 0.5

    # --- disk health ----------------------------------------------------------------
    # Turn read-only above this used fraction of the ledgers/journal disks...
    disk_usage_threshold: float = 0.95
    # ...and writable again below this one.
    disk_usage_lwm: float = 0.90
    # How often to check disk usage.
    disk_check_interval_ms: int = 5_000

    # --- server limits --------------------------------------------------------------
    # Frames above this are refused before any allocation.
    frame_bytes_max: int = 8 << 20
    # Requests in flight on one connection before TOO_MANY_REQUESTS.
    inflight_requests_per_connection_max: int = 10_000
    # Longest long poll a client may ask for.
    long_poll_timeout_ms_max: int = 60_000
    # Client connections served at once; one more is closed as soon as it is accepted
    # (logged, counted in bookline_bookie_connections_closed_total{reason}).
    connections_max: int = 1024
    # Bytes of unfinished frames all connections together may hold (a partial frame
    # counts as it arrives): the connection whose bytes would pass it is closed. With
    # frame_bytes_max bounding one connection's frame, memory held by slow or hostile
    # senders is bounded by this, whatever the number of connections.
    buffered_bytes_max: int = 256 << 20
    # A connection that sends nothing for this long while nothing of it is in flight,
    # or whose unfinished frame gets no new byte for this long, is closed.
    idle_timeout_s: float = 600.0
    # Python's GIL switch interval for the bookie process. The journal thread needs the
    # GIL back after every write and fdatasync; with Python's default (5 ms) a busy event
    # loop keeps it waiting up to that long each time, which dominates add latency. At
    # 0.5 ms a checkpoint's flush thread still held the loop off long enough for 40-60 ms
    # tails in 4 of 5 end-to-end runs (0 of 5 at 0.1 ms), for ~10 % of peak adds/s.
    gil_switch_interval_ms: float = 0.1

    # --- authentication (docs/security.md) --------------------------------------------
    # Serve a connection only once an AUTH request with a valid token names a principal
    # (foundation.auth); anything else first is refused UNAUTHENTICATED and closed. Then
    # LIST_LEDGERS, LIST_DAMAGED and ENTRY_CHECKSUMS need an admin of the cluster.
    auth_enabled: bool = False
    # File of the cluster's token secrets, one per line, owner-only (the proxies' file).
    auth_secret_file: str = ""
    # Optional file of static tokens (SHA-256 hex per principal).
    auth_tokens_file: str = ""
    # Optional grants file: principals with admin on the cluster besides the services.
    auth_grants_file: str = ""
    # The credential the cluster issued this bookie (bookie/identity.py; mode 0600):
    # clients holding the ledger secret talk only to bookies proving it, and placement
    # picks only bookies whose registration carries its proof. "": none.
    identity_file: str = ""
    # With auth on, a connection not authenticated within this is closed, so silent
    # sockets cannot hold what authenticated clients need.
    auth_timeout_s: float = 5.0
    # With auth on, connections not yet authenticated have this budget of their own
    # (connections_max counts authenticated ones): one more closes the oldest of them.
    unauthenticated_connections_max: int = 256

    # --- test-only fault injection (bookie/storage/faults.py); never in production ---
    # "" (off: storage calls the os functions directly, zero cost), "on" (injectable
    # fsync errors, slow fsyncs and a simulated disk size, steered at runtime by FAULTS.toml in the
    # journal directory) or "power-cut" (as "on", and writes stay in process memory
    # until their file is fsynced, so kill -9 of the bookie drops what a power cut would).
    fault_shim: str = ""
    # Test-only: pretend each storage directory is a disk of this many bytes (0 = real);
    # non-zero turns the shim on even with fault_shim "".
    fault_disk_bytes_max: int = 0

    @property
    def auth(self) -> AuthConfig:
        """The ``auth_*`` settings as foundation.auth takes them."""
        return AuthConfig.of(self)

    def __post_init__(self) -> None:
        if self.auth_enabled and not (self.auth_secret_file or self.auth_tokens_file):
            raise ConfigError(
                "bookie.auth_enabled needs bookie.auth_secret_file or bookie.auth_tokens_file"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"bookie.port {self.port} is not a TCP port")
        if not 0.0 < self.disk_usage_lwm < self.disk_usage_threshold <= 1.0:
            raise ConfigError(
                "bookie disk thresholds must satisfy 0 < disk_usage_lwm < disk_usage_threshold <= 1"
            )
        if self.memtable_flush_bytes > self.memtable_bytes_max:
            raise ConfigError("bookie.memtable_flush_bytes must not exceed memtable_bytes_max")
        check_bounds("bookie", self, positive=_POSITIVE, non_negative=_NON_NEGATIVE)
        if self.journal_group_bytes_max > JOURNAL_GROUP_BYTES_LIMIT:
            raise ConfigError("bookie.journal_group_bytes_max must be at most 1 GiB")
        if not 0.0 <= self.checkpoint_jitter_fraction <= 0.5:
            raise ConfigError("bookie.checkpoint_jitter_fraction must be within [0, 0.5]")
        if not 0.0 <= self.compaction_threshold < 1.0:
            raise ConfigError("bookie.compaction_threshold must be within [0, 1)")
        if not 0.01 <= self.gil_switch_interval_ms <= 100.0:
            raise ConfigError("bookie.gil_switch_interval_ms must be within [0.01, 100]")
        if self.frame_bytes_max < 1024:
            raise ConfigError("bookie.frame_bytes_max must be at least 1024")
        if self.buffered_bytes_max < self.frame_bytes_max:
            raise ConfigError("bookie.buffered_bytes_max must be at least frame_bytes_max")
        if self.fault_shim not in FAULT_SHIM_MODES:
            raise ConfigError(f"bookie.fault_shim must be one of {FAULT_SHIM_MODES}")
        if self.fault_disk_bytes_max < 0:
            raise ConfigError("bookie.fault_disk_bytes_max must not be negative")
        dirs = (self.journal_dir, self.ledgers_dir, self.index_dir)
        if len(set(dirs)) != 3:
            raise ConfigError("bookie journal_dir, ledgers_dir and index_dir must differ")
