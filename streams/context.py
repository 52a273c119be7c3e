"""What a namespace shares with its writers and readers: one ZooKeeper session, one
ledger client, the config, the clock, and a small cache of sealed ledgers' readers.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from foundation.errors import NoLedgerError, TruncatedError
from ledger.client import LedgerClient
from ledger.reader import LedgerReader
from metadata.client import MetadataClient
from metadata.segments import SegmentMetadata, TruncationState
from streams.config import NamespaceConfig

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class CoreContext:
    md: MetadataClient
    ledgers: LedgerClient
    namespace: str
    config: NamespaceConfig
    clock_ms: Callable[[], int] = wall_clock_ms
    _sealed_readers: collections.OrderedDict[int, LedgerReader] = field(
        default_factory=collections.OrderedDict
    )

    async def segments(self, stream: str) -> list[tuple[SegmentMetadata, int]]:
        return await self.md.segments.list_segments(self.namespace, stream)

    async def open_segment_reader(self, segment: SegmentMetadata) -> LedgerReader:
        """A non-recovering reader of a segment's ledger; sealed ones are cached (their
        ledgers are closed, so a reader never goes stale)."""
        if segment.truncation is TruncationState.TRUNCATED:
            raise TruncatedError(f"segment {segment.seqno} was truncated")
        cached = self._sealed_readers.get(segment.ledger_id)
        if cached is not None:
            self._sealed_readers.move_to_end(segment.ledger_id)
            return cached
        try:
            reader = await self.ledgers.open_ledger(
                segment.ledger_id, self.config.password_bytes, recover=False
            )
        except NoLedgerError as exc:
            raise TruncatedError(
                f"segment {segment.seqno}: ledger {segment.ledger_id} was deleted"
            ) from exc
        if segment.is_sealed and not reader.is_closed:
            # Only a compactor before the swap closed its ledgers for sure left this
            # (its writer failed after the adds and closed locally only): every entry up
            # to the segment's last was acknowledged before the swap, but the bookies'
            # LAC may be -1.
            log.warning("segment %d: its ledger %d is not closed; reading to entry %d",
                        segment.seqno, segment.ledger_id, segment.last_entry_id)  # fmt: skip
            reader.assume_confirmed(segment.last_entry_id)
        if segment.is_sealed and reader.is_closed:
            self._sealed_readers[segment.ledger_id] = reader
            while len(self._sealed_readers) > self.config.open_ledgers_max:
                self._sealed_readers.popitem(last=False)
        return reader

    def forget_ledger(self, ledger_id: int) -> None:
        self._sealed_readers.pop(ledger_id, None)
