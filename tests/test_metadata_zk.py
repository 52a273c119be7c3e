"""ZkClient against real ZooKeeper: CRUD, versions, transactions, watches, sessions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kazoo.exceptions import BadVersionError as KazooBadVersionError
from kazoo.exceptions import NoNodeError

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BadVersionError,
    ClosedError,
    NotFoundError,
)
from metadata.zk import SessionState, ZkClient
from tests.metadata_support import TEST_SESSION_TIMEOUT_MS, expire_session, wait_for
from tests.waiting import scaled

pytestmark = pytest.mark.integration


@pytest.fixture
async def zk(zk_connect: str) -> AsyncIterator[ZkClient]:
    client = ZkClient(zk_connect, session_timeout_ms=TEST_SESSION_TIMEOUT_MS)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


async def test_create_get_set_delete_roundtrip(zk: ZkClient, cluster_root: str) -> None:
    path = f"{cluster_root}/a/b"
    assert await zk.create(path, b"one", makepath=True) == path
    assert await zk.get(path) == (b"one", 0)
    assert await zk.set(path, b"two", 0) == 1
    assert await zk.get(path) == (b"two", 1)
    stat = await zk.exists(path)
    assert stat is not None
    assert stat.version == 1
    assert stat.ephemeral_owner == 0
    assert await zk.get_children(f"{cluster_root}/a") == ["b"]
    await zk.delete(path, 1)
    assert await zk.exists(path) is None


async def test_errors_are_translated_with_cause(zk: ZkClient, cluster_root: str) -> None:
    path = f"{cluster_root}/x"
    with pytest.raises(NotFoundError) as missing:
        await zk.get(path)
    assert isinstance(missing.value.__cause__, NoNodeError)
    assert path in str(missing.value)
    await zk.create(path, b"", makepath=True)
    with pytest.raises(AlreadyExistsError):
        await zk.create(path)
    with pytest.raises(BadVersionError) as stale:
        await zk.set(path, b"v", 7)
    assert isinstance(stale.value.__cause__, KazooBadVersionError)
    await zk.create(f"{path}/child")
    with pytest.raises(BadRequestError):
        await zk.delete(path)


async def test_ephemeral_and_sequential_nodes(zk: ZkClient, cluster_root: str) -> None:
    await zk.ensure_path(cluster_root)
    first = await zk.create(f"{cluster_root}/n-", ephemeral=True, sequence=True)
    second = await zk.create(f"{cluster_root}/n-", ephemeral=True, sequence=True)
    assert first < second
    assert first.startswith(f"{cluster_root}/n-")
    stat = await zk.exists(first)
    assert stat is not None
    assert stat.ephemeral_owner == zk.session_id != 0


async def test_failed_transaction_applies_nothing(zk: ZkClient, cluster_root: str) -> None:
    await zk.ensure_path(cluster_root)
    await zk.create(f"{cluster_root}/kept", b"old")
    tx = zk.transaction()
    tx.set(f"{cluster_root}/kept", b"new", 0)
    tx.create(f"{cluster_root}/fresh", b"")
    tx.check(f"{cluster_root}/kept", 5)  # stale: the whole transaction must fail
    with pytest.raises(BadVersionError) as err:
        await tx.commit()
    assert "kept" in str(err.value)
    assert await zk.get(f"{cluster_root}/kept") == (b"old", 0)
    assert await zk.exists(f"{cluster_root}/fresh") is None

    tx = zk.transaction()
    tx.set(f"{cluster_root}/kept", b"new", 0)
    tx.create(f"{cluster_root}/fresh", b"")
    tx.delete(f"{cluster_root}/fresh")
    assert await tx.commit() == [1, f"{cluster_root}/fresh", True]


async def test_data_watch_fires_on_change_and_delete(zk: ZkClient, cluster_root: str) -> None:
    path = f"{cluster_root}/watched"
    seen: list[tuple[bytes, int] | None] = []
    watch = await zk.watch_data(path, seen.append)
    try:
        await zk.create(path, b"a", makepath=True)
        await wait_for(lambda: seen[-1] == (b"a", 0))
        await zk.set(path, b"b")
        await wait_for(lambda: seen[-1] == (b"b", 1))
        await zk.delete(path)
        await wait_for(lambda: len(seen) >= 4 and seen[-1] is None)
        assert seen[0] is None  # the first snapshot: absent
    finally:
        watch.cancel()


async def test_children_watch_iterates_latest(zk: ZkClient, cluster_root: str) -> None:
    await zk.ensure_path(cluster_root)
    watch = await zk.watch_children(cluster_root)
    try:
        snapshots = aiter(watch)
        assert await anext(snapshots) == []
        await zk.create(f"{cluster_root}/c1")
        async with asyncio.timeout(scaled(10)):
            assert await anext(snapshots) == ["c1"]
    finally:
        watch.cancel()


async def test_closed_client_says_so(zk_connect: str, cluster_root: str) -> None:
    client = ZkClient(zk_connect)
    await client.connect()
    await client.close()
    with pytest.raises(ClosedError):
        await client.get(cluster_root)


async def test_session_expiry_reaches_listeners(zk: ZkClient, zk_connect: str) -> None:
    states: list[SessionState] = []
    zk.add_state_listener(states.append)
    old_session = zk.session_id
    await expire_session(zk_connect, zk)
    await wait_for(lambda: SessionState.LOST in states)
    # kazoo opens a fresh session after expiry; the new id is visible.
    await wait_for(lambda: zk.state is SessionState.CONNECTED)
    assert zk.session_id not in (0, old_session)
