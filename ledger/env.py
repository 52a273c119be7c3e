"""The environment every ledger handle works in, bundled once.

A writer, a reader, a recovery, the replication worker and the scrub all talk to the
same metadata store and bookies, under the same settings, and share one table of bookie
health (a bookie that failed a writer is tried last by readers too). Time and
randomness are injected here so tests can replay them. :class:`LedgerEnv` carries all
of it; :class:`~ledger.client.LedgerClient` builds one and hands it to every handle.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ledger.config import LedgerConfig
from ledger.interfaces import BookieTransport, MetadataStore
from ledger.keys import cluster_secret
from ledger.metrics import PROCESS_LEDGER_METRICS, LedgerMetrics
from ledger.placement import BookieHealth
from ledger.speculative import speculative

__all__ = ["LedgerEnv"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LedgerEnv:
    store: MetadataStore  # ledger metadata, ids and writable bookies
    transport: BookieTransport  # requests to bookies by id
    config: LedgerConfig
    health: BookieHealth  # recent failures and latencies, shared by every handle
    clock: Callable[[], float]  # monotonic seconds
    rng: random.Random  # placement choices
    # what the handles count (ledger/metrics.py); the process's figures by default
    metrics: LedgerMetrics = field(default=PROCESS_LEDGER_METRICS)
    # The cluster's ledger secret (config.secret_file, read once); b"": none.
    secret: bytes = field(default=b"", repr=False)

    @classmethod
    def create(
        cls,
        store: MetadataStore,
        transport: BookieTransport,
        config: LedgerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        metrics: LedgerMetrics | None = None,
    ) -> LedgerEnv:
        """An environment with a fresh health table (default settings and randomness)."""
        cfg = config or LedgerConfig()
        health = BookieHealth(cfg.placement_avoid_ms, clock)
        return cls(
            store,
            transport,
            cfg,
            health,
            clock,
            rng or random.Random(),
            metrics or PROCESS_LEDGER_METRICS,
            cluster_secret(cfg),
        )

    @property
    def add_timeout_s(self) -> float:
        return self.config.add_timeout_ms / 1000.0

    @property
    def read_timeout_s(self) -> float:
        return self.config.read_timeout_ms / 1000.0

    async def speculative(
        self,
        replicas: Sequence[str],
        attempt: Callable[[str], Awaitable[T]],
        *,
        what: str,
        needed: asyncio.Future[None] | None = None,
    ) -> T:
        """:func:`ledger.speculative.speculative` with this environment's health, clock
        and speculative-read timeouts."""
        return await speculative(
            replicas,
            attempt,
            health=self.health,
            clock=self.clock,
            first_timeout_s=self.config.speculative_read_first_timeout_ms / 1000.0,
            max_timeout_s=self.config.speculative_read_max_timeout_ms / 1000.0,
            what=what,
            needed=needed,
            metrics=self.metrics,
        )
