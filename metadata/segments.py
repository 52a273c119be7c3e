"""A stream's segment list and its transitions, each one ZooKeeper transaction.

``streams/<ns>/<s>/segments/<seqno19>`` holds a :class:`SegmentMetadata`. Transitions
(open, seal + open next, truncate, delete) check every znode they depend on by version
in the same multi-op as their writes, so either all of it happens or none does: a
transition that fails halfway leaves the metadata exactly as it was.

A transition that opens a segment also checks that the segment's ledger still exists:
a writer's spare ledger (created in advance, tagged with :data:`TAG_STREAM` and
:data:`TAG_WRITER_LOCK`) may be collected as an orphan (:mod:`ledger.orphans`), and the
collector deletes it in a transaction that checks the stream's max-txid version, which
every opening bumps. So a segment never names a deleted ledger: whichever of the two
commits first makes the other fail.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from foundation.errors import BadRequestError, NotFoundError
from foundation.invariants import invariant
from metadata import serde
from metadata.layout import Layout, seqno_from_name
from metadata.streams import encode_max_txid
from metadata.zk import Watch, ZkClient

KIND = "segment"
FORMAT_VERSION = 1
# Custom tags of a stream's ledgers, written at creation (before any entry): the stream
# ("ns/stream") and the node name of the stream lock its writer held ("member-<seq>").
TAG_STREAM = "stream"
TAG_WRITER_LOCK = "writer-lock"

DLSN = tuple[int, int, int]  # (segment seqno, entry id, slot id)


class SegmentState(enum.Enum):
    IN_PROGRESS = "IN_PROGRESS"
    SEALED = "SEALED"


class TruncationState(enum.Enum):
    ACTIVE = "ACTIVE"
    PARTIALLY_TRUNCATED = "PARTIALLY_TRUNCATED"  # records before min_active_dlsn are gone
    TRUNCATED = "TRUNCATED"  # the whole segment is gone (ledger may await deletion)


@dataclass(frozen=True, slots=True)
class SegmentMetadata:
    seqno: int  # 1, 2, 3, ... in stream order
    ledger_id: int
    state: SegmentState = SegmentState.IN_PROGRESS
    first_txid: int = -1
    last_txid: int = -1
    last_entry_id: int = -1
    last_slot_id: int = -1
    record_count: int = 0
    start_sequence_id: int = 0  # stream-wide sequence id of the first record
    size_bytes: int = 0  # payload bytes in the segment
    ctime_ms: int = 0
    sealed_ms: int = 0  # 0 while in progress
    truncation: TruncationState = TruncationState.ACTIVE
    min_active_dlsn: DLSN = (0, 0, 0)  # (0, 0, 0): nothing truncated in this segment
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.seqno < 1 or self.ledger_id < 0:
            raise BadRequestError("segment seqno must be >= 1 and ledger_id >= 0")
        if self.record_count < 0 or self.size_bytes < 0 or self.last_entry_id < -1:
            raise BadRequestError("segment counters must not be negative")
        object.__setattr__(self, "min_active_dlsn", tuple(int(x) for x in self.min_active_dlsn))
        if len(self.min_active_dlsn) != 3:
            raise BadRequestError("min_active_dlsn must be (seqno, entry, slot)")

    @property
    def is_sealed(self) -> bool:
        return self.state is SegmentState.SEALED

    def sealed(
        self,
        *,
        last_txid: int,
        last_entry_id: int,
        last_slot_id: int,
        record_count: int,
        size_bytes: int,
        sealed_ms: int,
    ) -> SegmentMetadata:
        return dataclasses.replace(
            self,
            state=SegmentState.SEALED,
            last_txid=last_txid,
            last_entry_id=last_entry_id,
            last_slot_id=last_slot_id,
            record_count=record_count,
            size_bytes=size_bytes,
            sealed_ms=sealed_ms,
        )

    def with_truncation(self, truncation: TruncationState, min_active: DLSN) -> SegmentMetadata:
        return dataclasses.replace(self, truncation=truncation, min_active_dlsn=min_active)

    def encode(self) -> bytes:
        body = dataclasses.asdict(self)
        del body["format_version"]
        body["state"] = self.state.value
        body["truncation"] = self.truncation.value
        body["min_active_dlsn"] = list(self.min_active_dlsn)
        return serde.encode(KIND, FORMAT_VERSION, body)

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> SegmentMetadata:
        version, body = serde.decode(data, KIND, FORMAT_VERSION, where)
        known = {f.name for f in dataclasses.fields(cls)} - {"format_version"}
        kwargs = {k: v for k, v in body.items() if k in known}
        try:
            kwargs["state"] = SegmentState(serde.field(body, "state", str, where))
            kwargs["truncation"] = TruncationState(serde.field(body, "truncation", str, where))
            kwargs["min_active_dlsn"] = tuple(serde.field(body, "min_active_dlsn", list, where))
            return cls(format_version=version, **kwargs)
        except (TypeError, ValueError) as exc:
            raise serde.MetadataFormatError(f"segment metadata at {where} is malformed") from exc


Versioned = tuple[SegmentMetadata, int]


class SegmentStore:
    """Reads and single-transaction transitions of a stream's segment list."""

    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    async def list_segments(self, ns: str, stream: str) -> list[Versioned]:
        """All segments with their versions, ascending by seqno."""
        path = self._layout.segments(ns, stream)
        try:
            names = await self._zk.get_children(path)
        except NotFoundError as exc:
            raise NotFoundError(f"stream {ns}/{stream} does not exist") from exc
        out: list[Versioned] = []
        for name in sorted(names, key=seqno_from_name):
            try:
                out.append(await self.get_segment(ns, stream, seqno_from_name(name)))
            except NotFoundError:
                continue  # deleted (truncated away) while we listed
        return out

    async def get_segment(self, ns: str, stream: str, seqno: int) -> Versioned:
        path = self._layout.segment(ns, stream, seqno)
        data, version = await self._zk.get(path)
        return SegmentMetadata.decode(data, path), version

    async def watch_segment_list(self, ns: str, stream: str) -> Watch[list[str] | None]:
        """Children watch on the segment list (async-iterate it for new seqno lists)."""
        return await self._zk.watch_children(self._layout.segments(ns, stream))

    async def open_segment(
        self,
        ns: str,
        stream: str,
        segment: SegmentMetadata,
        *,
        max_txid: int,
        max_txid_version: int,
    ) -> None:
        """Create ``segment`` and set the stream's max txid (CAS) in one transaction."""
        invariant(not segment.is_sealed, "a new segment must be in progress")
        L = self._layout
        tx = self._zk.transaction()
        tx.create(L.segment(ns, stream, segment.seqno), segment.encode())
        tx.check(L.ledger(segment.ledger_id), -1)  # not collected meanwhile
        tx.set(L.max_txid(ns, stream), encode_max_txid(max_txid), max_txid_version)
        await tx.commit()

    async def seal_and_open(
        self,
        ns: str,
        stream: str,
        sealed: SegmentMetadata,
        sealed_version: int,
        next_segment: SegmentMetadata | None,
        *,
        max_txid: int,
        max_txid_version: int,
    ) -> None:
        """Seal a segment (CAS on its version), open the next one if given, set the max
        txid (CAS) — all in one transaction. Any stale version, an existing next
        segment or a missing node aborts the whole change."""
        invariant(sealed.is_sealed, "seal_and_open needs the segment in SEALED state")
        invariant(max_txid >= sealed.last_txid, "max txid %d below sealed last txid", max_txid)
        L = self._layout
        tx = self._zk.transaction()
        tx.set(L.segment(ns, stream, sealed.seqno), sealed.encode(), sealed_version)
        if next_segment is not None:
            invariant(
                next_segment.seqno == sealed.seqno + 1,
                "next segment %d must follow sealed %d",
                next_segment.seqno,
                sealed.seqno,
            )
            tx.create(L.segment(ns, stream, next_segment.seqno), next_segment.encode())
            tx.check(L.ledger(next_segment.ledger_id), -1)  # not collected meanwhile
        tx.set(L.max_txid(ns, stream), encode_max_txid(max_txid), max_txid_version)
        await tx.commit()

    async def delete_unreferenced_ledger(
        self, ns: str, stream: str, ledger_id: int, ledger_version: int, max_txid_version: int
    ) -> None:
        """Delete a ledger no segment of the stream references, unless a segment was
        opened since the caller read the max-txid version (BadVersionError) -- read it
        *before* listing the segments. Nothing happens unless all of it does."""
        L = self._layout
        tx = self._zk.transaction()
        tx.check(L.max_txid(ns, stream), max_txid_version)
        tx.delete(L.ledger(ledger_id), ledger_version)
        await tx.commit()

    async def update_segment(
        self, ns: str, stream: str, segment: SegmentMetadata, expected_version: int
    ) -> int:
        path = self._layout.segment(ns, stream, segment.seqno)
        return await self._zk.set(path, segment.encode(), expected_version)

    async def replace_ledger(
        self, ns: str, stream: str, segment: SegmentMetadata, expected_version: int
    ) -> None:
        """Point a sealed segment at a new ledger (compaction) in one transaction: the
        segment CAS on its version, the new ledger must exist, and the stream's max-txid
        version is bumped (same value) so an orphan collector that listed the segments
        before this cannot delete the ledger after it."""
        invariant(segment.is_sealed, "only a sealed segment's ledger is replaced")
        L = self._layout
        data, max_version = await self._zk.get(L.max_txid(ns, stream))
        tx = self._zk.transaction()
        tx.set(L.segment(ns, stream, segment.seqno), segment.encode(), expected_version)
        tx.check(L.ledger(segment.ledger_id), -1)
        tx.set(L.max_txid(ns, stream), data, max_version)
        await tx.commit()

    async def mark_truncated(self, ns: str, stream: str, updates: Sequence[Versioned]) -> None:
        """Write new truncation states of several segments (each CAS) in one transaction."""
        if not updates:
            return
        tx = self._zk.transaction()
        for segment, version in updates:
            tx.set(self._layout.segment(ns, stream, segment.seqno), segment.encode(), version)
        await tx.commit()

    async def delete_segments(
        self, ns: str, stream: str, segments: Sequence[tuple[int, int]]
    ) -> None:
        """Delete ``(seqno, version)`` segments in one transaction."""
        if not segments:
            return
        tx = self._zk.transaction()
        for seqno, version in segments:
            tx.delete(self._layout.segment(ns, stream, seqno), version)
        await tx.commit()
