"""The names both clients answer in: what a stream holds (:class:`StreamInfo`,
:class:`SegmentInfo`), what a topic is asked to be (:class:`TopicOptions`) and what a
topic holds (:class:`TopicInfo`, :class:`PartitionInfo`).

They live here, on the lowest floor both clients stand on, so the core library
(:class:`~streams.namespace.Namespace`, ``groups.topics.TopicAdmin``) and the thin
client (``thinclient.ProxyClient``, over the proxies' HTTP API) hand back the same
dataclasses for the same call. A topic's record is
:class:`metadata.topics.TopicRecord` for both. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from metadata.segments import SegmentMetadata, TruncationState
from metadata.streams import StreamOptions
from metadata.topic_configs import OPTION_CONFIGS, EffectiveConfig
from streams.dlsn import DLSN

__all__ = ["PartitionInfo", "SegmentInfo", "StreamInfo", "TopicInfo", "TopicOptions"]


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    seqno: int
    ledger_id: int
    state: str  # "in_progress" | "sealed"
    first_txid: int
    last_txid: int
    last_entry_id: int  # in progress: the LAC (what readers may read now)
    record_count: int
    start_sequence_id: int
    size_bytes: int
    ctime_ms: int
    truncated: bool  # wholly truncated (its records are gone)
    min_active_dlsn: DLSN | None = None  # partially truncated: first record kept
    last_slot_id: int = -1  # slot of the last record of the last entry

    @classmethod
    def from_metadata(cls, seg: SegmentMetadata) -> SegmentInfo:
        return cls(
            seqno=seg.seqno,
            ledger_id=seg.ledger_id,
            state="sealed" if seg.is_sealed else "in_progress",
            first_txid=seg.first_txid,
            last_txid=seg.last_txid,
            last_entry_id=seg.last_entry_id,
            record_count=seg.record_count,
            start_sequence_id=seg.start_sequence_id,
            size_bytes=seg.size_bytes,
            ctime_ms=seg.ctime_ms,
            truncated=seg.truncation is TruncationState.TRUNCATED,
            min_active_dlsn=DLSN(*seg.min_active_dlsn)
            if seg.truncation is TruncationState.PARTIALLY_TRUNCATED
            else None,
            last_slot_id=seg.last_slot_id,
        )

    @property
    def last_dlsn(self) -> DLSN | None:
        """DLSN of the last slot (control records included) or None when empty."""
        if self.last_entry_id < 0:
            return None
        return DLSN(self.seqno, self.last_entry_id, max(self.last_slot_id, 0))


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    segments: list[SegmentInfo]
    record_count: int  # readable records (after truncation)
    size_bytes: int
    first_dlsn: DLSN | None
    last_dlsn: DLSN | None
    first_txid: int | None
    last_txid: int | None
    first_sequence_id: int  # of the oldest readable record
    next_sequence_id: int  # the sequence id the next record will get


@dataclass(frozen=True, slots=True)
class TopicOptions:
    """What a new topic's partition streams keep and how they are replicated; every
    field optional (None: no limit, or the namespace's / proxy's default). Quorums not
    given are filled from the defaults when any is given (see ``stream_options``)."""

    retention_ms: int | None = None  # drop sealed segments older than this
    retention_bytes: int | None = None  # keep at most this many bytes per partition
    segment_rollover_bytes: int | None = None  # roll a partition's segment past this size
    segment_rollover_ms: int | None = None  # roll a partition's segment past this age
    ensemble_size: int | None = None  # bookies per ledger
    write_quorum: int | None = None  # copies of each entry
    ack_quorum: int | None = None  # copies acknowledged before a write is

    def given(self) -> dict[str, int]:
        """The options set, by name (what a create body carries)."""
        return {
            f.name: value
            for f in dataclasses.fields(self)
            if (value := getattr(self, f.name)) is not None
        }

    def configs(self) -> dict[str, int]:
        """The options set, by their topic configs' Kafka names (``retention.ms``, ...):
        these options are aliases of those configs."""
        return {OPTION_CONFIGS[name]: value for name, value in self.given().items()}

    def stream_options(self, quorum_defaults: tuple[int, int, int]) -> StreamOptions:
        """The partition streams' options; when any quorum is given the others come
        from ``quorum_defaults`` (ensemble, write, ack); StreamOptions checks the
        values (positive, E >= Qw >= Qa: BAD_REQUEST)."""
        e, w, a = self.ensemble_size, self.write_quorum, self.ack_quorum
        if (e, w, a) != (None, None, None):
            e = quorum_defaults[0] if e is None else e
            w = quorum_defaults[1] if w is None else w
            a = quorum_defaults[2] if a is None else a
        return StreamOptions(
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
            segment_rollover_bytes=self.segment_rollover_bytes,
            segment_rollover_ms=self.segment_rollover_ms,
            ensemble_size=e,
            write_quorum=w,
            ack_quorum=a,
        )


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    stream: str  # "t~p"
    start_offset: int  # the oldest offset still readable (after retention/truncation)
    end_offset: int  # the offset the next record gets (= records ever written)
    size_bytes: int  # payload bytes still stored
    segments: int
    # The write proxy owning the partition stream (thin client); None: none does, or
    # the core library (which has no proxies).
    owner: str | None = None

    @property
    def record_count(self) -> int:
        return self.end_offset - self.start_offset


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: list[PartitionInfo]
    options: StreamOptions
    ctime_ms: int
    # Every config's effective value and its source, "topic" or "default"
    # (metadata.topic_configs), in the table's order.
    configs: tuple[EffectiveConfig, ...] = ()

    @property
    def record_count(self) -> int:
        return sum(p.end_offset - p.start_offset for p in self.partitions)

    @property
    def size_bytes(self) -> int:
        return sum(p.size_bytes for p in self.partitions)
