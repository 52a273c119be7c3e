"""A bookie as an outsider meets it (issue 15): real bookie processes, the session's real
ZooKeeper. Without the ledger's key nothing is read, added or fenced -- and a live
writer keeps writing through the attempt; a ledger that exists nowhere in metadata
gets no entry; with auth on, a connection is served only after a valid token.

Before per-ledger keys and protocol version 2, READ, READ_LAC and LIST_ENTRIES needed no
key at all and the first ADD of any ledger id was stored (tests 1 and 2 fail on it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import crc32c
import msgpack
import pytest

from bookie import protocol as p
from bookie.client import BookieConnection, use_token
from foundation.auth import SERVICE_PRINCIPAL, generate_secret, sign_token, write_secret_file
from foundation.errors import (
    ConnectionLostError,
    ForbiddenError,
    NoLedgerError,
    NotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
)
from ledger.adapters import connect_cluster
from ledger.client import LedgerClient
from ledger.config import LedgerConfig
from ledger.keys import ledger_access, read_secret, write_secret
from ledger.writer import LedgerWriter
from metadata.ledger_metadata import LedgerMetadata, master_key
from tests.conftest import BookieCluster
from tests.ledger_support import register_ledgers
from tests.test_bookie_integration import BookieProcess

pytestmark = pytest.mark.integration

WRONG_KEYS = (b"", master_key(b"bookline"), master_key(b"a guess"))
_ids = itertools.count(1)


@pytest.fixture
async def keyed_client(
    bookie_cluster: BookieCluster, tmp_path: Path
) -> AsyncIterator[LedgerClient]:
    secret = str(tmp_path / "ledger.secret")
    write_secret(secret)
    store, transport, close = await connect_cluster(bookie_cluster.zk, bookie_cluster.root)
    try:
        yield LedgerClient(store, transport, LedgerConfig(secret_file=secret))
    finally:
        await close()


async def live_ledger(client: LedgerClient) -> LedgerWriter:
    writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    for i in range(5):
        await writer.add_entry(b"entry %d" % i)
    return writer


async def test_without_the_key_nothing_is_read_added_or_fenced(keyed_client: LedgerClient) -> None:
    writer = await live_ledger(keyed_client)
    lid = writer.ledger_id
    forged = b"forged entry"
    for bookie in writer.metadata.last_segment.bookies:
        conn = BookieConnection(bookie)
        try:
            for key in WRONG_KEYS:
                with pytest.raises(UnauthorizedError):
                    await conn.read(lid, 0, master_key=key)
                with pytest.raises(UnauthorizedError):
                    await conn.read(lid, -1, fence=True, master_key=key)  # recovery's fence
                with pytest.raises(UnauthorizedError):
                    await conn.read_lac(lid, -1, master_key=key)
                with pytest.raises(UnauthorizedError):
                    await conn.list_entries(lid, master_key=key)
                with pytest.raises(UnauthorizedError):
                    await conn.adder(lid, key).add(5, 4, forged)
                with pytest.raises(UnauthorizedError):
                    await conn.adder(lid, key, recovery=True).add(5, 4, forged)
                with pytest.raises(UnauthorizedError):
                    await conn.write_lac(lid, 4, key)
        finally:
            await conn.close()
    # The writer was never fenced: it keeps writing, and every entry reads back.
    for i in range(5, 10):
        await writer.add_entry(b"entry %d" % i)
    await writer.close()
    reader = await keyed_client.open_ledger(lid, recover=False)
    assert await reader.read(0, 9) == [b"entry %d" % i for i in range(10)]


async def test_fencing_a_live_ledger_needs_its_key(
    keyed_client: LedgerClient, bookie_cluster: BookieCluster
) -> None:
    """Recovery by a client without the cluster's ledger secret never reaches a bookie,
    and fencing reads sent by hand with a guessed key are refused: the writer goes on."""
    writer = await live_ledger(keyed_client)
    store, transport, close = await connect_cluster(bookie_cluster.zk, bookie_cluster.root)
    try:
        outsider = LedgerClient(store, transport, LedgerConfig())  # no secret
        with pytest.raises(UnauthorizedError, match="secret"):
            await outsider.open_ledger(writer.ledger_id, recover=True)
        meta, _version = await store.read(writer.ledger_id)
        assert meta.state.value == "OPEN"  # not even marked IN_RECOVERY
    finally:
        await close()
    await writer.add_entry(b"still writing")
    assert writer.last_add_confirmed >= 4
    await writer.close()


async def test_adds_for_ledgers_not_in_metadata_are_refused(
    keyed_client: LedgerClient, bookie_cluster: BookieCluster
) -> None:
    writer = await live_ledger(keyed_client)
    access = ledger_access(writer.metadata, read_secret(keyed_client.config.secret_file))
    nowhere = 1 << 62 | next(_ids)
    conn = BookieConnection(f"127.0.0.1:{bookie_cluster.bookies[0][1]}")
    try:
        with pytest.raises(NoLedgerError, match="does not exist"):
            await conn.adder(nowhere, access.master_key).add(0, -1, b"squatter")
        with pytest.raises(NoLedgerError, match="does not exist"):
            await conn.read(nowhere, -1, fence=True, master_key=access.master_key)
        assert nowhere not in await conn.list_ledgers()  # nothing was stored
        # A ledger in metadata that this bookie does not hold yet (a re-replication
        # target): its first add needs the ledger's key, then it is taken.
        other = 1 << 62 | next(_ids)
        await register_ledgers(bookie_cluster.zk, bookie_cluster.root, access.master_key, other)
        with pytest.raises(UnauthorizedError):
            await conn.adder(other, master_key(b"guess"), recovery=True).add(0, -1, b"x")
        await conn.adder(other, access.master_key, recovery=True).add(0, -1, b"copied")
        assert (await conn.read(other, 0, master_key=access.master_key)).payload == b"copied"
    finally:
        await conn.close()
    await writer.close()


# -- authentication -----------------------------------------------------------------------


@pytest.fixture
def secret(tmp_path: Path) -> bytes:
    value = generate_secret()
    write_secret_file(tmp_path / "auth.secret", value)
    return value


@pytest.fixture
def auth_bookie(
    workdir: Path, zk_connect: str, cluster_root: str, secret: bytes
) -> Iterator[BookieProcess]:
    config = f'auth_enabled = true\nauth_secret_file = "{workdir / "auth.secret"}"\n'
    bookie = BookieProcess(workdir, zk_connect, cluster_root, extra_config=config)
    try:
        bookie.start()
        yield bookie
    finally:
        bookie.stop()


def token(secret: bytes, principal: str, lifetime_s: float = 600) -> str:
    return sign_token(secret, principal, time.time() + lifetime_s)


async def test_a_connection_is_served_only_after_a_valid_token(
    auth_bookie: BookieProcess, secret: bytes, zk_connect: str, cluster_root: str
) -> None:
    key = master_key(b"k")
    await register_ledgers(zk_connect, cluster_root, key, 1)
    refused = {
        "no token": None,
        "forged": token(generate_secret(), SERVICE_PRINCIPAL),
        "expired": token(secret, "alice", -1),
        "garbage": "bl1.x.y.z",
    }
    for bad in refused.values():
        conn = BookieConnection(auth_bookie.address, token=bad)
        try:
            with pytest.raises(UnauthenticatedError):
                await conn.info()
            # The next request: refused again, or the connection is already gone.
            with pytest.raises((UnauthenticatedError, ConnectionLostError)):
                await conn.adder(1, key).add(0, -1, b"not stored")
        finally:
            await conn.close()
    service = BookieConnection(auth_bookie.address, token=token(secret, SERVICE_PRINCIPAL))
    try:
        assert await service.list_ledgers() == ()  # nothing of theirs was stored
    finally:
        await service.close()
    alice = BookieConnection(auth_bookie.address, token=token(secret, "alice"))
    try:
        await alice.adder(1, key).add(0, -1, b"by alice")
        assert (await alice.read(1, 0, master_key=key)).payload == b"by alice"
        with pytest.raises(ForbiddenError):  # a bookie's inventory: admins only
            await alice.list_ledgers()
    finally:
        await alice.close()
    use_token(lambda: token(secret, SERVICE_PRINCIPAL))  # a service signing its own
    try:
        service = BookieConnection(auth_bookie.address)
        try:
            assert await service.list_ledgers() == (1,)
        finally:
            await service.close()
    finally:
        use_token(None)


async def test_a_request_before_auth_is_refused_and_the_connection_closed(
    auth_bookie: BookieProcess,
) -> None:
    host, port = auth_bookie.address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(p.encode_request(p.InfoRequest(7)))
        answer = await asyncio.wait_for(reader.read(), 10)  # up to the close
    finally:
        writer.close()
    decoder = p.Decoder(responses=True)
    decoder.feed(answer)
    error = decoder.next_frame()
    assert isinstance(error, p.ErrorResponse)
    assert (error.request_id, error.code) == (7, UnauthenticatedError.code)
    assert decoder.next_frame() is p.NEED_DATA  # nothing after it: closed


async def test_version_1_frames_get_a_protocol_version_error(auth_bookie: BookieProcess) -> None:
    host, port = auth_bookie.address.split(":")
    meta = msgpack.packb([1, 0, b""])
    header = struct.pack(
        ">2sBBBBHIIQ", p.MAGIC, 1, int(p.Op.READ), 0, 0, 0, len(meta), len(meta), 3
    )
    frame = header + struct.pack(">I", crc32c.crc32c(meta, crc32c.crc32c(header))) + meta
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame)
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    decoder = p.Decoder(responses=True)
    decoder.feed(answer)
    error = decoder.next_frame()
    assert isinstance(error, p.ErrorResponse)
    assert error.code == 25  # PROTOCOL_VERSION: the old client is told, in version 2


# -- `bookline local`: bookie auth and ledger keys on by default ---------------------------


async def test_a_local_cluster_with_auth_locks_its_bookies(tmp_path: Path) -> None:
    """``LocalCluster(auth=True)`` (``bookline local``'s default): bookies refuse a
    connection without a token; the proxies (a service token in their environment) and
    a core-library user of cluster.json (its token and ledger secret) work, and the
    segments they write have derived keys -- nothing to steal in ZooKeeper."""
    from ops.cluster.local import LocalCluster
    from streams.namespace import Namespace
    from streams.records import LogRecord
    from thinclient.proxy_client import ProxyClient

    cluster = LocalCluster(
        tmp_path / "local", bookies=3, write_proxies=1, read_proxies=0, auth=True
    )
    cluster.start()
    try:
        cluster_file = cluster.dir / "cluster.json"
        stranger = BookieConnection(cluster.bookies[0].address)
        try:
            with pytest.raises(UnauthenticatedError):
                await stranger.info()
        finally:
            await stranger.close()
        async with ProxyClient.from_cluster_file(cluster_file) as client:
            await client.write("via-proxy", b"through the write proxy")
        ns = await Namespace.from_cluster_file(cluster_file, "sec")
        try:
            await ns.create_stream("core")
            writer = await ns.open_writer("core")
            await writer.write(LogRecord(b"through the core library"))
            await writer.close()
            (segment,) = await ns.segments("core")
            meta, _version = await ns.context.ledgers.store.read(segment.ledger_id)
            assert meta.key_salt and not meta.password  # derived from the ledger secret
            reader = await ns.open_reader("core", "earliest")
            record = await reader.read_next(timeout_s=10)
            await reader.close()
            assert record is not None
            assert record.payload == b"through the core library"
        finally:
            await ns.close()
        # The CLI too: its token and ledger secret come from the cluster file.
        out = tmp_path / "entries.bin"
        argv = ["ledger", "read", str(segment.ledger_id), "--cluster", str(cluster_file)]
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *argv, "--out", str(out)],
            capture_output=True,
            timeout=60,
            check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("BOOKLINE_")},
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert b"through the core library" in out.read_bytes()
        bench = ["bench", "bookie", "--cluster", str(cluster_file), "--entries", "200"]
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *bench, "--json"],
            capture_output=True,
            timeout=120,
            check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("BOOKLINE_")},
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    finally:
        cluster.stop()


# -- the gate's look-ups (no processes) ----------------------------------------------------


class _Held:
    """The one thing the gate asks of storage: the key a ledger was stored under."""

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}

    def master_key_of(self, ledger_id: int) -> bytes | None:
        return self.keys.get(ledger_id)


async def test_pipelined_first_adds_share_one_metadata_look_up() -> None:
    from bookie.access import LedgerGate
    from tests.ledger_support import keyed_metadata

    key = master_key(b"k")
    looked_up: list[int] = []

    async def lookup(ledger_id: int) -> LedgerMetadata:
        looked_up.append(ledger_id)
        await asyncio.sleep(0.01)  # a slow look-up: the pipelined adds arrive meanwhile
        if ledger_id == 404:
            raise NotFoundError("no such znode")
        return keyed_metadata(ledger_id, key)

    held = _Held()
    gate = LedgerGate(held, lookup)  # type: ignore[arg-type]
    await asyncio.gather(*(gate.admit(7, key) for _ in range(50)))
    assert looked_up == [7]  # one look-up for the writer's fifty pipelined first adds
    assert gate.admits_now(7, key) and not gate.admits_now(7, master_key(b"guess"))
    with pytest.raises(UnauthorizedError):
        await gate.admit(7, master_key(b"guess"))
    with pytest.raises(NoLedgerError):
        await gate.admit(404, key)
    held.keys[8] = key  # held by storage: its own check, no look-up
    await gate.admit(8, master_key(b"anything"))
    assert looked_up == [7, 404]
    assert gate.holds_under(8, key) and not gate.holds_under(8, b"")
    await gate.check_read(8, key)
    with pytest.raises(UnauthorizedError):
        await gate.check_read(8, b"")
