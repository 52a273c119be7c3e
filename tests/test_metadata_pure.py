"""Pure tests (no ZooKeeper) of the metadata codecs, records and znode layout."""

from __future__ import annotations

import msgpack
import pytest

from foundation.errors import BadRequestError, ConfigError, InvalidNameError, ProtocolVersionError
from metadata import serde
from metadata.bookies import BookieInfo, Cookie
from metadata.layout import Layout, ledger_id_hex, seqno_from_name, seqno_name
from metadata.ledger_metadata import DigestType, LedgerMetadata, LedgerState, Segment
from metadata.segments import SegmentMetadata, SegmentState, TruncationState
from metadata.streams import StreamOptions, StreamRecord


def ledger(**kw: object) -> LedgerMetadata:
    base: dict[str, object] = {
        "ledger_id": 7,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "segments": (Segment(0, ("b1", "b2", "b3")),),
        "password": b"secret",
    }
    base.update(kw)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


# -- serde ------------------------------------------------------------------------------


def test_serde_roundtrip_keeps_bytes_and_version() -> None:
    data = serde.encode("thing", 2, {"a": 1, "b": b"\x00\xff", "c": [1, "x"]})
    assert serde.decode(data, "thing", 3) == (2, {"a": 1, "b": b"\x00\xff", "c": [1, "x"]})


def test_serde_rejects_newer_version_clearly() -> None:
    data = serde.encode("thing", 5, {})
    with pytest.raises(ProtocolVersionError, match="format version 5, newer than the 1"):
        serde.decode(data, "thing", 1, "/x")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1garbage",
        msgpack.packb({"not": "ours"}),
        msgpack.packb(["XX", "thing", 1, {}]),
        msgpack.packb(["BL", "thing", 0, {}]),
        msgpack.packb(["BL", "thing", 1, []]),
    ],
)
def test_serde_rejects_foreign_or_corrupt_bytes(data: bytes) -> None:
    with pytest.raises(serde.MetadataFormatError):
        serde.decode(data, "thing", 1)


def test_serde_rejects_wrong_kind_and_oversize() -> None:
    with pytest.raises(serde.MetadataFormatError, match="holds 'other'"):
        serde.decode(serde.encode("other", 1, {}), "thing", 1)
    with pytest.raises(serde.MetadataFormatError, match="fit a znode"):
        serde.encode("thing", 1, {"x": b"0" * (serde.VALUE_BYTES_MAX + 1)})


def test_serde_field_checks_type() -> None:
    with pytest.raises(serde.MetadataFormatError, match="lacks 'n'"):
        serde.field({}, "n", int)
    with pytest.raises(serde.MetadataFormatError, match="type bool"):
        serde.field({"n": True}, "n", int)


# -- layout -----------------------------------------------------------------------------


def test_ledger_paths_are_hierarchical_and_invertible() -> None:
    layout = Layout("/bookline/c1")
    path = layout.ledger(0x0123456789ABCDEF)
    assert path == "/bookline/c1/ledgers/L/0123/4567/89ab/Lcdef"
    assert layout.ledger_id_from_path(path) == 0x0123456789ABCDEF
    assert layout.ledger(1).endswith("/0000/0000/0000/L0001")
    assert ledger_id_hex((1 << 63) - 1) == "7fffffffffffffff"
    with pytest.raises(BadRequestError):
        layout.ledger(1 << 63)
    with pytest.raises(BadRequestError):
        layout.ledger(-1)


def test_stream_paths_validate_names() -> None:
    layout = Layout("/r")
    assert layout.segment("ns", "s", 3) == "/r/streams/ns/s/segments/0000000000000000003"
    assert layout.subscriber("ns", "s", "sub") == "/r/streams/ns/s/subscribers/sub"
    assert layout.owner("ns", "s") == "/r/owners/ns/s"
    for bad in ("..", "a/b", ".x", "<y", "n\x00"):
        with pytest.raises(InvalidNameError):
            layout.stream("ns", bad)
        with pytest.raises(InvalidNameError):
            layout.bookie_available(bad)


def test_layout_root_must_be_absolute() -> None:
    for bad in ("rel", "/trailing/", "/a/../b"):
        with pytest.raises((ConfigError, InvalidNameError)):
            Layout(bad)
    assert Layout("/").instance_id == "/INSTANCEID"


