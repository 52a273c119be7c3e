"""Pure tests of the Spark connector's options (strict, Kafka's names), offsets, docs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from foundation.errors import BadRequestError
from pipeline.options import parse_sink_options, parse_source_options

ZK = {"zk": "127.0.0.1:2181/local"}
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("option", "suggestion"),
    [
        ("startingOffset", "startingOffsets"),
        ("endingOffset", "endingOffsets"),
        ("failOnDataLos", "failOnDataLoss"),
        ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
        ("subscribePatern", "subscribePattern"),
    ],
)
def test_an_unknown_read_option_is_an_error_that_names_the_right_one(
    option: str, suggestion: str
) -> None:
    with pytest.raises(BadRequestError, match=f"did you mean '{suggestion}'"):
        parse_source_options({**ZK, "stream": "a", option: "1"})


def test_an_unknown_write_option_and_kafka_client_settings_are_errors() -> None:
    with pytest.raises(BadRequestError, match="did you mean 'createStreams'"):
        parse_sink_options({**ZK, "stream": "a", "createStream": "false"})
    with pytest.raises(BadRequestError, match="Kafka client setting"):
        parse_source_options({**ZK, "subscribe": "t", "kafka.bootstrap.servers": "h:9092"})
    # Spark's own options pass.
    parse_sink_options({**ZK, "stream": "a", "checkpointLocation": "/tmp/x", "path": "p"})


def test_kafka_option_names_have_kafkas_meaning() -> None:
    opts = parse_source_options(
        {
            **ZK,
            "subscribe": "t1,t2",
            "startingOffsets": '{"t1": {"0": 23, "1": -2}, "t2": {"0": -1}}',
            "maxOffsetsPerTrigger": "1000",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
            "includeHeaders": "true",
            "failOnDataLoss": "false",
        },
        streaming=True,
    )
    assert opts.selection.kind == "topics" and opts.selection.names == ("t1", "t2")
    assert opts.starting.value_for("t1", 0, "t1~0") == 23
    assert opts.starting.value_for("t1", 1, "t1~1") == -2
    assert opts.starting.value_for("t1", 2, "t1~2") is None
    assert opts.max_records_per_trigger == 1000
    assert opts.min_records_per_trigger == 10
    assert opts.max_trigger_delay_ms == 30_000
    assert opts.include_headers and not opts.fail_on_data_loss

    pattern = parse_source_options({**ZK, "subscribePattern": "logs-.*"})
    assert pattern.selection.matches("logs-eu") and not pattern.selection.matches("x-logs-eu")
    assign = parse_source_options({**ZK, "assign": '{"t": [1, 0]}'})
    assert assign.selection.assign == (("t", (0, 1)),)
    by_ts = parse_source_options(
        {
            **ZK,
            "topic": "t",
            "startingOffsetsByTimestamp": '{"t": {"0": 1700000000000}}',
            "endingTimestamp": "1800000000000",
        }
    )
    assert by_ts.starting_by_timestamp is not None
    assert by_ts.starting_by_timestamp.value_for("t", 0, "t~0") == 1_700_000_000_000
    assert by_ts.ending_timestamp_ms == 1_800_000_000_000
    # Kafka's default: no headers column unless asked for.
    assert not parse_source_options({**ZK, "topic": "t"}).include_headers


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"stream": "a", "subscribe": "t"}, "exactly one"),
        ({"stream": "a", "endingOffsets": "earliest"}, "cannot be 'earliest'"),
        ({"stream": "a", "startingOffsets": "latest"}, "cannot be 'latest'"),
        ({"stream": "a", "assign": "[1]"}, "exactly one"),
        ({"assign": '{"t": []}'}, "list of partitions"),
        ({"stream": "a", "maxTriggerDelay": "soon"}, "duration"),
        ({"stream": "a", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "larger"),
        ({"stream": "a", "startingOffsetsByTimestampStrategy": "never"}, "'error' or 'latest'"),
        ({"stream": "a", "bookline.pasword": "x"}, "did you mean 'bookline.password'"),
        ({"stream": "a", "bookline.digest_type": "md5"}, "digest_type"),
        ({"stream": "a", "minPartitions": "0"}, "must be >= 1"),
    ],
)
def test_bad_read_options_are_refused(options: dict[str, str], match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        parse_source_options({**ZK, **options})


def test_ending_options_are_refused_for_a_streaming_read() -> None:
    with pytest.raises(BadRequestError, match="a stream has no end"):
        parse_source_options({**ZK, "stream": "a", "endingOffsets": "latest"}, streaming=True)
    # ...and a streaming read starts at latest unless told otherwise.
    assert parse_source_options({**ZK, "stream": "a"}, streaming=True).starting.kind == "latest"


def test_client_settings_pass_through_to_the_namespace_config() -> None:
    from pipeline.options import namespace_config

    opts = parse_source_options(
        {
            **ZK,
            "stream": "a",
            "bookline.digest_type": "hmac",
            "bookline.password": "s3cret",
            "bookline.session_timeout_ms": "20000",
            "bookline.ledger.read_timeout_ms": "7000",
        }
    )
    config: Any = namespace_config(opts.connection)
    assert config.digest_type == "hmac" and config.password == "s3cret"
    assert config.session_timeout_ms == 20_000
    assert config.ledger.read_timeout_ms == 7_000
    assert namespace_config(parse_source_options({**ZK, "stream": "a"}).connection) is None


def test_streaming_offsets_are_kafkas_per_partition_json() -> None:
    from pipeline.planning import TopicPartition, decode_offsets, encode_offsets

    offsets = {TopicPartition("t", 0, "t~0"): 23, TopicPartition("t", 1, "t~1"): 5}
    offsets[TopicPartition("plain", 0, "plain")] = 7
    encoded = encode_offsets(offsets)
    assert encoded == {"t": {"0": 23, "1": 5}, "plain": 7}
    assert decode_offsets(encoded) == {"t~0": 23, "t~1": 5, "plain": 7}
    assert TopicPartition.of_stream("t~3") == TopicPartition("t", 3, "t~3")
    assert TopicPartition.of_stream("s") == TopicPartition("s", 0, "s")


def test_records_behind_comes_from_the_progress_offsets() -> None:
    pytest.importorskip("pyspark")
    from pipeline.source import records_behind

    source = {"endOffset": '{"t": {"0": 10, "1": 4}}', "latestOffset": '{"t": {"0": 15, "1": 4}}'}
    assert records_behind(source) == 5


# -- docs (issue 18, defect 10) -----------------------------------------------------


def _spark_section(text: str) -> str:
    start = text.index("## Spark pipeline")
    end = text.find("\n## ", start + 5)
    return text[start : end if end > 0 else len(text)]


def test_the_readme_write_example_says_append_and_the_docs_agree_on_arrow() -> None:
    from pipeline.options import ARROW_DEFAULT

    section = _spark_section((ROOT / "README.md").read_text())
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    writes = [b for b in blocks if '.write.format("bookline")' in b]
    assert writes, "the README's Spark section has no write example"
    assert all('.mode("append")' in b for b in writes), "Spark's default mode fails"
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    wrong = "`arrow=true`, default" if not ARROW_DEFAULT else "`arrow=false`, default"
    assert wrong not in bench, f"docs/benchmarks.md says {wrong}"


# -- defect 6: the demo waits on offsets, not on the last 100 progress entries ---------


class _CappedQuery:
    """A streaming query 150 micro-batches in: Spark's recentProgress keeps only 100."""

    name = "fake"

    def __init__(self) -> None:
        self.stopped = False
        progress = [
            {
                "batchId": b,
                "numInputRows": 10,
                "sources": [{"endOffset": f'{{"s": {10 * b + 10}}}'}],
            }
            for b in range(150)
        ]
        progress.append({"batchId": 150, "numInputRows": 0,
                         "sources": [{"endOffset": '{"s": 1500}'}]})  # fmt: skip
        self.recentProgress = progress[-100:]
        self.lastProgress = progress[-1]

    def exception(self) -> None:
        return None

    def stop(self) -> None:
        self.stopped = True


def test_the_demo_sees_a_query_past_100_micro_batches_caught_up() -> None:
    from pipeline.examples.jobs import stop_when_caught_up

    query = _CappedQuery()
    assert stop_when_caught_up([query], 1_500, timeout_s=1.0) >= 99
    assert query.stopped
