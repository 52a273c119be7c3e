"""Settings of autorecovery (``[autorecovery]`` of a TOML file,
``BOOKLINE_AUTORECOVERY_*``): the auditor, the replication workers and the replica check.

A module of its own so the auditor and the workers can take their settings without
importing the service that runs them (:mod:`ledger.autorecovery`).
"""

from __future__ import annotations

import dataclasses

from foundation.auth import AuthConfig
from foundation.config import check_bounds
from foundation.errors import ConfigError

__all__ = ["ENV_PREFIX", "AutorecoveryConfig"]

ENV_PREFIX = "BOOKLINE_AUTORECOVERY_"


@dataclasses.dataclass(frozen=True, slots=True)
class AutorecoveryConfig:
    # --- auditor --------------------------------------------------------------------
    # A bookie absent from the registry (neither writable nor read-only) this long has
    # its ledgers marked under-replicated. Long enough to ride out a restart.
    grace_ms: int = 30_000
    # The elected auditor re-checks every ledger against the registry this often, so a
    # failure nobody noticed (auditor failover, a lost watch) is still found.
    full_check_interval_ms: int = 300_000
    # How often the auditor looks whether some absent bookie's grace period ran out.
    audit_poll_ms: int = 500
    # Ledger metadata reads in flight during an audit scan.
    audit_reads_in_flight_max: int = 32
    # A candidate auditor re-checks the election node this often even without a watch
    # event (a watch can be lost with a session).
    election_poll_ms: int = 5_000
    # Stand for auditor election (False: this process only runs a worker).
    auditor_enabled: bool = True

    # Ledgers a stream's writer created in advance and left behind when it died
    # (`kill -9`) are deleted this often by the elected auditor (0: never).
    # Each pass reads every ledger's metadata, like an audit.
    orphan_check_interval_ms: int = 300_000
    # A left-behind ledger is deleted only once this old (since its creation), and only
    # when no segment references it and the writer that made it lost the stream's lock.
    orphan_ledger_age_ms: int = 60_000

    # --- replication workers --------------------------------------------------------
    # An OPEN ledger may have a live writer, and changing its ensembles fails that
    # writer; it is recovered (fenced and closed) only once its work item is this old.
    open_ledger_grace_ms: int = 300_000
    # Under-replicated ledgers one worker repairs at once.
    ledgers_in_flight_max: int = 4
    # Entries of one fragment being copied at once (read + recovery add each).
    entries_in_flight_max: int = 64
    # Deadline of repairing one ledger; past it the claim is released, retried later.
    ledger_timeout_ms: int = 600_000
    # Workers re-list the work items this often even without a watch event (deferred
    # OPEN ledgers and failed ones come back this way).
    worker_poll_ms: int = 5_000
    # A ledger whose repair failed is not retried by the same worker before this.
    retry_backoff_ms: int = 10_000
    # Run a replication worker (False: this process only stands for auditor).
    worker_enabled: bool = True

    # --- replica check (ledger.scrub; run by the elected auditor) --------------------
    # Every closed ledger's replicas are compared this often (0: never). It reads every
    # entry on every bookie, so hourly by default; the last completion is kept in
    # ZooKeeper, so a new auditor keeps the schedule.
    replica_check_interval_ms: int = 3_600_000
    # Every registered bookie is asked this often which entries its storage found
    # damaged (0: never); cheap, so damage a bookie noticed is repaired within minutes.
    damaged_poll_interval_ms: int = 60_000
    # Entries of a segment compared per round of requests (one to each ensemble bookie).
    replica_check_page_entries: int = 1024
    # Ledgers checked at once.
    replica_check_ledgers_in_flight_max: int = 2

    # --- /health and /metrics (--http-port) -------------------------------------------
    # Show /health's details and recent log lines (which can name streams) only to a
    # token allowed consume on the cluster, signed with the cluster's secret (as the
    # proxies and bookies do); anyone else learns only whether autorecovery is up.
    auth_enabled: bool = False
    # File of the cluster's token secrets, one per line, owner-only (the proxies' file).
    auth_secret_file: str = ""
    # TOML/JSON file of grants and superusers (the proxies' file).
    auth_grants_file: str = ""
    # Optional TOML/JSON file of static tokens (SHA-256 hex per principal).
    auth_tokens_file: str = ""

    def auth(self) -> AuthConfig:
        """The ``auth_*`` settings as foundation.auth takes them."""
        return AuthConfig.of(self)

    def __post_init__(self) -> None:
        non_negative = (
            "grace_ms",
            "open_ledger_grace_ms",
            "retry_backoff_ms",
            "replica_check_interval_ms",
            "damaged_poll_interval_ms",
            "orphan_check_interval_ms",
            "orphan_ledger_age_ms",
        )
        positive = (
            "full_check_interval_ms",
            "audit_poll_ms",
            "audit_reads_in_flight_max",
            "election_poll_ms",
            "ledgers_in_flight_max",
            "entries_in_flight_max",
            "ledger_timeout_ms",
            "worker_poll_ms",
            "replica_check_page_entries",
            "replica_check_ledgers_in_flight_max",
        )
        check_bounds("autorecovery", self, positive=positive, non_negative=non_negative)
        if not (self.auditor_enabled or self.worker_enabled):
            raise ConfigError("autorecovery needs the auditor or the worker enabled")
        if self.auth_enabled and not (self.auth_secret_file or self.auth_tokens_file):
            raise ConfigError(
                "autorecovery.auth_enabled needs autorecovery.auth_secret_file or "
                "autorecovery.auth_tokens_file"
            )
