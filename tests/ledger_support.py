"""Ledgers for tests that talk to bookie processes directly: a bookie takes the first add
or fence of a ledger only when the ledger exists in metadata and the request carries its
key (bookie/access.py), so such a test registers its ledgers first."""

from __future__ import annotations

from foundation.config import MetadataConfig
from metadata.client import MetadataClient
from metadata.ledger_metadata import LedgerMetadata, Segment, master_key_check


def keyed_metadata(ledger_id: int, key: bytes, bookie_id: str = "b") -> LedgerMetadata:
    """Metadata of a one-bookie ledger whose master key is ``key`` (used as it is: the
    key check is of ``key`` itself, no password behind it)."""
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=1,
        write_quorum=1,
        ack_quorum=1,
        segments=(Segment(0, (bookie_id,)),),
        key_check=master_key_check(key),
    )


async def register_ledgers(zk: str, root: str, key: bytes, *ledger_ids: int) -> None:
    """Create the metadata of ``ledger_ids`` under cluster ``root`` (created if new),
    each with master key ``key``."""
    md = MetadataClient(MetadataConfig(zk=zk, root=root))
    await md.connect()
    try:
        await md.init_cluster()
        for ledger_id in ledger_ids:
            await md.ledgers.create(keyed_metadata(ledger_id, key))
    finally:
        await md.close()
