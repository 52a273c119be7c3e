"""ZooKeeper digest ACLs (issue 15): with ``metadata.digest_file`` every znode the cluster
creates admits only that user. Against the session's real ZooKeeper: a client without
credentials (or with other ones) can neither read nor write the cluster's znodes, one
with them can; a bad credentials file is refused with a clear error."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from foundation.config import MetadataConfig
from foundation.errors import ConfigError, ForbiddenError
from metadata.client import MetadataClient
from metadata.ledger_metadata import LedgerMetadata, Segment
from metadata.zk import read_digest

pytestmark = pytest.mark.integration


def digest_file(directory: Path, text: str = "bookline:s3cret-zk-password") -> str:
    path = directory / "zk.digest"
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def kazoo(zk: str, auth: str | None = None) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk, auth_data=[("digest", auth)] if auth else None)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def ledger(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=1,
        write_quorum=1,
        ack_quorum=1,
        segments=(Segment(0, ("b",)),),
        password=b"a key in clear",
    )


async def test_only_the_clusters_user_reads_or_writes(
    zk_connect: str, cluster_root: str, tmp_path: Path
) -> None:
    config = MetadataConfig(zk=zk_connect, root=cluster_root, digest_file=digest_file(tmp_path))
    md = MetadataClient(config)
    await md.connect()
    try:
        await md.init_cluster()
        await md.ledgers.create(ledger(7))
        ledger_path = md.layout.ledger(7)
        for auth in (None, "bookline:wrong-password", "someone:else"):
            for client in kazoo(zk_connect, auth):
                for path in (cluster_root, ledger_path):
                    with pytest.raises(NoAuthError):
                        client.get(path)
                with pytest.raises(NoAuthError):
                    client.create(f"{cluster_root}/intruder", b"x")
                with pytest.raises(NoAuthError):
                    client.set(ledger_path, b"overwritten")
                with pytest.raises(NoAuthError):
                    client.delete(ledger_path)
        for client in kazoo(zk_connect, "bookline:s3cret-zk-password"):
            data, _stat = client.get(ledger_path)
            assert LedgerMetadata.decode(data).ledger_id == 7
        assert (await md.ledgers.read(7))[0].password == b"a key in clear"
    finally:
        await md.close()
    # A metadata client without the credentials gets a clear FORBIDDEN.
    stranger = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root))
    await stranger.connect()
    try:
        with pytest.raises(ForbiddenError, match=r"metadata\.digest_file"):
            await stranger.ledgers.read(7)
    finally:
        await stranger.close()


async def test_the_environment_names_the_file_for_processes_without_a_section(
    zk_connect: str, cluster_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOOKLINE_METADATA_DIGEST_FILE", digest_file(tmp_path))
    md = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root))
    await md.connect()
    try:
        await md.init_cluster()
    finally:
        await md.close()
    for client in kazoo(zk_connect):
        with pytest.raises(NoAuthError):
            client.get(cluster_root)


def test_bad_credentials_files_are_refused(tmp_path: Path) -> None:
    path = digest_file(tmp_path)
    assert read_digest(path) == ("bookline", "s3cret-zk-password")
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_digest(path)
    for text in ("no-colon", ":nouser", "user:"):
        with pytest.raises(ConfigError, match="user:password"):
            read_digest(digest_file(tmp_path, text))
    with pytest.raises(ConfigError, match="no-such-file"):
        MetadataClient(MetadataConfig(digest_file=str(tmp_path / "no-such-file")))


async def test_znodes_made_before_the_credentials_are_restricted_after(
    zk_connect: str, cluster_root: str, tmp_path: Path
) -> None:
    """Migration: a cluster made without ACLs, then `bookline zk restrict` with the
    digest credentials: every znode under the root admits only that user."""
    import subprocess
    import sys

    open_md = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root))
    await open_md.connect()
    try:
        await open_md.init_cluster()
        await open_md.ledgers.create(ledger(9))
    finally:
        await open_md.close()
    for client in kazoo(zk_connect):
        client.get(cluster_root)  # world-readable so far
    env = {**os.environ, "BOOKLINE_METADATA_DIGEST_FILE": digest_file(tmp_path)}
    argv = ["zk", "restrict", "--zk", zk_connect, "--root", cluster_root, "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", *argv],
        check=False,
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout)["restricted"] >= 3  # root, ledgers, the ledger...
    ledger_path = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root)).layout.ledger(9)
    for client in kazoo(zk_connect):
        for path in (cluster_root, ledger_path):
            with pytest.raises(NoAuthError):
                client.get(path)
    for client in kazoo(zk_connect, "bookline:s3cret-zk-password"):
        assert LedgerMetadata.decode(client.get(ledger_path)[0]).ledger_id == 9


async def test_rotating_the_password_hands_every_znode_to_the_new_credentials(
    zk_connect: str, cluster_root: str, tmp_path: Path
) -> None:
    """docs/security.md, rotating the ZooKeeper password: `bookline zk restrict
    --previous-digest-file OLD` with the new file in the environment gives every znode
    to the new user; the old one is locked out."""
    import subprocess
    import sys

    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    old = digest_file(old_dir, "bookline:the-old-password")
    new = digest_file(new_dir, "bookline:the-new-password")
    md = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root, digest_file=old))
    await md.connect()
    try:
        await md.init_cluster()
        await md.ledgers.create(ledger(11))
    finally:
        await md.close()
    env = {**os.environ, "BOOKLINE_METADATA_DIGEST_FILE": new}
    argv = ["zk", "restrict", "--zk", zk_connect, "--root", cluster_root, "--json",
            "--previous-digest-file", old]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "ops.cli", *argv], check=False,
                          capture_output=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    ledger_path = md.layout.ledger(11)
    for client in kazoo(zk_connect, "bookline:the-old-password"):
        for path in (cluster_root, ledger_path):
            with pytest.raises(NoAuthError):
                client.get(path)
    for client in kazoo(zk_connect, "bookline:the-new-password"):
        assert LedgerMetadata.decode(client.get(ledger_path)[0]).ledger_id == 11
