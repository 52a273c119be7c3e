"""Topic configs by Kafka's names (issue 24, 5), pure: the table's checks and canonical
values, what each config makes of the partition streams, every config's source, old
records without configs, and the HTTP bodies that carry them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from foundation.errors import BadRequestError, InvalidConfigError, UnknownConfigError
from foundation.limits import RECORD_BYTES_MAX
from httpapi import topics as topic_wire
from metadata import serde
from metadata.streams import StreamOptions
from metadata.topic_configs import (
    CONFIGS,
    OPTION_CONFIGS,
    EffectiveConfig,
    NamespaceDefaults,
    check_configs,
    compaction_configs,
    effective,
    merge_configs,
    stream_options,
)
from metadata.topics import FORMAT_VERSION, TOPIC_KIND, TopicRecord
from ops.cli import topic as topic_cli
from streams.vocabulary import TopicOptions

DEFAULTS = NamespaceDefaults(256 << 20, 3_600_000, (3, 3, 2))
ISSUE_CONFIGS = (
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "segment.ms",
    "segment.bytes",
    "message.timestamp.type",
    "max.message.bytes",
    "min.compaction.lag.ms",
    "delete.retention.ms",
    "min.cleanable.dirty.ratio",
)


def test_the_table_has_the_issues_configs_and_bookline_quorums() -> None:
    assert set(ISSUE_CONFIGS) < set(CONFIGS)
    quorums = {"bookline.ensemble.size", "bookline.write.quorum", "bookline.ack.quorum"}
    assert quorums < set(CONFIGS)
    for spec in CONFIGS.values():
        assert spec.meaning and spec.applied, spec.name
        if spec.default is not None:  # a constant default passes its own check
            assert check_configs({spec.name: spec.default}) == {spec.name: spec.default}


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ({"cleanup.policy": "delete, compact"}, {"cleanup.policy": "compact,delete"}),
        ({"cleanup.policy": "compact"}, {"cleanup.policy": "compact"}),
        ({"retention.ms": 60_000}, {"retention.ms": "60000"}),
        ({"retention.ms": "-1"}, {"retention.ms": "-1"}),
        ({"retention.bytes": " 1024 "}, {"retention.bytes": "1024"}),
        ({"message.timestamp.type": "LogAppendTime"}, {"message.timestamp.type": "LogAppendTime"}),
        ({"min.cleanable.dirty.ratio": "0.25"}, {"min.cleanable.dirty.ratio": "0.25"}),
        ({"min.cleanable.dirty.ratio": 1}, {"min.cleanable.dirty.ratio": "1.0"}),
        ({"max.message.bytes": str(RECORD_BYTES_MAX)}, {"max.message.bytes": "1048576"}),
        ({"min.compaction.lag.ms": "0"}, {"min.compaction.lag.ms": "0"}),
    ],
)
def test_values_are_checked_and_kept_canonical(
    given: dict[str, object], canonical: dict[str, str]
) -> None:
    assert check_configs(given) == canonical


def test_an_unknown_name_is_unknown_config_listing_the_known_ones() -> None:
    with pytest.raises(UnknownConfigError) as caught:
        check_configs({"retention.mss": "1"})
    assert caught.value.code == 53
    for name in CONFIGS:
        assert name in caught.value.message
    assert isinstance(caught.value, InvalidConfigError)  # and a BAD_REQUEST
    assert isinstance(caught.value, BadRequestError)


@pytest.mark.parametrize(
    "bad",
    [
        {"cleanup.policy": "compacted"},
        {"cleanup.policy": ""},
        {"cleanup.policy": 1},
        {"retention.ms": "0"},
        {"retention.ms": "-2"},
        {"retention.ms": "1h"},
        {"retention.ms": 1.5},
        {"retention.ms": True},
        {"retention.bytes": str(1 << 63)},
        {"segment.bytes": "0"},
        {"segment.ms": "-1"},  # no "no limit" for a roll
        {"message.timestamp.type": "createtime"},
        {"max.message.bytes": str(RECORD_BYTES_MAX + 1)},
        {"max.message.bytes": "0"},
        {"min.compaction.lag.ms": "-1"},
        {"delete.retention.ms": "x"},
        {"min.cleanable.dirty.ratio": "1.5"},
        {"min.cleanable.dirty.ratio": "nan"},
        {"min.cleanable.dirty.ratio": "half"},
        {"bookline.ensemble.size": "0"},
    ],
)
def test_a_bad_value_is_invalid_config(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidConfigError) as caught:
        check_configs(bad)
    assert caught.value.code == 52
    assert next(iter(bad)) in caught.value.message


def test_configs_make_the_partition_streams_options() -> None:
    configs = check_configs({
        "retention.ms": "60000",
        "retention.bytes": "-1",
        "segment.bytes": "4096",
        "segment.ms": "1000",
        "max.message.bytes": "1000",
        "bookline.write.quorum": "2",
    })  # fmt: skip
    assert stream_options(configs, DEFAULTS) == StreamOptions(
        retention_ms=60_000,
        retention_bytes=None,  # -1: no limit
        segment_rollover_bytes=4096,
        segment_rollover_ms=1000,
        ensemble_size=3,  # the others from the namespace, once any quorum is set
        write_quorum=2,
        ack_quorum=2,
        record_bytes_max=1000,
    )
    assert stream_options({}, DEFAULTS) == StreamOptions()


def test_retention_applies_only_with_cleanup_policy_delete() -> None:
    base = {"retention.ms": "60000", "retention.bytes": "100000"}
    compact = stream_options(check_configs({**base, "cleanup.policy": "compact"}), DEFAULTS)
    assert (compact.retention_ms, compact.retention_bytes) == (None, None)
    both = stream_options(check_configs({**base, "cleanup.policy": "compact,delete"}), DEFAULTS)
    assert (both.retention_ms, both.retention_bytes) == (60_000, 100_000)


def test_quorums_that_break_the_rule_are_invalid_config() -> None:
    with pytest.raises(InvalidConfigError, match="ensemble_size >= write_quorum"):
        stream_options(check_configs({"bookline.ack.quorum": "3", "bookline.write.quorum": "2"}),
                       DEFAULTS)  # fmt: skip
    with pytest.raises(InvalidConfigError):
        stream_options(check_configs({"bookline.write.quorum": "4"}), DEFAULTS)  # E=3


def test_effective_names_every_config_with_its_source() -> None:
    configs = check_configs({"cleanup.policy": "compact", "bookline.write.quorum": "2"})
    shown = effective(configs, DEFAULTS)
    assert [c.name for c in shown] == list(CONFIGS)
    by = {c.name: c for c in shown}
    assert by["cleanup.policy"] == EffectiveConfig("cleanup.policy", "compact", "topic")
    assert by["bookline.write.quorum"].source == "topic"
    assert by["bookline.ensemble.size"] == EffectiveConfig("bookline.ensemble.size", "3", "default")
    assert by["bookline.ack.quorum"].value == "2"
    assert by["segment.bytes"] == EffectiveConfig("segment.bytes", str(256 << 20), "default")
    assert by["retention.ms"] == EffectiveConfig("retention.ms", "-1", "default")
    assert by["max.message.bytes"].value == str(RECORD_BYTES_MAX)
    assert by["message.timestamp.type"].value == "CreateTime"


def test_merge_sets_and_deletes() -> None:
    current = {"retention.ms": "1000", "cleanup.policy": "compact"}
    merged = merge_configs(current, {"segment.ms": 5000}, delete=["retention.ms"])
    assert merged == {"cleanup.policy": "compact", "segment.ms": "5000"}
    with pytest.raises(UnknownConfigError):
        merge_configs(current, {}, delete=["retention"])
    with pytest.raises(InvalidConfigError, match="both set and deleted"):
        merge_configs(current, {"retention.ms": "5"}, delete=["retention.ms"])


def test_compaction_configs_are_typed_with_defaults() -> None:
    plain = compaction_configs({})
    assert (plain.compact, plain.delete) == (False, True)
    assert plain.delete_retention_ms == 86_400_000
    assert plain.min_cleanable_dirty_ratio == 0.5
    set_ = compaction_configs(check_configs({
        "cleanup.policy": "compact", "min.compaction.lag.ms": "10",
        "delete.retention.ms": "20", "min.cleanable.dirty.ratio": "0.1",
    }))  # fmt: skip
    assert set_ == type(plain)(True, False, 10, 20, 0.1)


def test_a_record_keeps_its_configs_and_an_old_record_reads_its_options_as_configs() -> None:
    configs = check_configs({"cleanup.policy": "compact", "max.message.bytes": "2000"})
    record = TopicRecord("ns", "t", 2, stream_options(configs, DEFAULTS), 7, configs)
    assert TopicRecord.decode(record.encode()) == record
    # Written before configs existed: no "configs" field; its options are its configs.
    old_body = {"namespace": "ns", "topic": "t", "partitions": 2, "ctime_ms": 7,
                "options": {"retention_ms": 60_000, "ensemble_size": 3, "write_quorum": 2,
                            "ack_quorum": 2}}  # fmt: skip
    old = TopicRecord.decode(serde.encode(TOPIC_KIND, FORMAT_VERSION, old_body))
    assert old.options.retention_ms == 60_000
    assert dict(old.configs) == {
        "retention.ms": "60000",
        "bookline.ensemble.size": "3",
        "bookline.write.quorum": "2",
        "bookline.ack.quorum": "2",
    }


def test_topic_options_are_aliases_of_configs() -> None:
    assert TopicOptions(retention_ms=5, write_quorum=2).configs() == {
        "retention.ms": 5,
        "bookline.write.quorum": 2,
    }
    # The CLI's alias flags name the same configs (it keeps its own copy: --help
    # imports no ZooKeeper client).
    assert {o: c for o, c, _w in topic_cli._OPTIONS} == {
        o: c for o, c in OPTION_CONFIGS.items() if o != "record_bytes_max"
    }


def test_http_bodies_carry_configs() -> None:
    configs = {"cleanup.policy": "compact", "segment.ms": 100}
    body: dict[str, Any] = {"name": "t", "partitions": 2, "retention_ms": 5, "configs": configs}
    req = topic_wire.parse_create(body)
    assert req.configs == {"cleanup.policy": "compact", "segment.ms": 100}
    assert req.options == TopicOptions(retention_ms=5)
    bads: list[dict[str, object]] = [
        {"configs": []},
        {"configs": {"a": [1]}},
        {"configs": {"a": True}},
    ]
    for bad in bads:
        with pytest.raises(BadRequestError):
            topic_wire.parse_create({"name": "t", "partitions": 1, **bad})
    assert topic_wire.parse_alter_configs(
        {"configs": {"retention.ms": "5", "segment.ms": None}}
    ) == ({"retention.ms": "5"}, ["segment.ms"])
    with pytest.raises(BadRequestError):
        topic_wire.parse_alter_configs({})
    with pytest.raises(BadRequestError):
        topic_wire.parse_alter_configs({"configs": {}, "partitions": 3})


def test_a_topic_answer_round_trips_its_configs() -> None:
    configs = check_configs({"cleanup.policy": "compact"})
    record = TopicRecord("", "t", 2, stream_options(configs, DEFAULTS), 7, configs)
    shown = effective(configs, DEFAULTS)
    view = topic_wire.record_view(record, shown)
    assert view["configs"][0] == {"name": "cleanup.policy", "value": "compact", "source": "topic"}
    assert topic_wire.parse_configs_view(view["configs"]) == shown
    assert topic_wire.parse_topic_record(view) == record
    with pytest.raises(BadRequestError):
        topic_wire.parse_configs_view([{"name": "a", "value": "1", "source": "maybe"}])


def test_docs_topics_md_has_the_table() -> None:
    """docs/topics.md shows every config with Bookline's default, as the table has it."""
    doc = (Path(__file__).parent.parent / "docs" / "topics.md").read_text()
    for spec in CONFIGS.values():
        default = f"`{spec.default}`" if spec.default is not None else "the namespace's"
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{spec.name}` |")), "")
        assert row, f"docs/topics.md has no row for {spec.name}"
        assert default in row and spec.meaning in row, row


def test_a_long_bad_value_or_name_is_cut_in_the_message() -> None:
    with pytest.raises(InvalidConfigError) as bad:
        check_configs({"retention.ms": "9" * 10_000})
    assert len(bad.value.message) < 200
    with pytest.raises(UnknownConfigError) as unknown:
        check_configs({"x" * 10_000: "1"})
    assert "x" * 100 not in unknown.value.message
