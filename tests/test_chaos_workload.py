"""The chaos workload's pure parts: how outcomes are classified (a wrong ``failed``
would turn a write that did happen into a false ``failed_present``), the streams a
run writes and reads, and the writer's command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ConnectionLostError,
    ForbiddenError,
    NotEnoughBookiesError,
    NotFoundError,
    OutcomeUnknownError,
    ProducerFencedError,
    TimeoutError_,
    UnauthenticatedError,
    WriterFailedError,
)
from ops.chaos.final import _plans
from ops.chaos.kafka_clients import client_config
from ops.chaos.workload import (
    DEFAULT_LAYOUT,
    KAFKA_LAYOUT,
    WRITER_KINDS,
    Layout,
    classify,
    writer_argv,
)


@pytest.mark.parametrize(
    "error",
    [
        BadRequestError("x"),
        NotFoundError("x"),
        UnauthenticatedError("x"),
        ForbiddenError("x"),
    ],
)
def test_refusals_that_wrote_nothing_are_failed(error: BooklineError) -> None:
    status, text = classify(error)
    assert status == "failed"
    assert text.startswith(error.name)


@pytest.mark.parametrize(
    "error",
    [
        OutcomeUnknownError("x"),
        TimeoutError_("x"),
        ConnectionLostError("x"),
        WriterFailedError("x"),
        NotEnoughBookiesError("x"),
        ProducerFencedError("x"),
        OSError("connection reset"),
        TimeoutError(),
    ],
)
def test_everything_else_leaves_the_outcome_unknown(error: BaseException) -> None:
    assert classify(error)[0] == "unknown"


def test_the_default_layout_writes_every_path_to_its_own_streams() -> None:
    targets = {kind: DEFAULT_LAYOUT.targets(kind) for kind in WRITER_KINDS}
    streams = [s for kind in ("thin", "core") for s in targets[kind]]
    assert len(streams) == len(set(streams))  # one writer per stream: locks never fight
    assert targets["topic"] != targets["topic-core"]
    plans = _plans(DEFAULT_LAYOUT)
    assert {p.path for p in plans} == set(WRITER_KINDS)
    partitions = [p for p in plans if p.topic is not None]
    assert len(partitions) == 2 * DEFAULT_LAYOUT.partitions
    assert all(p.stream.startswith(p.topic + "~") for p in partitions if p.topic)


def test_the_kafka_layout_writes_only_its_six_partition_topic() -> None:
    """Two librdkafka producers and a group of three consumers, each its own process
    (named apart, so the nemesis can kill each); the final phase writes and reads the
    six partitions only."""
    names = KAFKA_LAYOUT.writer_names()
    assert [n for n, _k in names] == [
        "w-kafka-producer-1", "w-kafka-producer-2",
        "w-kafka-consumer-1", "w-kafka-consumer-2", "w-kafka-consumer-3",
    ]  # fmt: skip
    plans = _plans(KAFKA_LAYOUT)
    assert [p.stream for p in plans] == [f"chaos-kafka~{i}" for i in range(6)]
    assert {p.path for p in plans} == {"topic"}  # final writes: thin-client sends
    assert [n for n, _k in DEFAULT_LAYOUT.writer_names()] == [f"w-{k}" for k in WRITER_KINDS]


def test_a_core_only_layout_needs_no_topic() -> None:
    plans = _plans(Layout(thin_streams=(), core_streams=("a",), partitions=0))
    assert [(p.stream, p.path) for p in plans] == [("a", "core")]


def test_writer_command_line_names_its_incarnation() -> None:
    argv = writer_argv(name="w-core", kind="core", incarnation=3, cluster_file=Path("c.json"),
                       history=Path("h"), seed=5, rate_per_s=2.5)  # fmt: skip
    assert argv[:4] == [sys.executable, "-m", "ops.chaos.workload", "writer"]
    assert argv[argv.index("--incarnation") + 1] == "3"
    assert argv[argv.index("--kind") + 1] == "core"


def test_kafka_clients_authenticate_as_admin_with_the_token_cluster_json_names(
    tmp_path: Path,
) -> None:
    (tmp_path / "auth").mkdir()
    (tmp_path / "auth" / "admin.token").write_text("tok-123\n")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(
        json.dumps({"kafka_bootstrap": "10.0.0.1:9092,10.0.0.2:9092",
                    "token_file": "auth/admin.token"})
    )  # fmt: skip
    conf = client_config(cluster, "w-kafka-producer-1.1")
    assert conf["bootstrap.servers"] == "10.0.0.1:9092,10.0.0.2:9092"
    assert (conf["sasl.mechanisms"], conf["sasl.username"]) == ("PLAIN", "admin")
    assert conf["sasl.password"] == "tok-123"
    cluster.write_text(json.dumps({"kafka_bootstrap": "10.0.0.1:9092"}))  # auth off
    assert "sasl.password" not in client_config(cluster, "c")
    cluster.write_text(json.dumps({}))
    with pytest.raises(RuntimeError, match="kafka_bootstrap"):
        client_config(cluster, "c")
