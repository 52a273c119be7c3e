"""`bookline topic create/alter/describe --config KEY=VALUE` by Kafka's names (issue 24,
5) against the shared proxy cluster, each command its own process: every effective
config and its source, the older flags as aliases, unknown names and bad values refused
with their stable codes (and a malformed flag as a usage error)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from ops.cluster.local import LocalCluster
from tests.cli_support import run_cli

pytestmark = pytest.mark.integration


def _cli(cluster: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"BOOKLINE_CLUSTER": str(cluster)})


def _json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout.strip().splitlines()[-1])
    assert isinstance(obj, dict)
    return obj


def _configs(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["value"], c["source"]) for c in obj["configs"]}


def test_topic_configs_on_the_command_line(proxy_cluster: LocalCluster) -> None:
    cluster = proxy_cluster.dir / "cluster.json"
    t = f"clicfg-{uuid.uuid4().hex[:8]}"
    created = _json(_cli(cluster, "topic", "create", t, "--partitions", "2",
                         "--config", "cleanup.policy=compact",
                         "--config", "min.compaction.lag.ms=100",
                         "--retention-ms", "86400000", "--json"))  # fmt: skip
    assert _configs(created) == {
        "cleanup.policy": ("compact", "topic"),
        "retention.ms": ("86400000", "topic"),  # the alias
        "min.compaction.lag.ms": ("100", "topic"),
    }

    listed = _cli(cluster, "topic", "list")
    assert listed.returncode == 0
    assert t in listed.stdout and "cleanup.policy=compact" in listed.stdout  # a table may fold

    described = _json(_cli(cluster, "topic", "describe", t, "--json"))
    every = _configs(described)
    assert len(every) >= 13 and every["cleanup.policy"] == ("compact", "topic")
    assert every["max.message.bytes"] == ("1048576", "default")
    assert every["bookline.write.quorum"][1] == "default"
    text = _cli(cluster, "topic", "describe", t)
    assert text.returncode == 0
    lines = [line.replace("\u2502", " ").split() for line in text.stdout.splitlines()]
    assert any(w[:3] == ["cleanup.policy", "compact", "topic"] for w in lines), text.stdout
    assert any(w[:3] == ["delete.retention.ms", "86400000", "default"] for w in lines)

    altered = _json(_cli(cluster, "topic", "alter", t, "--config", "segment.ms=60000",
                         "--delete-config", "min.compaction.lag.ms", "--partitions", "3",
                         "--json"))  # fmt: skip
    assert altered["partitions"] == 3
    assert _configs(altered) == {
        "cleanup.policy": ("compact", "topic"),
        "retention.ms": ("86400000", "topic"),
        "segment.ms": ("60000", "topic"),
    }

    unknown = _cli(cluster, "topic", "alter", t, "--config", "retention.hours=1")
    assert unknown.returncode == 1 and "UNKNOWN_CONFIG (53)" in unknown.stderr, unknown.stderr
    assert "known configs: cleanup.policy" in unknown.stderr
    bad = _cli(cluster, "topic", "create", f"z{t}", "--partitions", "1",
               "--config", "message.timestamp.type=WallClock")  # fmt: skip
    assert bad.returncode == 1 and "INVALID_CONFIG (52)" in bad.stderr, bad.stderr
    usage = _cli(cluster, "topic", "create", f"z{t}", "--partitions", "1", "--config", "x")
    assert usage.returncode == 2 and "KEY=VALUE" in usage.stderr
    assert _configs(_json(_cli(cluster, "topic", "describe", t, "--json"))) == {
        **every, "segment.ms": ("60000", "topic"),
        "min.compaction.lag.ms": ("0", "default"),
    }  # fmt: skip
    assert _cli(cluster, "topic", "describe", f"z{t}").returncode == 1  # never created
    assert _cli(cluster, "topic", "delete", t).returncode == 0
