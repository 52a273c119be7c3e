"""Typed configuration of the ledger client. Loaded with
:func:`foundation.config.load_config` from the ``[ledger]`` section of a TOML file and
``BOOKLINE_LEDGER_*`` environment variables.
"""

from __future__ import annotations

import dataclasses

from foundation.config import check_bounds
from foundation.errors import ConfigError
from foundation.quorum import check_quorum

__all__ = ["LedgerConfig"]


@dataclasses.dataclass(frozen=True, slots=True)
class LedgerConfig:
    # --- defaults for new ledgers ---------------------------------------------------
    # Ensemble size E: bookies a ledger stripes over.
    ensemble_size: int = 3
    # Write quorum Qw: replicas of every entry.
    write_quorum: int = 3
    # Ack quorum Qa: acks needed before an entry counts as written.
    ack_quorum: int = 2
    # "crc32c" (detects corruption) or "hmac" (also stops forgery without the password;
    # "hmac_sha256" is accepted too). The same names as [core] digest_type and the metadata.
    digest_type: str = "crc32c"
    # File holding the cluster's ledger secret (mode 0600, at least 16 bytes): each new
    # ledger's key is derived from it and a random salt, so no znode holds a key. Every
    # process that opens ledgers needs it (proxies, autorecovery, Spark, CLI); bookies do
    # not. "" = each new ledger gets a random key kept in its metadata (guarded only by
    # ZooKeeper ACLs). See docs/security.md.
    secret_file: str = ""
    # With a secret: talk only to bookies that prove the credential the cluster issued
    # them, and place ledgers only on those (bookie/identity.py). Off only while
    # upgrading a cluster whose bookies have no identity_file yet.
    verify_bookies: bool = True

    # --- timeouts -------------------------------------------------------------------
    # One add request to one bookie; past it the bookie is replaced (ensemble change).
    add_timeout_ms: int = 5_000
    # One read request to one bookie (speculation covers slow replicas before this).
    read_timeout_ms: int = 5_000
    # One fencing read; a bookie that does not answer counts as "unknown".
    fence_timeout_ms: int = 5_000
    # Speculative reads: ask the next replica after this long without an answer...
    speculative_read_first_timeout_ms: int = 50
    # ...doubling each time, never waiting longer than this between two replicas.
    speculative_read_max_timeout_ms: int = 2_000
    # Long-poll READ_LAC: the bookie holds the request at most this long.
    long_poll_timeout_ms: int = 10_000
    # A long poll asks one replica (bookies answer with the writer's LAC before their
    # own fsync); the others too once it has been silent this long (an idle writer, or
    # a hung or older bookie) -- sooner, 4x the recent answers' wait but at least 2 ms,
    # once polls have been answering fast. A busy tail costs one request a round.
    long_poll_speculative_ms: int = 10
    # A long poll's answer may carry the entries that follow the LAC the reader knew,
    # up to about this many bytes (bookies with the LAC_ENTRIES feature), so a tailing
    # reader needs one round trip per batch instead of one read per entry. 0 = just
    # the next entry, as BookKeeper piggybacks.
    long_poll_piggyback_bytes_max: int = 256 << 10
    # close(): wait this long for the replicas of confirmed entries that have not
    # answered yet (Qw - Qa of them per entry), so a closed ledger is fully replicated
    # when bookies are healthy; past it they are logged and left to autorecovery
    # (the entries are durable on Qa bookies). 0 = close at Qa, as BookKeeper does.
    close_replication_timeout_ms: int = 3_000
    # ZooKeeper metadata operations (create / read / CAS) as seen by the ledger client.
    metadata_timeout_ms: int = 15_000

    # --- ensemble changes -----------------------------------------------------------
    # A bookie that fails or times out while the others still make the ack quorum is
    # replaced when a spare is writable; until then entries are acknowledged by the
    # others (on Qa copies) and the writer keeps writing (BookKeeper's
    # delayEnsembleChange). false = such a writer fails after the retries below.
    delay_ensemble_change: bool = True
    # Attempts to replace failed bookies, once the others no longer make the ack quorum,
    # before the writer gives up (fail stop).
    ensemble_change_retries_max: int = 10
    # A bookie that failed is avoided by placement for this long.
    placement_avoid_ms: int = 60_000
    # Retries of a metadata CAS that lost against a concurrent update (re-read, re-apply).
    metadata_cas_retries_max: int = 20

    # --- limits ---------------------------------------------------------------------
    # Adds in flight (sent, not yet acknowledged) per ledger handle; add() waits beyond
    # this (backpressure) rather than queueing without bound. 1,000 matches one bookie
    # connection's pipeline; far more only queues inside the client and trips timeouts.
    adds_in_flight_max: int = 1_000
    # Bytes of payload in flight per ledger handle (same backpressure).
    add_bytes_in_flight_max: int = 64 << 20
    # Largest payload of one entry (bookies bound frame sizes too).
    entry_bytes_max: int = 4 << 20
    # Concurrent entry reads issued by a read of a range (read_entries / recovery).
    reads_in_flight_max: int = 64

    def __post_init__(self) -> None:
        check_quorum(self.ensemble_size, self.write_quorum, self.ack_quorum, "ledger")
        if self.digest_type.lower() not in ("crc32c", "hmac", "hmac_sha256"):
            raise ConfigError(
                f"ledger.digest_type must be crc32c or hmac, got {self.digest_type!r}"
            )
        positive = (
            "add_timeout_ms",
            "read_timeout_ms",
            "fence_timeout_ms",
            "speculative_read_first_timeout_ms",
            "speculative_read_max_timeout_ms",
            "long_poll_timeout_ms",
            "long_poll_speculative_ms",
            "metadata_timeout_ms",
            "adds_in_flight_max",
            "add_bytes_in_flight_max",
            "entry_bytes_max",
            "reads_in_flight_max",
            "metadata_cas_retries_max",
        )
        non_negative = (
            "close_replication_timeout_ms",
            "ensemble_change_retries_max",
            "placement_avoid_ms",
        )
        check_bounds("ledger", self, positive=positive, non_negative=non_negative)
        if self.speculative_read_max_timeout_ms < self.speculative_read_first_timeout_ms:
            raise ConfigError("ledger.speculative_read_max_timeout_ms must be >= the first timeout")
        if not 0 <= self.long_poll_piggyback_bytes_max <= 16 << 20:
            raise ConfigError("ledger.long_poll_piggyback_bytes_max must be within [0, 16 MiB]")
