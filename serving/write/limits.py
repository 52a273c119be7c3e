"""Admission control: bytes and requests in flight, per stream and per proxy. Pure.

A request is admitted before its records reach the writer and released when it is
answered; one over a limit is refused with TooManyRequestsError (HTTP 429) instead of
queueing, so memory stays bounded by the limits whatever clients do.
"""

from __future__ import annotations

from dataclasses import dataclass

from foundation.errors import TooManyRequestsError
from foundation.invariants import invariant


@dataclass
class _Usage:
    bytes: int = 0
    requests: int = 0


class InflightLimiter:
    def __init__(
        self,
        *,
        stream_bytes_max: int,
        stream_requests_max: int,
        proxy_bytes_max: int,
        proxy_requests_max: int,
    ) -> None:
        self._stream_bytes_max = stream_bytes_max
        self._stream_requests_max = stream_requests_max
        self._proxy_bytes_max = proxy_bytes_max
        self._proxy_requests_max = proxy_requests_max
        self._total = _Usage()
        self._streams: dict[str, _Usage] = {}
        self.rejected = 0

    @property
    def total_bytes(self) -> int:
        return self._total.bytes

    @property
    def total_requests(self) -> int:
        return self._total.requests

    def admit(self, stream: str, size: int) -> None:
        """Count a request in, or raise TooManyRequestsError saying which limit."""
        usage = self._streams.get(stream) or _Usage()
        why = None
        if self._total.requests + 1 > self._proxy_requests_max:
            why = f"proxy has {self._total.requests} requests in flight"
        elif self._total.bytes + size > self._proxy_bytes_max:
            why = f"proxy has {self._total.bytes} bytes in flight"
        elif usage.requests + 1 > self._stream_requests_max:
            why = f"stream {stream} has {usage.requests} requests in flight"
        elif usage.bytes + size > self._stream_bytes_max and usage.requests > 0:
            why = f"stream {stream} has {usage.bytes} bytes in flight"
        if why is not None:
            self.rejected += 1
            raise TooManyRequestsError(f"{why}; retry later")
        self._streams[stream] = usage
        usage.bytes += size
        usage.requests += 1
        self._total.bytes += size
        self._total.requests += 1

    def grow(self, stream: str, extra: int) -> None:
        """Raise an admitted request's cost once its body is parsed (records cost the
        writer more than their encoded bytes); TooManyRequestsError over a limit (the
        request stays admitted at its old size: release that)."""
        usage = self._streams[stream]
        if self._total.bytes + extra > self._proxy_bytes_max or (
            usage.bytes + extra > self._stream_bytes_max and usage.requests > 1
        ):
            self.rejected += 1
            raise TooManyRequestsError(f"stream {stream}: too many bytes in flight; retry later")
        usage.bytes += extra
        self._total.bytes += extra

    def release(self, stream: str, size: int) -> None:
        usage = self._streams[stream]
        usage.bytes -= size
        usage.requests -= 1
        self._total.bytes -= size
        self._total.requests -= 1
        invariant(usage.bytes >= 0 and usage.requests >= 0, "limiter went negative")
        if usage.requests == 0:
            del self._streams[stream]
