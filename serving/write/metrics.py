"""What the write core reports (:class:`WriteMetrics`); a front end implements it with
its own metric families (``writeproxy.metrics.WriteProxyMetrics``: Prometheus)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["UncountedWrites", "WriteMetrics"]


class WriteMetrics(Protocol):
    def stream_acquired(self, scan_records: int) -> None:
        """A stream was acquired; ``scan_records`` of its tail were read back to
        rebuild its producers' table."""

    def batch_written(self, stream: str, records: int, payload_bytes: int, duplicates: int) -> None:
        """A batch was answered: ``records`` new records (``payload_bytes`` of payload
        and keys) appended to ``stream``, ``duplicates`` retried ones answered from the
        producers' table."""


class UncountedWrites:
    """Reports nothing: for a core nobody scrapes (tests, tools)."""

    def stream_acquired(self, scan_records: int) -> None:
        return None

    def batch_written(self, stream: str, records: int, payload_bytes: int, duplicates: int) -> None:
        return None