def test_seqno_names_sort_as_numbers() -> None:
    names = [seqno_name(n) for n in (10, 9, 100, 1)]
    assert sorted(names) == [seqno_name(n) for n in (1, 9, 10, 100)]
    assert seqno_from_name(seqno_name(42)) == 42
    with pytest.raises(BadRequestError):
        seqno_name(0)


# -- records ----------------------------------------------------------------------------


def test_ledger_metadata_validates_quorums() -> None:
    for e, qw, qa in ((2, 3, 1), (3, 2, 3), (3, 3, 0)):
        with pytest.raises(BadRequestError, match="ensemble_size >= write_quorum"):
            ledger(ensemble_size=e, write_quorum=qw, ack_quorum=qa)
    with pytest.raises(BadRequestError, match="distinct"):
        ledger(segments=(Segment(0, ("b1", "b1", "b3")),))
    with pytest.raises(BadRequestError, match="digest_type"):
        ledger(digest_type="md5")


def test_ledger_metadata_ensembles_and_copies() -> None:
    md = ledger().with_segment(10, ("b1", "b4", "b3"))
    assert md.ensemble_for(9) == ("b1", "b2", "b3")
    assert md.ensemble_for(10) == ("b1", "b4", "b3")
    assert md.replicas(11) == ("b3", "b1")
    replaced = md.with_segment(10, ("b5", "b4", "b3"))
    assert len(replaced.segments) == 2
    assert replaced.ensemble_for(12)[0] == "b5"
    with pytest.raises(BadRequestError, match="before the last"):
        md.with_segment(5, ("b1", "b2", "b3"))
    closed = md.closed(last_entry_id=20, length=999)
    assert closed.is_closed
    assert closed.last_entry_id == 20
    with pytest.raises(BadRequestError, match="closed"):
        closed.with_segment(21, ("b1", "b2", "b3"))
    # Closing drops trailing segments that hold no entry.
    assert ledger().with_segment(10, ("b1", "b4", "b3")).closed(9, 5).segments == (
        Segment(0, ("b1", "b2", "b3")),
    )


def test_ledger_metadata_roundtrip() -> None:
    md = ledger(
        state=LedgerState.IN_RECOVERY,
        custom={"app": b"x"},
        ctime_ms=5,
        digest_type=DigestType.HMAC_SHA256,
    ).with_segment(3, ("b2", "b3", "b4"))
    again = LedgerMetadata.decode(md.encode(), "/l")
    assert again == md
    assert again.password == b"secret"
    assert again.custom["app"] == b"x"
    assert again.digest_type is DigestType.HMAC_SHA256


def test_segment_and_stream_roundtrip() -> None:
    seg = SegmentMetadata(seqno=4, ledger_id=9, first_txid=100, ctime_ms=1).sealed(
        last_txid=150,
        last_entry_id=7,
        last_slot_id=2,
        record_count=51,
        size_bytes=4096,
        sealed_ms=2,
    )
    seg = seg.with_truncation(TruncationState.PARTIALLY_TRUNCATED, (4, 3, 0))
    again = SegmentMetadata.decode(seg.encode(), "/s")
    assert again == seg
    assert again.state is SegmentState.SEALED
    rec = StreamRecord("ns", "s", StreamOptions(retention_ms=1000), 3)
    assert StreamRecord.decode(rec.encode()) == rec
    with pytest.raises(BadRequestError):
        StreamOptions(retention_ms=0)


def test_bookie_and_cookie_records() -> None:
    info = BookieInfo("b1", "127.0.0.1:3181", rack="/r1", disk_usage=0.5)
    assert BookieInfo.decode(info.encode()) == info
    with pytest.raises(BadRequestError):
        BookieInfo("b1", "a", state="broken")
    a = Cookie("i1", "/j", "/l", "/x")
    b = Cookie("i2", "/j", "/l2", "/x")
    assert Cookie.decode(a.encode()) == a
    assert a.differences(b) == [
        "instance_id: stored 'i1', given 'i2'",
        "ledgers_dir: stored '/l', given '/l2'",
    ]
