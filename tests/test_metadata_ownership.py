"""Stream locks, session events, owner records and proxies against real ZooKeeper."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from foundation.errors import LockOwnedError, OwnershipLostError
from metadata import MetadataClient, SessionState
from metadata.ownership import LockState
from metadata.proxies import ProxyInfo
from tests.metadata_support import WAIT_S, Clients, expire_session, metadata_clients, wait_for
from tests.waiting import scaled

pytestmark = pytest.mark.integration

NS, S = "ns", "orders"


@pytest.fixture
async def clients(zk_connect: str, cluster_root: str) -> AsyncIterator[Clients]:
    async with metadata_clients(zk_connect, cluster_root) as c:
        yield c


async def two_contenders(clients: Clients) -> tuple[MetadataClient, MetadataClient]:
    a, b = await clients.new(), await clients.new()
    await a.streams.create_namespace(NS)
    await a.streams.create_stream(NS, S)
    return a, b


async def test_exactly_one_owner_other_learns_who(clients: Clients) -> None:
    a, b = await two_contenders(clients)
    lock_a = a.stream_lock(NS, S, "proxy-a@10.0.0.1:8080")
    lock_b = b.stream_lock(NS, S, "proxy-b@10.0.0.2:8080")
    results = await asyncio.gather(
        lock_a.try_acquire(), lock_b.try_acquire(), return_exceptions=True
    )
    winners = [r for r in results if r is None]
    losers = [r for r in results if isinstance(r, LockOwnedError)]
    assert len(winners) == 1
    assert len(losers) == 1
    winner, loser = (lock_a, lock_b) if results[0] is None else (lock_b, lock_a)
    assert losers[0].owner == winner.identity
    assert winner.state is LockState.OWNED
    assert loser.state is LockState.UNLOCKED
    winner.check_owner()
    with pytest.raises(OwnershipLostError):
        loser.check_owner()
    assert await loser.owner() == winner.identity
    # The loser left no node behind; after release nobody owns the stream.
    assert len(await a.zk.get_children(a.layout.lock(NS, S))) == 1
    await winner.release()
    assert await loser.owner() is None
    await loser.try_acquire()
    assert await winner.owner() == loser.identity
    await loser.release()


async def test_acquire_waits_then_times_out_naming_owner(clients: Clients) -> None:
    a, b = await two_contenders(clients)
    holder = a.stream_lock(NS, S, "holder")
    await holder.try_acquire()
    waiter = b.stream_lock(NS, S, "waiter")
    with pytest.raises(LockOwnedError) as err:
        await waiter.acquire(timeout_s=0.3)
    assert err.value.owner == "holder"
    pending = asyncio.ensure_future(waiter.acquire(timeout_s=scaled(WAIT_S)))
    await asyncio.sleep(0.2)  # behaviour: the waiter waits while the lock is held
    assert not pending.done()
    await holder.release()
    await pending
    assert waiter.state is LockState.OWNED
    assert await holder.owner() == "waiter"
    await waiter.release()


async def test_expired_owner_is_told_lost_and_other_takes_over(
    clients: Clients, zk_connect: str
) -> None:
    a, b = await two_contenders(clients)
    owner = a.stream_lock(NS, S, "owner-a")
    states: list[LockState] = []
    owner.add_listener(states.append)
    await owner.try_acquire()
    node = owner.node
    assert node is not None
    contender = b.stream_lock(NS, S, "contender-b")
    takeover = asyncio.ensure_future(contender.acquire(timeout_s=scaled(WAIT_S)))
    await asyncio.sleep(0.1)  # behaviour: the contender waits while the owner lives
    assert not takeover.done()

    await expire_session(zk_connect, a.zk)

    async with asyncio.timeout(scaled(WAIT_S)):
        await takeover
        await owner.lost.wait()
    assert owner.state is LockState.LOST
    assert states[-1] is LockState.LOST
    assert await b.zk.exists(node) is None
    assert contender.state is LockState.OWNED
    # a's client opens a new session by itself; then it can see the new owner.
    await wait_for(lambda: a.zk.state is SessionState.CONNECTED)
    assert await owner.owner() == "contender-b"
    with pytest.raises(OwnershipLostError):
        owner.check_owner()
    await contender.release()


async def test_suspended_then_reconnected_keeps_ownership(clients: Clients) -> None:
    a, _b = await two_contenders(clients)
    lock = a.stream_lock(NS, S, "owner")
    states: list[LockState] = []
    lock.add_listener(states.append)
    await lock.try_acquire()
    # Drop the TCP connection under kazoo (not the session): SUSPENDED, then back.
    # shutdown() (not close()) keeps the fd valid for kazoo's select loop.
    a.zk._kazoo._connection._socket.shutdown(socket.SHUT_RDWR)
    await wait_for(lambda: LockState.SUSPENDED in states)
    await wait_for(lambda: lock.state is LockState.OWNED)
    assert states == [LockState.OWNED, LockState.SUSPENDED, LockState.OWNED]
    await lock.release()


async def test_owner_records_and_proxies(clients: Clients, zk_connect: str) -> None:
    a, b = await clients.new(), await clients.new()
    await a.proxies.register(ProxyInfo("p1", "http://10.0.0.1:8080"))
    await b.proxies.register(ProxyInfo("p2", "http://10.0.0.2:8080", load=3))
    assert sorted(await a.proxies.list()) == ["p1", "p2"]
    await a.proxies.claim_owner(NS, S, "p1", "http://10.0.0.1:8080")
    await a.proxies.claim_owner(NS, S, "p1", "http://10.0.0.1:8080")  # idempotent for us
    with pytest.raises(LockOwnedError) as err:
        await b.proxies.claim_owner(NS, S, "p2", "http://10.0.0.2:8080")
    assert err.value.owner == "http://10.0.0.1:8080"
    await b.proxies.release_owner(NS, S)  # not b's: stays
    record = await b.proxies.get_owner(NS, S)
    assert record is not None
    assert record.proxy_id == "p1"
    await expire_session(zk_connect, a.zk)
    await wait_for(lambda: a.zk.state is SessionState.CONNECTED)

    async def released() -> bool:
        return await b.proxies.get_owner(NS, S) is None

    await wait_for(released, "the expired proxy's ownership to go")
    assert list(await b.proxies.list()) == ["p2"]
