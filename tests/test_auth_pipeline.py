"""The Spark connector's ``token`` option (docs/security.md): it reads and writes through
the core library, straight from the bookies, so its credential is the one the bookies
check. Against a local cluster with auth on (real processes), the connector's
namespace reads a stream with the token and is refused without one; the option is
parsed for sources and sinks and never shown in a repr."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from foundation.auth import TOKEN_ENV
from foundation.errors import BooklineError
from metadata.client import DIGEST_FILE_ENV
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from pipeline import client as pipeline_client
from pipeline.options import parse_sink_options, parse_source_options
from streams.sync import SyncNamespace
from tests.cluster_support import cluster_secret, started_cluster, token
from tests.values import values
from thinclient.client import SyncProxyClient

ZK = {"zk": "127.0.0.1:2181/x", "root": "/r"}


def test_token_option_is_parsed_and_never_shown() -> None:
    token = "bl1.YWRtaW4.9999999999.c2lnbmF0dXJl"
    source = parse_source_options({**ZK, "stream": "a", "Token": token})
    sink = parse_sink_options({**ZK, "stream": "a", "token": token})
    assert source.connection.token == sink.connection.token == token
    assert token not in repr(source) and token not in repr(sink.connection)
    assert parse_source_options({**ZK, "stream": "a"}).connection.token is None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("auth-pipeline")
    with started_cluster(directory, bookies=3, write_proxies=1, read_proxies=0, auth=True) as c:
        yield c


def _read_all(ns: SyncNamespace, stream: str, count: int) -> list[bytes]:
    with ns.open_reader(stream, "earliest") as reader:
        records = reader.read_many(count, timeout_s=20)
    return values(records)


@pytest.mark.integration
def test_connector_reads_with_its_token_and_is_refused_without(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert TOKEN_ENV not in os.environ  # the test process has no token of its own
    # The `zk` option: ZooKeeper's digest credentials from the environment, as an
    # executor of a cluster with ZooKeeper ACLs gets them (the `cluster` option's
    # file names them itself).
    monkeypatch.setenv(DIGEST_FILE_ENV, str(cluster.zk_digest_file))
    admin = token(cluster_secret(cluster), "admin")
    stream = f"spark-{uuid.uuid4().hex[:8]}"
    with SyncProxyClient.from_cluster_file(cluster.dir / "cluster.json") as client:
        client.write_many(stream, [b"r0", b"r1", b"r2"])
    base = {
        "zk": cluster.zk_connect,
        "root": CLUSTER_ROOT,
        "stream": stream,
        "bookline.ledger.secret_file": str(cluster.ledger_secret_file),
    }
    with_token = parse_source_options({**base, "token": admin}).connection
    try:
        ns = pipeline_client.namespace_for(with_token)
        assert _read_all(ns, stream, 3) == [b"r0", b"r1", b"r2"]
        without = parse_source_options(base).connection
        ns = pipeline_client.namespace_for(without)
        with pytest.raises(BooklineError) as info:
            _read_all(ns, stream, 1)
        assert info.value.name == "UNAUTHENTICATED", info.value
    finally:
        pipeline_client.close_all()


def _write_rows(cluster: LocalCluster, stream: str, count: int) -> None:
    with SyncProxyClient.from_cluster_file(cluster.dir / "cluster.json") as client:
        for first in range(0, count, 500):
            client.write_many(stream, [b"r%d" % i for i in range(first, first + 500)])


def _zk_only(cluster: LocalCluster, stream: str) -> dict[str, str]:
    """What a user who copies the README's Spark example sets: zk and root, no token."""
    return {"zk": cluster.zk_connect, "root": CLUSTER_ROOT, "stream": stream, "arrow": "false"}


@pytest.mark.integration
def test_planning_a_read_without_credentials_is_refused_not_empty(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 (6): the planner read the in-progress segment's LAC without credentials,
    took the refusal for "nothing confirmed yet" and planned an empty read. Each missing
    credential is its own refusal: only zk set, ZooKeeper's ACL refuses (issue 21); with
    its digest, the ledger secret is missing; with that too but no token, the bookies
    refuse."""
    from pipeline.source import BooklineBatchReader

    stream = f"spark-plan-{uuid.uuid4().hex[:8]}"
    _write_rows(cluster, stream, 1_000)
    secret = {"bookline.ledger.secret_file": str(cluster.ledger_secret_file)}
    cases = [(_zk_only(cluster, stream), "FORBIDDEN", False),
             (_zk_only(cluster, stream), "UNAUTHORIZED", True),
             ({**_zk_only(cluster, stream), **secret}, "UNAUTHENTICATED", True)]  # fmt: skip
    for options, refusal, with_digest in cases:
        if with_digest:
            monkeypatch.setenv(DIGEST_FILE_ENV, str(cluster.zk_digest_file))
        reader = BooklineBatchReader(parse_source_options(options), None)  # type: ignore[arg-type]
        try:
            with pytest.raises(BooklineError) as info:
                reader.partitions()
            assert info.value.name == refusal, info.value
        finally:
            pipeline_client.close_all()


@pytest.mark.spark
@pytest.mark.integration
def test_spark_read_without_credentials_fails_and_with_them_returns_every_row(
    cluster: LocalCluster, spark: object
) -> None:
    """Issue 22 (6): ``spark.read`` with only ``zk`` set on a cluster with auth on gave
    an empty DataFrame (0 of 2,000 rows, no error)."""
    from pyspark.errors import PySparkException

    stream = f"spark-auth-{uuid.uuid4().hex[:8]}"
    _write_rows(cluster, stream, 2_000)
    admin = token(cluster_secret(cluster), "admin")
    options = _zk_only(cluster, stream)
    session: Any = spark
    try:
        with pytest.raises((PySparkException, BooklineError)) as info:
            session.read.format("bookline").options(**options).load().count()
        # ZooKeeper's ACL (issue 21) is the first credential a zk-only read lacks.
        assert "FORBIDDEN" in str(info.value) and "digest_file" in str(info.value)
        # With every credential (the cluster file names them) and a token: every row.
        full = {"cluster": str(cluster.dir / "cluster.json"), "stream": stream}
        df = session.read.format("bookline").options(**full, arrow="false", token=admin).load()
        assert df.count() == 2_000
    finally:
        pipeline_client.close_all()
