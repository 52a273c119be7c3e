"""Per-ledger keys (issue 15, ledger/keys.py): every new ledger gets a key of its own,
derived from the cluster's ledger secret and a random salt (or random without a secret);
no znode holds a key when there is a secret; legacy ledgers keep their password.

The pure tests use the in-memory fakes; the ZooKeeper walk uses the session's real
ZooKeeper and bookie processes (``bookie_cluster``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from foundation.errors import ConfigError, UnauthorizedError
from ledger.adapters import connect_cluster
from ledger.client import LedgerClient
from ledger.config import LedgerConfig
from ledger.keys import ledger_key, read_secret, write_secret
from ledger.testing import MemoryBookies, MemoryMetadataStore, candidates
from metadata.layout import Layout
from metadata.ledger_metadata import LedgerMetadata, master_key
from streams.config import NamespaceConfig
from streams.namespace import Namespace
from streams.records import LogRecord
from tests.conftest import BookieCluster


def secret_file(directory: Path, name: str = "ledger.secret") -> str:
    path = str(directory / name)
    write_secret(path)
    return path


def memory_client(config: LedgerConfig, store: MemoryMetadataStore | None = None) -> LedgerClient:
    cands = candidates(3)
    store = store or MemoryMetadataStore(cands)
    return LedgerClient(store, MemoryBookies([c.bookie_id for c in cands]), config)


async def write_and_close(client: LedgerClient, payload: bytes) -> LedgerMetadata:
    writer = await client.create_ledger()
    await writer.add_entry(payload)
    await writer.close()
    return writer.metadata


async def test_two_ledgers_get_different_keys_and_none_is_stored(tmp_path: Path) -> None:
    config = LedgerConfig(secret_file=secret_file(tmp_path))
    client = memory_client(config)
    a = await write_and_close(client, b"a")
    b = await write_and_close(client, b"b")
    secret = read_secret(config.secret_file)
    key_a, key_b = ledger_key(a, secret), ledger_key(b, secret)
    assert key_a != key_b
    assert a.key_salt != b.key_salt
    assert (a.password, b.password) == (b"", b"")  # nothing to steal in the metadata
    for meta, key in ((a, key_a), (b, key_b)):
        stored = meta.encode()
        assert key not in stored
        assert master_key(key) not in stored
    reader = await client.open_ledger(a.ledger_id)
    assert await reader.read(0, 0) == [b"a"]


async def test_without_a_secret_each_ledger_gets_a_random_key() -> None:
    client = memory_client(LedgerConfig())
    a = await write_and_close(client, b"a")
    b = await write_and_close(client, b"b")
    assert len(a.password) == 32
    assert a.password != b.password
    assert b"bookline" not in (a.password, b.password)  # no shared default
    assert a.key_check
    reader = await client.open_ledger(b.ledger_id)
    assert await reader.read(0, 0) == [b"b"]


async def test_another_secret_or_none_cannot_open_the_ledger(tmp_path: Path) -> None:
    cands = candidates(3)
    store = MemoryMetadataStore(cands)
    bookies = MemoryBookies([c.bookie_id for c in cands])
    owner = LedgerClient(store, bookies, LedgerConfig(secret_file=secret_file(tmp_path)))
    meta = await write_and_close(owner, b"x")
    stranger_config = LedgerConfig(secret_file=secret_file(tmp_path, "other.secret"))
    stranger = LedgerClient(store, bookies, stranger_config)
    with pytest.raises(UnauthorizedError, match="not the one it was created with"):
        await stranger.open_ledger(meta.ledger_id, recover=False)
    with pytest.raises(UnauthorizedError, match="not the one it was created with"):
        await stranger.open_ledger(meta.ledger_id, recover=True)  # no fencing either
    without = LedgerClient(store, bookies, LedgerConfig())
    with pytest.raises(UnauthorizedError, match=r"set ledger\.secret_file"):
        await without.open_ledger(meta.ledger_id, recover=False)


async def test_legacy_ledgers_keep_their_password() -> None:
    """Migration: a ledger made before per-ledger keys (its metadata in format 1, the
    password in clear, no key check) is still written, recovered and read with the
    configured password; another password is refused as before."""
    client = memory_client(LedgerConfig())
    writer = await client.create_ledger(password=b"bookline")
    await writer.add_entry(b"old")
    legacy = writer.metadata
    assert not legacy.key_check
    assert LedgerMetadata.decode(legacy.encode()).format_version == 1
    assert ledger_key(legacy, b"") == b"bookline"
    with pytest.raises(UnauthorizedError, match="wrong password"):
        await client.open_ledger(legacy.ledger_id, b"something else", recover=False)
    reader = await client.open_ledger(legacy.ledger_id, b"bookline", recover=True)
    assert await reader.read(0, 0) == [b"old"]


def test_a_secret_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = secret_file(tmp_path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert len(read_secret(path)) >= 16
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_secret(path)
    short = tmp_path / "short.secret"
    short.write_bytes(b"tiny")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="at least 16"):
        read_secret(str(short))
    with pytest.raises(ConfigError, match="at least 16"):
        LedgerClient(*_fakes(), LedgerConfig(secret_file=str(short)))


def _fakes() -> tuple[MemoryMetadataStore, MemoryBookies]:
    cands = candidates(3)
    return MemoryMetadataStore(cands), MemoryBookies([c.bookie_id for c in cands])


# -- real ZooKeeper: walk every znode as a client without credentials --------------------


def walk(zk: KazooClient, path: str) -> Iterator[tuple[str, bytes]]:
    data, _stat = zk.get(path)
    yield path, data
    for child in zk.get_children(path):
        yield from walk(zk, f"{path.rstrip('/')}/{child}")


@pytest.mark.integration
async def test_no_znode_holds_a_ledger_key(bookie_cluster: BookieCluster, tmp_path: Path) -> None:
    config = LedgerConfig(secret_file=secret_file(tmp_path))
    store, transport, close = await connect_cluster(bookie_cluster.zk, bookie_cluster.root)
    try:
        client = LedgerClient(store, transport, config)
        metas = [await write_and_close(client, b"entry %d" % i) for i in range(2)]
        secret = read_secret(config.secret_file)
        keys = [ledger_key(m, secret) for m in metas]
        assert keys[0] != keys[1]
        secrets = [*keys, *(master_key(k) for k in keys), secret]
        zk = KazooClient(hosts=bookie_cluster.zk)  # no credentials at all
        zk.start(timeout=15)
        try:
            seen = dict(walk(zk, bookie_cluster.root))
        finally:
            zk.stop()
            zk.close()
        layout = Layout(bookie_cluster.root)
        assert all(layout.ledger(m.ledger_id) in seen for m in metas)  # the walk saw them
        leaks = [path for path, data in seen.items() for s in secrets if s in data]
        assert leaks == []
        reader = await client.open_ledger(metas[1].ledger_id, recover=False)
        assert await reader.read(0, 0) == [b"entry 1"]
    finally:
        await close()


@pytest.mark.integration
async def test_a_namespace_gives_each_segment_its_own_key(
    bookie_cluster: BookieCluster, tmp_path: Path
) -> None:
    """The core library's ``password`` setting (``bookline`` by default) only opens
    legacy ledgers: the segments a namespace makes each get a key of their own."""
    # The shared cluster's bookies hold no credential (tests/test_bookie_identity.py).
    ledger = LedgerConfig(secret_file=secret_file(tmp_path), verify_bookies=False)
    config = NamespaceConfig(session_timeout_ms=4000, ledger=ledger)
    ns = await Namespace.open(bookie_cluster.zk, bookie_cluster.root, f"keys{os.getpid()}", config)
    try:
        metas = []
        for name in ("s1", "s2"):
            await ns.create_stream(name)
            writer = await ns.open_writer(name)
            await writer.write(LogRecord(b"record of " + name.encode()))
            await writer.close()
            (segment,) = await ns.segments(name)
            metas.append((await ns._ctx.ledgers.store.read(segment.ledger_id))[0])
        assert all(m.key_check and not m.password for m in metas)
        assert metas[0].key_salt != metas[1].key_salt
        reader = await ns.open_reader("s2", "earliest")
        record = await reader.read_next(timeout_s=10)
        assert record is not None
        assert record.payload == b"record of s2"
        await reader.close()
    finally:
        await ns.close()


async def test_rotating_the_ledger_secret(tmp_path: Path) -> None:
    """The secret file holds one secret a line: the first derives new ledgers' keys,
    every line opens the ledgers made with it. Rotation: put a new line first, keep the
    old one until no ledger made with it is left."""
    cands = candidates(3)
    store = MemoryMetadataStore(cands)
    bookies = MemoryBookies([c.bookie_id for c in cands])
    path = tmp_path / "ledger.secret"
    old, new = b"o" * 32, b"n" * 32
    path.write_bytes(old + b"\n")
    path.chmod(0o600)
    config = LedgerConfig(secret_file=str(path))
    made_with_old = await write_and_close(LedgerClient(store, bookies, config), b"old")
    path.write_bytes(new + b"\n" + old + b"\n")  # step 1: the new secret first
    rotated = LedgerClient(store, bookies, config)
    made_with_new = await write_and_close(rotated, b"new")
    assert ledger_key(made_with_new, new) == ledger_key(made_with_new, new + b"\n" + old)
    for meta, payload in ((made_with_old, b"old"), (made_with_new, b"new")):
        reader = await rotated.open_ledger(meta.ledger_id, recover=False)
        assert await reader.read(0, 0) == [payload]
    path.write_bytes(new + b"\n")  # step 2, too early: the old ledger is lost to it
    dropped = LedgerClient(store, bookies, config)
    with pytest.raises(UnauthorizedError, match="not the one it was created with"):
        await dropped.open_ledger(made_with_old.ledger_id, recover=False)
    assert await (await dropped.open_ledger(made_with_new.ledger_id)).read(0, 0) == [b"new"]
