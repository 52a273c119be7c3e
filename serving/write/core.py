"""One batch from admission to answer (:class:`WriteCore`), for every front end.

A front end admits a request before reading its body (:meth:`WriteCore.admit`: memory
stays bounded by the declared size), decodes the body into a
:class:`~serving.write.batch.WriteBatch` and hands it to :meth:`WriteCore.write`,
which checks the record limit, raises the admission to what the records cost the
writer, acquires the stream (:mod:`serving.write.ownership`) and writes the batch
(:mod:`serving.write.owned`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from foundation.errors import TooLargeError
from foundation.invariants import invariant
from serving.write.batch import WriteBatch, WriteResult
from serving.write.config import WriteConfig
from serving.write.limits import InflightLimiter
from serving.write.metrics import WriteMetrics
from serving.write.ownership import Ownership
from streams.records import RECORD_OVERHEAD_BYTES

__all__ = ["Admission", "WriteCore"]


@dataclass(slots=True)
class Admission:
    """One request's share of the in-flight limits while it is being served."""

    stream: str
    size: int


class WriteCore:
    """Admission, ownership and the owned streams' write path of one process.

    ``ownership`` gives the process's current :class:`Ownership`, or raises UNAVAILABLE
    while the front end is starting or stopping (it owns that lifecycle)."""

    def __init__(
        self, config: WriteConfig, metrics: WriteMetrics, ownership: Callable[[], Ownership]
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._ownership = ownership
        self.limiter = InflightLimiter(
            stream_bytes_max=config.stream_inflight_bytes_max,
            stream_requests_max=config.stream_inflight_requests_max,
            proxy_bytes_max=config.proxy_inflight_bytes_max,
            proxy_requests_max=config.proxy_inflight_requests_max,
        )

    @contextmanager
    def admit(self, stream: str, size: int) -> Iterator[Admission]:
        """Count a request of ``size`` bytes in until the block ends (TOO_MANY_REQUESTS
        over a limit, before anything is read)."""
        self.limiter.admit(stream, size)
        admission = Admission(stream, size)
        try:
            yield admission
        finally:
            self.limiter.release(stream, admission.size)

    async def write(self, admission: Admission, batch: WriteBatch) -> WriteResult:
        """Write an admitted batch; its answer (:class:`WriteResult`)."""
        invariant(admission.stream == batch.stream, "batch admitted for another stream")
        largest, limit = batch.record_bytes_max, self.config.record_bytes_max
        if largest > limit:
            raise TooLargeError(f"record of {largest} bytes; at most {limit}")
        cost = batch.size_bytes() + RECORD_OVERHEAD_BYTES * batch.count
        if cost > admission.size:
            self.limiter.grow(admission.stream, cost - admission.size)
            admission.size = cost
        stream = await self._ownership().get(batch.stream)
        result = await stream.write(batch)
        dups = result.duplicates
        self.metrics.batch_written(
            batch.stream, len(result.dlsns) - dups, batch.size_bytes(dups), dups
        )
        return result
