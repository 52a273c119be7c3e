"""The admin commands against the shared proxy cluster: readable tables or --json, each
a few hundred milliseconds (status, bookie, ledger, underreplicated, autorecovery,
subscription, cookie, zk tree, stream describe with ensembles)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from ops.cli.common import EXIT_FOUND
from ops.cluster.local import LocalCluster
from tests.cli_support import cli_json, run_cli

pytestmark = pytest.mark.integration


def _cli(cluster: LocalCluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cluster=cluster.dir / "cluster.json", stdin=stdin)


def _json(cluster: LocalCluster, *args: str) -> Any:
    return cli_json(*args, cluster=cluster.dir / "cluster.json")


def test_status_shows_every_component(proxy_cluster: LocalCluster) -> None:
    status = _json(proxy_cluster, "status")
    assert [z["state"] for z in status["zookeeper"]] == ["up"]
    assert status["zookeeper"][0]["mode"] == "standalone"
    bookies = {b["id"]: b for b in status["bookies"]}
    assert len(bookies) == 3 and all(b["state"] == "writable" for b in bookies.values())
    assert all(0 <= b["disk_used"] <= 1 for b in bookies.values())
    kinds = sorted(p["kind"] for p in status["proxies"] if p["state"] != "down")
    assert kinds == ["read", "write", "write"], status["proxies"]
    # One id per process: the proxies register under their cluster.json names (issue 22,
    # 11: status showed `wp-1` beside `writeproxy-1`).
    listed = json.loads((proxy_cluster.dir / "cluster.json").read_text())
    names = {p["id"] for key in ("write_proxies", "read_proxies") for p in listed[key]}
    assert (
        {p["id"] for p in status["proxies"]}
        == names
        == {
            "writeproxy-1",
            "writeproxy-2",
            "readproxy-1",
        }
    )
    assert isinstance(status["underreplicated"], int)
    # No autorecovery process in this cluster: status says so, and exits 3.
    assert status["autorecovery"]["auditor"] is None
    assert any("auditor" in p for p in status["problems"])
    table = _cli(proxy_cluster, "status")
    assert table.returncode == EXIT_FOUND
    for word in ("ZooKeeper", "bookies", "under-replicated", "proxies", "problems"):
        assert word in table.stdout, table.stdout


def test_bookie_commands(proxy_cluster: LocalCluster) -> None:
    rows = _json(proxy_cluster, "bookie", "list")["bookies"]
    victim = rows[0]["id"]
    try:
        held = _json(proxy_cluster, "bookie", "readonly", victim)
        assert held["state"] == "readonly" and held["forced_readonly"], held
        status = _json(proxy_cluster, "status")
        assert {b["id"]: b["state"] for b in status["bookies"]}[victim] == "readonly"
    finally:
        released = _json(proxy_cluster, "bookie", "writable", victim)
    assert released["state"] == "writable" and not released["forced_readonly"], released
    info = _json(proxy_cluster, "bookie", "info", victim)
    assert info["cookie"]["instance_id"] and isinstance(info["ledgers"], list)
    cookie = _json(proxy_cluster, "cookie", "show", victim)
    assert cookie["matches_cluster"] is True
    missing = _cli(proxy_cluster, "bookie", "info", "no-such-bookie")
    assert missing.returncode == 1 and "NOT_FOUND (17)" in missing.stderr


def test_ledger_and_stream_commands(proxy_cluster: LocalCluster, tmp_path: Path) -> None:
    stream = f"admin-{uuid.uuid4().hex[:6]}"
    wrote = _cli(proxy_cluster, "stream", "write", stream, stdin="".join(
        f"line {i}\n" for i in range(200)))  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    described = _json(proxy_cluster, "stream", "describe", stream)
    segment = described["segments"][0]
    assert len(segment["ensembles"][0]["bookies"]) == 3 and segment["quorums"] == [3, 3, 2]
    table = _cli(proxy_cluster, "stream", "describe", stream)
    assert "ensembles" in table.stdout and segment["ensembles"][0]["bookies"][0] in table.stdout
    assert stream in _json(proxy_cluster, "stream", "list")["streams"]
    bulk = tmp_path / "records.txt"
    read = _cli(proxy_cluster, "stream", "read", stream, "--out", str(bulk))
    assert read.returncode == 0 and "200 records" in read.stdout, read.stderr
    assert bulk.read_text().splitlines() == [f"line {i}" for i in range(200)]

    ledgers = _json(proxy_cluster, "ledger", "list", "--stream", stream)["ledgers"]
    ids = [r["ledger_id"] for r in ledgers]
    assert segment["ledger_id"] in ids
    shown = _json(proxy_cluster, "ledger", "show", str(segment["ledger_id"]))
    assert shown["state"] == "OPEN" and shown["last_add_confirmed"] >= 0, shown
    assert shown["ensembles"] == segment["ensembles"]
    entries = _cli(proxy_cluster, "ledger", "read", str(segment["ledger_id"]), "--json")
    lines = [json.loads(line) for line in entries.stdout.splitlines()]
    assert [e["entry_id"] for e in lines] == list(range(shown["last_add_confirmed"] + 1))
    out = tmp_path / "entries.bin"
    saved = _cli(proxy_cluster, "ledger", "read", str(segment["ledger_id"]), "--out", str(out))
    assert saved.returncode == 0, saved.stderr
    assert out.stat().st_size == sum(e["bytes"] for e in lines)
    gone = _cli(proxy_cluster, "ledger", "show", "999999999")
    assert gone.returncode == 1 and "NO_LEDGER" in gone.stderr, gone.stderr
    assert isinstance(_json(proxy_cluster, "underreplicated", "list")["ledgers"], list)

    # Subscriptions of the same stream.
    first = lines[0]["entry_id"]
    assert first == 0
    committed = _json(proxy_cluster, "subscription", "commit", stream, "audit", "1:0:5")
    assert committed["advanced"] and committed["committed"] == "1:0:5"
    again = _json(proxy_cluster, "subscription", "commit", stream, "audit", "1:0:1")
    assert not again["advanced"] and again["committed"] == "1:0:5"
    listed = _json(proxy_cluster, "subscription", "list", stream)
    assert listed["subscribers"] == [{"subscriber": "audit", "committed": "1:0:5"}]


def test_autorecovery_pause_and_resume(proxy_cluster: LocalCluster) -> None:
    try:
        assert _json(proxy_cluster, "autorecovery", "disable")["enabled"] is False
        assert _json(proxy_cluster, "autorecovery", "status")["enabled"] is False
        assert any("paused" in p for p in _json(proxy_cluster, "status")["problems"])
    finally:
        resumed = _json(proxy_cluster, "autorecovery", "enable")
    assert resumed["enabled"] is True


def test_zk_tree(proxy_cluster: LocalCluster) -> None:
    tree = _json(proxy_cluster, "zk", "tree", "bookies", "--data")
    paths = [n["path"] for n in tree["nodes"]]
    assert any(p.endswith("/bookies/available") for p in paths), paths
    registered = [n for n in tree["nodes"] if "/available/" in n["path"]]
    assert registered and registered[0]["ephemeral_owner"], registered
    assert registered[0]["data"][1] == "bookie"  # serde: ["BL", kind, version, body]
    text = _cli(proxy_cluster, "zk", "tree", "--depth", "1").stdout
    assert "ledgers" in text and "bookies" in text


def test_what_does_not_exist_is_not_found(proxy_cluster: LocalCluster) -> None:
    """Issue 22 (11): `zk tree /nosuch` and `subscription show S nosuch` exited 0 with an
    empty answer; `bookie info bookie-9` suggested `stream list`; `stream write nosuch`
    created the stream without a word."""
    tree = _cli(proxy_cluster, "zk", "tree", "/nosuch")
    assert tree.returncode == 1 and "NOT_FOUND (17)" in tree.stderr, tree.stderr
    stream = f"nf-{uuid.uuid4().hex[:8]}"
    wrote = _cli(proxy_cluster, "stream", "write", stream, stdin="one\n")
    assert wrote.returncode == 0, wrote.stderr
    assert f"stream {stream} did not exist: created it" in wrote.stderr
    again = _cli(proxy_cluster, "stream", "write", stream, "--json", stdin="two\n")
    assert "did not exist" not in again.stderr
    assert json.loads(again.stdout)["written"] == 1
    show = _cli(proxy_cluster, "subscription", "show", stream, "nosuch")
    assert show.returncode == 1 and "NOT_FOUND (17)" in show.stderr, show.stderr
    info = _cli(proxy_cluster, "bookie", "info", "bookie-9")
    assert info.returncode == 1 and "bookline bookie list" in info.stderr, info.stderr
