"""Limits every layer agrees on, in one place (a leaf: imports nothing of ours).

``RECORD_BYTES_MAX`` is the largest record payload (value + key + headers as encoded)
that Bookline accepts end to end: the thin client refuses bigger records before sending,
the write proxy answers 413 ``TOO_LARGE``, and the core writer raises ``TooLargeError``.
One number, so a record the client accepts is never refused further down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

MiB: Final = 1024 * 1024

# 1 MiB: Kafka's default ``max.message.bytes`` is about the same, and a record this size
# still fits a ledger entry (``LedgerConfig.entry_bytes_max``, 4 MiB) with room for a
# record set's framing.
RECORD_BYTES_MAX: Final = 1 * MiB


# Headers whose names start with this are Bookline's own (the write proxy's producer
# id and sequence); users may not set them and they do not count against the limit.
RESERVED_HEADER_PREFIX: Final = "bl."


def record_bytes(
    payload: bytes | None,
    key: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes] | None,
) -> int:
    """A record's size as every limit counts it: value + key + header names and values
    (Kafka counts the same parts; a null value counts 0), Bookline's reserved headers
    excepted. Framing is the codec's business, not the user's."""
    size = 0 if payload is None else len(payload)
    if key is not None:
        size += len(key)
    if headers:
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        size += sum(
            len(k.encode()) + (0 if v is None else len(v))
            for k, v in pairs
            if not k.startswith(RESERVED_HEADER_PREFIX)
        )
    return size
