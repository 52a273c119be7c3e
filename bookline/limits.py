"""Limits every layer agrees on, in one place (a leaf: imports nothing of ours).

``RECORD_BYTES_MAX`` is the largest record payload (value + key + headers as encoded)
that Bookline accepts end to end: the thin client refuses bigger records before sending,
the write proxy answers 413 ``TOO_LARGE``, and the core writer raises ``TooLargeError``.
One number, so a record the client accepts is never refused further down.
"""

from __future__ import annotations

from typing import Final

MiB: Final = 1024 * 1024

# 1 MiB: Kafka's default ``max.message.bytes`` is about the same, and a record this size
# still fits a ledger entry (``LedgerConfig.entry_bytes_max``, 4 MiB) with room for a
# record set's framing.
RECORD_BYTES_MAX: Final = 1 * MiB
