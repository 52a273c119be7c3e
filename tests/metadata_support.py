"""Helpers for the metadata tests: ZooKeeper clients that are always closed, and a way to
expire a session the way a real network partition would (ZooKeeper side)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from kazoo.client import KazooClient

from foundation.config import MetadataConfig
from metadata import MetadataClient, ZkClient
from tests.waiting import WAIT_S, wait_for

__all__ = ["WAIT_S", "Clients", "expire_session", "metadata_clients", "wait_for"]

# Short sessions so an expired owner is noticed quickly; well within ZK's 1..60 s range.
TEST_SESSION_TIMEOUT_MS = 4_000


class Clients:
    """Opens metadata clients on one cluster root and closes every one of them."""

    def __init__(self, connect: str, root: str) -> None:
        self.connect = connect
        self.root = root
        self._open: list[MetadataClient] = []

    async def new(self, *, init: bool = True, id_block_size: int = 100) -> MetadataClient:
        config = MetadataConfig(
            zk=self.connect, root=self.root, session_timeout_ms=TEST_SESSION_TIMEOUT_MS
        )
        md = MetadataClient(config, id_block_size=id_block_size)
        self._open.append(md)
        await md.connect()
        if init:
            await md.init_cluster()
        return md

    async def close_all(self) -> None:
        errors: list[BaseException] = []
        for md in self._open:
            try:
                await md.close()
            except Exception as exc:  # noqa: BLE001 - every session closed; first error raised
                errors.append(exc)
        self._open.clear()
        if errors:
            raise errors[0]


@contextlib.asynccontextmanager
async def metadata_clients(connect: str, root: str) -> AsyncIterator[Clients]:
    clients = Clients(connect, root)
    try:
        yield clients
    finally:
        await clients.close_all()


def _expire(connect: str, session_id: int, password: bytes) -> None:
    # A second client that joins the session and then closes it makes ZooKeeper end the
    # session: its ephemeral nodes go, and the original client learns it has expired.
    other = KazooClient(hosts=connect, client_id=(session_id, password), timeout=4.0)
    try:
        other.start(timeout=10)
        other.stop()
    finally:
        other.close()


async def expire_session(connect: str, zk: ZkClient) -> None:
    session_id, password = zk.session_id, zk.session_password
    assert session_id, "client not connected"
    await asyncio.get_running_loop().run_in_executor(None, _expire, connect, session_id, password)
