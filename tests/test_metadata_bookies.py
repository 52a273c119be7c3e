"""Cluster init, the bookie registry and cookies against real ZooKeeper."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from foundation.errors import AlreadyExistsError, CookieMismatchError, NotFoundError
from metadata.bookies import READONLY, WRITABLE, BookieInfo, BookieSet, Cookie
from metadata.layout import LAYOUT_VERSION
from tests.metadata_support import Clients, expire_session, metadata_clients, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def clients(zk_connect: str, cluster_root: str) -> AsyncIterator[Clients]:
    async with metadata_clients(zk_connect, cluster_root) as c:
        yield c


async def test_concurrent_inits_agree_on_one_instance(clients: Clients) -> None:
    members = [await clients.new(init=False) for _ in range(5)]
    with pytest.raises(NotFoundError, match="cluster init"):
        await members[0].cluster.read()
    infos = await asyncio.gather(*(m.init_cluster() for m in members))
    assert len({i.instance_id for i in infos}) == 1
    assert infos[0].layout_version == LAYOUT_VERSION
    assert await members[1].cluster.read() == infos[0]
    assert await members[2].init_cluster() == infos[0]  # idempotent


async def test_register_switch_update_list(clients: Clients) -> None:
    md = await clients.new()
    reg = md.bookies
    b1 = BookieInfo("b1", "127.0.0.1:3181", rack="/r1")
    b2 = BookieInfo("b2", "127.0.0.1:3182")
    await reg.register(b1)
    await reg.register(b2)
    assert await reg.list_writable() == ["b1", "b2"]
    assert await reg.list_readonly() == []

    now_ro = await reg.set_readonly("b1", True)
    assert now_ro.state == READONLY
    assert await reg.list_all() == BookieSet(frozenset({"b2"}), frozenset({"b1"}))
    assert (await reg.get("b1")).rack == "/r1"

    await reg.update(dataclasses.replace(b2, disk_usage=0.9, free_bytes=10))
    assert (await reg.get("b2")).disk_usage == 0.9
    await reg.set_readonly("b1", False)
    assert (await reg.list_info())["b1"].state == WRITABLE
    assert await reg.list_readonly() == []


async def test_second_session_cannot_take_a_live_registration(clients: Clients) -> None:
    first, second = await clients.new(), await clients.new()
    await first.bookies.register(BookieInfo("b1", "h:1"))
    with pytest.raises(AlreadyExistsError, match="already registered"):
        await second.bookies.register(BookieInfo("b1", "h:2"))


async def test_registration_is_ephemeral_and_watched(clients: Clients, zk_connect: str) -> None:
    observer, bookie = await clients.new(), await clients.new()
    seen: list[BookieSet] = []
    watch = await observer.bookies.watch(seen.append)
    try:
        await bookie.bookies.register(BookieInfo("b9", "h:9"))
        await wait_for(lambda: bool(seen) and seen[-1].writable == {"b9"})
        await bookie.bookies.set_readonly("b9", True)
        await wait_for(lambda: seen[-1].readonly == {"b9"} and not seen[-1].writable)
        change = asyncio.ensure_future(watch.next_change(timeout_s=20))
        await expire_session(zk_connect, bookie.zk)  # the bookie "dies"
        assert (await change).all <= {"b9"}
        await wait_for(lambda: seen[-1].all == frozenset())
    finally:
        watch.cancel()


async def test_cookie_written_then_checked(clients: Clients) -> None:
    md = await clients.new()
    instance = (await md.cluster.read()).instance_id
    cookie = Cookie(instance, "/d/journal", "/d/ledgers", "/d/index")
    await md.bookies.ensure_cookie("b1", cookie)  # first start: written
    await md.bookies.ensure_cookie("b1", cookie)  # later starts: checked
    with pytest.raises(AlreadyExistsError):
        await md.bookies.write_cookie("b1", cookie)
    wiped = dataclasses.replace(cookie, ledgers_dir="/other/ledgers", instance_id="x")
    with pytest.raises(CookieMismatchError) as err:
        await md.bookies.check_cookie("b1", wiped)
    assert "ledgers_dir: stored '/d/ledgers', given '/other/ledgers'" in str(err.value)
    assert "instance_id" in str(err.value)
    assert "journal_dir" not in str(err.value)
    with pytest.raises(NotFoundError):
        await md.bookies.check_cookie("b2", cookie)


async def test_a_bookie_turning_writable_between_the_two_reads_is_still_found(
    clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look-up reads the writable path, then the read-only one; a bookie moving from
    read-only to writable between the two reads is in neither, and must still be found
    (a test waiting for the move once failed with "bookie ... is not registered")."""
    md = await clients.new()
    await md.bookies.register(BookieInfo("b1", "h:1"))
    await md.bookies.set_readonly("b1", True)
    zk = md.bookies._zk
    real = zk.get_with_stat
    moved = False

    async def move_after_the_first_read(path: str) -> Any:
        nonlocal moved
        try:
            return await real(path)
        finally:
            if not moved:  # the writable path was just read (not there yet): move now
                moved = True
                await md.bookies.set_readonly("b1", False)

    monkeypatch.setattr(zk, "get_with_stat", move_after_the_first_read)
    assert (await md.bookies.get("b1")).state == WRITABLE
    assert moved
