"""A write proxy that cannot acquire a stream (too few bookies) does not try again for
every request: before, each retried write took the stream's lock, recovered its last
segment and let go again -- about 20 times a second under one retrying client, seen
with `bookline local`'s old defaults after one bookie died."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from foundation.errors import NotEnoughBookiesError
from serving.write.ownership import Ownership
from writeproxy.config import WriteProxyConfig


class FakeNamespace:
    def __init__(self) -> None:
        self.opens = 0
        self.fail = True

    async def exists(self, name: str) -> bool:
        return True

    async def open_writer(self, name: str, identity: str) -> Any:
        self.opens += 1
        if self.fail:
            raise NotEnoughBookiesError("ensemble of 3 needs as many writable bookies, 2 available")
        return SimpleNamespace(close=_nothing)

    async def segments(self, name: str) -> list[Any]:
        return []


async def _nothing(*args: object) -> None:
    return None


def _md() -> Any:
    proxies = SimpleNamespace(
        get_owner=lambda ns, s: _value(None),
        claim_owner=lambda ns, s, pid, addr: _value(None),
        release_owner=lambda ns, s: _value(None),
    )
    return SimpleNamespace(proxies=proxies, zk=SimpleNamespace(session_id=1))


async def _value(v: object) -> object:
    return v


async def test_a_failed_acquisition_is_not_retried_for_every_request() -> None:
    ns = FakeNamespace()
    config = WriteProxyConfig().write_config()
    own = Ownership(config, ns, _md(), "http://127.0.0.1:1")  # type: ignore[arg-type]
    for _ in range(11):
        with pytest.raises(NotEnoughBookiesError):
            await own.get("s")
    assert ns.opens == 1, f"{ns.opens} acquisitions for 11 requests"


async def test_the_back_off_doubles_and_ends_with_a_success() -> None:
    ns = FakeNamespace()
    now = [0.0]
    own = Ownership(
        WriteProxyConfig().write_config(),
        ns,  # type: ignore[arg-type]
        _md(),
        "http://127.0.0.1:1",
        clock=lambda: now[0],
    )
    with pytest.raises(NotEnoughBookiesError):
        await own.get("s")
    with pytest.raises(NotEnoughBookiesError, match="not acquired again for"):
        await own.get("s")
    now[0] += 0.6  # past the first back-off (0.5 s)
    with pytest.raises(NotEnoughBookiesError):
        await own.get("s")
    assert ns.opens == 2
    now[0] += 0.6  # not past the second (1 s)
    with pytest.raises(NotEnoughBookiesError):
        await own.get("s")
    assert ns.opens == 2
    ns.fail = False
    now[0] += 0.6
    stream = await own.get("s")
    assert ns.opens == 3 and stream.name == "s"
    # Healthy again: no back-off left over.
    await own.drop("s")
    assert (await own.get("s")).name == "s" and ns.opens == 4
