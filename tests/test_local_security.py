"""A local cluster's metadata and files are its owner's only (issue 21, defects 1 and 10).

With auth on (``bookline local``'s default, and ``bookline chaos``'s) every znode of
the cluster -- its root, everything below it, the chroot ``/local`` and the server's
root ``/`` -- refuses a ZooKeeper client without the cluster's digest credentials
(tests/zk_attack.py), while every process of the cluster, the CLI and core-library
users given ``cluster.json`` work as before. A directory made before the credentials
existed is locked at its next start. The directory is 0700; ``cluster.json``,
``ports.json``, the credentials, ``grants.toml`` and every log are 0600.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.chaos.hosts import ChaosCluster
from ops.cluster.local import CLUSTER_ROOT, LOCAL_CHROOT, LocalCluster
from streams.namespace import Namespace
from tests.zk_attack import assert_locked
from thinclient.sync import SyncProxyClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def _digest_file(directory: Path) -> Path | None:
    name = json.loads((directory / "cluster.json").read_text()).get("zk_digest_file")
    return directory / name if name else None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("locked") / "cluster",
        bookies=3,
        write_proxies=1,
        read_proxies=1,
        autorecovery=True,
        auth=True,
    )
    c.start()
    try:
        with SyncProxyClient.from_cluster_file(c.dir / "cluster.json") as client:
            client.write_many("acked", [b"r0", b"r1", b"r2"])
            client.write_many("second", [b"s0"])
        yield c
    finally:
        c.stop()


def test_a_stranger_cannot_change_any_znode_of_a_local_cluster(cluster: LocalCluster) -> None:
    nodes = assert_locked(cluster.zk_hosts, LOCAL_CHROOT + CLUSTER_ROOT, _digest_file(cluster.dir))
    # Every kind of znode the cluster makes was tried: streams, ledgers, the bookies'
    # registrations (ephemeral), the proxies', ownership, cookies.
    for part in ("/streams/default/acked", "/ledgers/", "/bookies/available/", "/proxies/",
                 "/cookies/", "/owners/"):  # fmt: skip
        assert any(part in n for n in nodes), (part, nodes)


def test_every_client_of_the_cluster_file_still_works(cluster: LocalCluster) -> None:
    """The credentials reach the core library (Namespace.from_cluster_file, also the
    Spark source's ``cluster`` option) and the CLI (``--cluster``)."""

    async def streams() -> list[str]:
        async with await Namespace.from_cluster_file(cluster.dir / "cluster.json") as ns:
            return sorted(await ns.list_streams())

    assert {"acked", "second"} <= set(asyncio.run(streams()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOKLINE_")}
    for argv in (["ledger", "list"], ["status"]):
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *argv, "--cluster", str(cluster.dir), "--json"],
            check=False,
            capture_output=True,
            env={**env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            timeout=120,
        )
        assert done.returncode == 0, (argv, done.stderr.decode()[-2000:])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _assert_private(directory: Path) -> None:
    assert _mode(directory) == 0o700
    files = [directory / "cluster.json", directory / "ports.json", *directory.glob("auth/*")]
    logs = list(directory.glob("*/*.log"))  # each process's (not the entry logs below)
    assert len(logs) >= 2 and (directory / "auth" / "grants.toml") in files
    for path in files + logs:
        assert _mode(path) == 0o600, f"{path} has mode {_mode(path):o}"


def test_the_directory_and_its_files_are_the_owners_only(cluster: LocalCluster) -> None:
    _assert_private(cluster.dir)


def test_a_directory_made_open_is_locked_at_its_next_start(tmp_path: Path) -> None:
    """An existing directory whose znodes have the open ACL and whose files are 0644
    (what a local cluster made before: here one made with auth off) starts with auth
    on: its znodes are restricted, its files tightened."""
    directory = tmp_path / "cluster"
    old = LocalCluster(directory, bookies=1)
    old.start()
    old.stop()
    os.chmod(directory, 0o755)
    for path in (directory / "cluster.json", *directory.glob("*/*.log")):
        os.chmod(path, 0o644)
    fresh = LocalCluster(directory, bookies=1, auth=True)
    fresh.start()
    try:
        assert_locked(fresh.zk_hosts, LOCAL_CHROOT + CLUSTER_ROOT, _digest_file(directory))
        _assert_private(directory)
    finally:
        fresh.stop()


@pytest.mark.slow
def test_a_stranger_cannot_change_any_znode_of_a_chaos_cluster(tmp_path: Path) -> None:
    """`bookline chaos`'s cluster (auth on by default) builds on LocalCluster: the same
    lock, over a ZooKeeper ensemble of 3 (loopback: the placements do not matter)."""
    chaos = ChaosCluster(tmp_path / "chaos", namespaces=False, auth=True)
    chaos.start()
    try:
        hosts = chaos.local.zk_hosts
        assert_locked(hosts, LOCAL_CHROOT + CLUSTER_ROOT, _digest_file(chaos.dir))
    finally:
        chaos.stop()
