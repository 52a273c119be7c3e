"""Closing a ledger in metadata: CLOSED with the writer's last entry and length.

The writer records the close by compare-and-set. A lost CAS re-reads: a ledger another
client already closed at the same entry is accepted (a recoverer closed it where the
writer would have); closed elsewhere, or being recovered, means the writer was fenced
out and its view of the end is not the ledger's (FencedError).
"""

from __future__ import annotations

from foundation.errors import BadVersionError, FencedError, MetadataError
from ledger.interfaces import MetadataStore
from metadata.ledger_metadata import LedgerMetadata, LedgerState

__all__ = ["record_closed"]


async def record_closed(
    store: MetadataStore,
    meta: LedgerMetadata,
    version: int,
    *,
    last_entry_id: int,
    length: int,
    retries: int,
) -> tuple[LedgerMetadata, int]:
    """Store ``meta`` (at ``version``) CLOSED at ``last_entry_id`` with ``length``
    payload bytes; return the closed metadata and its version."""
    ledger_id = meta.ledger_id
    for _attempt in range(retries):
        closed = meta.closed(last_entry_id, length)
        try:
            return closed, await store.write(closed, version)
        except BadVersionError:
            meta, version = await store.read(ledger_id)
        if meta.state is LedgerState.CLOSED:
            if meta.last_entry_id == last_entry_id:
                return meta, version  # a recoverer closed it where we would have
            raise FencedError(
                f"ledger {ledger_id} was closed by another client at "
                f"entry {meta.last_entry_id}, writer had {last_entry_id}"
            )
        if meta.state is LedgerState.IN_RECOVERY:
            raise FencedError(f"ledger {ledger_id} is being recovered by another client")
    raise MetadataError(f"ledger {ledger_id}: close lost the CAS repeatedly")
