"""Pure tests of the Spark data source's option parsing and partition planning."""

from __future__ import annotations

import pytest

from foundation.errors import BadRequestError, TruncatedError
from pipeline.options import (
    EARLIEST,
    LATEST,
    parse_offsets,
    parse_sink_options,
    parse_source_options,
)
from pipeline.planning import (
    SegmentView,
    StreamView,
    cap_end_offsets,
    plan_slices,
    records_per_slice,
    resolve_range,
)

ZK = {"zk": "127.0.0.1:2181/local"}


def _view(first: int = 0, nxt: int = 300) -> StreamView:
    # Three segments of 100 records in 10 entries each; the last one in progress.
    return StreamView(
        "s",
        first,
        nxt,
        (
            SegmentView(1, 0, 100, 9),
            SegmentView(2, 100, 100, 9),
            SegmentView(3, 200, 0, -1),
        ),
    )


def test_options_follow_kafka_names_case_insensitively() -> None:
    opts = parse_source_options(
        {
            **ZK,
            "STREAM": "a",
            "startingOffsets": '{"a": 5}',
            "endingoffsets": "latest",
            "failOnDataLoss": "false",
            "minPartitions": "4",
            "maxRecordsPerTrigger": "1000",
        }
    )
    assert opts.selection.names == ("a",)
    assert opts.starting.value_for("a", 0, "a") == 5
    assert opts.starting.value_for("other", 0, "other") is None
    assert opts.ending.kind == "latest"
    assert not opts.fail_on_data_loss
    assert opts.min_partitions == 4
    assert opts.max_records_per_trigger == 1000


def test_topics_streams_and_patterns_are_exclusive_selections() -> None:
    assert parse_source_options({**ZK, "topic": "t1,t2"}).selection.names == ("t1", "t2")
    web = parse_source_options({**ZK, "streamPattern": "web-.*"}).selection
    assert web.kind == "stream_pattern" and web.matches("web-1") and not web.matches("xweb-1")
    with pytest.raises(BadRequestError, match="exactly one"):
        parse_source_options({**ZK, "stream": "a", "topic": "b"})
    with pytest.raises(BadRequestError, match="exactly one"):
        parse_source_options(ZK)
    with pytest.raises(BadRequestError, match="'zk' and 'cluster'"):
        parse_source_options({"stream": "a"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("soonest", "earliest"),
        ("[1, 2]", "object"),
        ('{"a": -3}', "sequence id"),
        ('{"a": "1"}', "sequence id"),
    ],
)
def test_bad_offsets_are_rejected_clearly(raw: str, message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        parse_offsets(raw, "startingOffsets", "earliest")


def test_ending_offsets_cannot_be_earliest() -> None:
    with pytest.raises(BadRequestError, match="earliest"):
        parse_source_options({**ZK, "stream": "a", "endingOffsets": '{"a": -2}'})


def test_sink_options() -> None:
    opts = parse_sink_options({**ZK, "topic": "out"})
    assert opts.topic == "out" and opts.stream is None
    assert opts.idempotent
    with pytest.raises(BadRequestError, match="at most one"):
        parse_sink_options({**ZK, "topic": "out", "stream": "s"})


def test_resolve_range_sentinels_and_data_loss() -> None:
    view = _view(first=50)
    assert resolve_range(view, None, None, fail_on_data_loss=True) == (50, 300)
    assert resolve_range(view, EARLIEST, LATEST, fail_on_data_loss=True) == (50, 300)
    assert resolve_range(view, LATEST, None, fail_on_data_loss=True) == (300, 300)
    assert resolve_range(view, 60, 70, fail_on_data_loss=True) == (60, 70)
    with pytest.raises(TruncatedError, match="failOnDataLoss"):
        resolve_range(view, 10, 70, fail_on_data_loss=True)
    assert resolve_range(view, 10, 70, fail_on_data_loss=False) == (50, 70)
    with pytest.raises(BadRequestError, match="beyond"):
        resolve_range(view, 0, 301, fail_on_data_loss=False)
    with pytest.raises(BadRequestError, match="after the end"):
        resolve_range(view, 80, 70, fail_on_data_loss=True)


def test_one_slice_per_segment_and_large_segments_split() -> None:
    view = _view()
    slices = plan_slices(
        [(view, 0, 300)], min_partitions=None, max_records=1000, fail_on_data_loss=True
    )
    assert [(s.seqno, s.seq_lo, s.seq_hi) for s in slices] == [
        (1, 0, 100),
        (2, 100, 200),
        (3, 200, 300),
    ]
    split = plan_slices(
        [(view, 0, 300)], min_partitions=6, max_records=1000, fail_on_data_loss=True
    )
    assert len(split) == 6
    assert [s.entry_hint for s in split[:2]] == [0, 5]
    assert sum(s.record_count for s in split) == 300
    part = plan_slices(
        [(view, 150, 210)], min_partitions=None, max_records=1000, fail_on_data_loss=True
    )
    assert [(s.seqno, s.seq_lo, s.seq_hi, s.entry_hint) for s in part] == [
        (2, 150, 200, 5),
        (3, 200, 210, 0),
    ]


def test_truncated_segments_fail_or_are_skipped() -> None:
    view = StreamView(
        "s", 0, 200, (SegmentView(1, 0, 100, 9, truncated=True), SegmentView(2, 100, 100, 9))
    )
    with pytest.raises(TruncatedError):
        plan_slices([(view, 0, 200)], min_partitions=None, max_records=1000, fail_on_data_loss=True)
    kept = plan_slices(
        [(view, 0, 200)], min_partitions=None, max_records=1000, fail_on_data_loss=False
    )
    assert [s.seqno for s in kept] == [2]


def test_records_per_slice() -> None:
    assert records_per_slice(1000, None, 300) == 300
    assert records_per_slice(1000, 10, 300) == 100
    assert records_per_slice(0, 10, 300) == 300


def test_admission_control_shares_the_budget_fairly() -> None:
    start = {"a": 0, "b": 0, "c": 10}
    latest = {"a": 5, "b": 1000, "c": 1000}
    assert cap_end_offsets(start, latest, None) == latest
    end = cap_end_offsets(start, latest, 100)
    assert end == {"a": 5, "b": 48, "c": 57}
    assert sum(end[s] - start[s] for s in end) == 100
    # A stream without backlog stays; the cap never moves an offset back.
    assert cap_end_offsets({"a": 7}, {"a": 7}, 10) == {"a": 7}
