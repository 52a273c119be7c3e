"""What the read core reports, as a protocol its front end implements (the read
proxy: :class:`readproxy.metrics.ReadProxyMetrics`, with its Prometheus families).

``source`` and ``path`` name where records came from and went: ``feed`` (a shared
feed's cache), ``private`` (a private reader), ``partition`` (a topic partition's page),
``sets`` (record sets handed through as stored).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ReadMetrics"]


class ReadMetrics(Protocol):
    def count_core(self, source: str, *, records: int = 0, entries: int = 0) -> None:
        """``records`` and distinct ``entries`` read through the core library by
        ``source`` (``feed`` or ``private``)."""

    def count_served(self, path: str, name: str, records: int) -> None:
        """``records`` of stream ``name`` handed to a client by ``path``."""

    def set_feeds(self, count: int) -> None:
        """Shared feeds open now."""

    def set_cache_bytes(self, size: int) -> None:
        """Bytes held by every feed's cache now."""

    def set_private_readers(self, count: int) -> None:
        """Idle private readers kept now."""

    def add_subscribers(self, delta: int) -> None:
        """Tails attached to feeds: ``delta`` more (negative: fewer)."""
