"""Bad configuration stops a server at start with a message naming the key: an unknown
key, a value of the wrong type, quorums that contradict each other, a quorum larger than
the bookies available. Exit status 4 (configuration), never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops.cli.common import EXIT_CONFIG
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from tests.cli_support import run_cli


def _refused(out: subprocess.CompletedProcess[str], *says: str) -> None:
    assert out.returncode == EXIT_CONFIG, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    for text in says:
        assert text in out.stderr, out.stderr[-2000:]


def test_unknown_key_and_wrong_type_in_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "bookie.toml"
    conf.write_text('[bookie]\njournal_dirr = "/tmp/j"\n')
    _refused(run_cli("bookie", "--config", str(conf)), "unknown setting 'journal_dirr'",
             "did you mean 'journal_dir'?")  # fmt: skip
    conf.write_text('[bookie]\nport = "high"\n')
    _refused(run_cli("bookie", "--config", str(conf)), "bookie.port", "expected an integer")
    conf.write_text("[writeproxy]\nack_quorum = true\n")
    _refused(run_cli("writeproxy", "--config", str(conf)), "writeproxy.ack_quorum")


def test_inconsistent_quorums(tmp_path: Path) -> None:
    out = run_cli("writeproxy", "--ensemble-size", "2", "--write-quorum", "3")
    _refused(out, "writeproxy: quorums must satisfy ensemble_size >= write_quorum")
    out = run_cli("local", "--dir", str(tmp_path / "c"), "--ack-quorum", "4")
    _refused(out, "ensemble_size >= write_quorum >= ack_quorum")
    out = run_cli("local", "--dir", str(tmp_path / "c"), "--bookies", "2")
    _refused(out, "--ensemble-size 3 needs at least that many bookies; --bookies is 2")
    assert not (tmp_path / "c").exists()  # refused before anything started


@pytest.mark.integration
def test_a_quorum_larger_than_the_bookies_fails_the_write_proxy_at_start(
    proxy_cluster: LocalCluster,
) -> None:
    out = run_cli(
        "writeproxy", "--zk", proxy_cluster.zk_connect, "--root", CLUSTER_ROOT,
        "--port", "0", "--proxy-id", "wp-too-big", "--ensemble-size", "5",
        "--write-quorum", "3",
    )  # fmt: skip
    _refused(out, "writeproxy.ensemble_size is 5 but only 3 bookies are writable")
