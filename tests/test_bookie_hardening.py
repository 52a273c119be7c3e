"""A bookie under a token holder who is not a ledger's writer (issue 21): one answer for
held and not-held ledgers (defect 7), a deadline and a budget of their own for
connections that have not authenticated (defect 3), and token expiry for the whole life
of a connection (defect 4). One bookie server in-process, over real TCP on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from bookie.client import BookieConnection, use_token
from bookie.server import BookieServer
from bookie.storage.engine import BookieStorage
from foundation.auth import (
    SERVICE_PRINCIPAL,
    generate_secret,
    sign_token,
    token_expiry,
    write_secret_file,
)
from foundation.errors import (
    ConnectionLostError,
    NoLedgerError,
    NotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
)
from metadata.ledger_metadata import LedgerMetadata, master_key
from tests.ledger_support import keyed_metadata
from tests.metadata_support import wait_for
from tests.test_bookie_server import bookie_config

KEY = master_key(b"the ledger's key")
HELD, NOT_HELD, ABSENT = 1, 2, 3


@dataclasses.dataclass
class Served:
    server: BookieServer
    secret: bytes

    @property
    def address(self) -> str:
        return self.server.address

    def token(self, lifetime_s: float = 600.0, principal: str = "alice") -> str:
        return sign_token(self.secret, principal, time.time() + lifetime_s)


async def serve(tmp_path: Path, **overrides: object) -> AsyncIterator[Served]:
    secret = generate_secret()
    write_secret_file(tmp_path / "auth.secret", secret)
    config = bookie_config(
        tmp_path,
        auth_enabled=True,
        auth_secret_file=str(tmp_path / "auth.secret"),
        **overrides,
    )

    async def lookup(ledger_id: int) -> LedgerMetadata:
        if ledger_id == ABSENT:
            raise NotFoundError(f"ledger {ledger_id}")
        return keyed_metadata(ledger_id, KEY)

    storage = BookieStorage(config)
    await storage.start()
    server = BookieServer(config, storage, bookie_id="b", ledger_lookup=lookup)
    try:
        await server.start()
        yield Served(server, secret)
    finally:
        try:
            await server.stop(drain_timeout_s=5.0)
        finally:
            await storage.close()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async for s in serve(tmp_path):
        yield s


# -- defect 7: which ledgers a bookie holds --------------------------------------------


async def _answer(call: Awaitable[object]) -> str:
    try:
        await call
    except (UnauthorizedError, NoLedgerError) as exc:
        return exc.name
    return "OK"


async def test_a_caller_without_the_key_cannot_tell_held_from_not_held_ledgers(
    served: Served,
) -> None:
    writer = BookieConnection(served.address, token=served.token())
    prober = BookieConnection(served.address, token=served.token(principal="mallory"))
    try:
        await writer.add(HELD, 0, -1, KEY, b"held here")
        wrong = master_key(b"a guess")
        answers: dict[int, set[str]] = {}
        for ledger_id in (HELD, NOT_HELD):
            answers[ledger_id] = {
                await _answer(prober.read(ledger_id, 0, master_key=wrong)),
                await _answer(prober.read_lac(ledger_id, -1, master_key=wrong)),
                await _answer(prober.list_entries(ledger_id, master_key=wrong)),
            }
        assert answers[HELD] == answers[NOT_HELD] == {"UNAUTHORIZED"}
        # The key's holder is told the truth: the bookie holds nothing of NOT_HELD.
        with pytest.raises(NoLedgerError):
            await writer.read(NOT_HELD, 0, master_key=KEY)
        assert (await writer.read(HELD, 0, master_key=KEY)).payload == b"held here"
        # A ledger that exists nowhere: NO_LEDGER for everyone.
        with pytest.raises(NoLedgerError):
            await prober.read(ABSENT, 0, master_key=wrong)
    finally:
        await writer.close()
        await prober.close()


# -- defect 3: idle unauthenticated connections ---------------------------------------

IDLE_SOCKETS = 1_100  # more than connections_max's default 1,024


@pytest.fixture
async def crowded(tmp_path: Path) -> AsyncIterator[Served]:
    # The shipped limits, and the idle timeout that held every slot before.
    async for s in serve(tmp_path, idle_timeout_s=600.0):
        yield s


async def test_idle_unauthenticated_connections_leave_room_for_an_authenticated_client(
    crowded: Served,
) -> None:
    host, port = crowded.address.split(":")
    idle: list[asyncio.StreamWriter] = []
    try:
        for _ in range(IDLE_SOCKETS):
            _reader, writer = await asyncio.open_connection(host, int(port))
            idle.append(writer)  # never sends a byte
        admin = BookieConnection(crowded.address, token=crowded.token(principal=SERVICE_PRINCIPAL))
        try:
            # Served (a generous deadline: the claim is "served", not "fast").
            assert await asyncio.wait_for(admin.list_ledgers(), 30) == ()
        finally:
            await admin.close()
        server = crowded.server
        assert len(server.unauthenticated) <= server.config.unauthenticated_connections_max
    finally:
        for writer in idle:
            writer.close()


async def test_a_connection_that_does_not_authenticate_in_time_is_closed(
    tmp_path: Path,
) -> None:
    async for served in serve(tmp_path, auth_timeout_s=0.5):
        host, port = served.address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            assert await asyncio.wait_for(reader.read(), 30) == b""  # closed, unasked
        finally:
            writer.close()


# -- defect 4: a token's expiry on an open connection --------------------------------

SHORT_TOKEN_S = 2.0  # whole seconds: a token's expiry is


async def _past(expires_at: float) -> None:
    await wait_for(lambda: time.time() > expires_at + 0.2, timeout_s=SHORT_TOKEN_S + 30)


async def test_an_expired_token_is_refused_on_an_open_connection(served: Served) -> None:
    token = served.token(lifetime_s=SHORT_TOKEN_S)
    conn = BookieConnection(served.address, token=token)
    try:
        await conn.add(HELD, 0, -1, KEY, b"while valid")
        expires_at = token_expiry(token)
        assert expires_at is not None
        await _past(expires_at)
        with pytest.raises((UnauthenticatedError, ConnectionLostError)):
            await conn.read(HELD, 0, master_key=KEY)
    finally:
        await conn.close()


async def test_a_service_renews_its_token_before_it_expires(served: Served) -> None:
    use_token(lambda: served.token(lifetime_s=SHORT_TOKEN_S, principal=SERVICE_PRINCIPAL))
    conn = BookieConnection(served.address)
    try:
        await conn.add(HELD, 0, -1, KEY, b"first token")
        wire = conn._wire
        first_expiry = time.time() + SHORT_TOKEN_S
        await _past(first_expiry)
        # The same connection, still served: it re-authenticated in time.
        assert (await conn.read(HELD, 0, master_key=KEY)).payload == b"first token"
        assert await conn.list_ledgers() == (HELD,)
        assert conn._wire is wire
    finally:
        use_token(None)
        await conn.close()
