"""Adapters from the ledger client's interfaces (:mod:`ledger.interfaces`) to the real
metadata layer (:mod:`metadata`, ZooKeeper) and bookie client (:mod:`bookie.client`).

* :class:`ZkLedgerStore` keeps :class:`metadata.ledger_metadata.LedgerMetadata` in the
  ZooKeeper store and maps "znode absent" to NO_LEDGER.
* :class:`PoolTransport` (also the scrub's :class:`ledger.interfaces.ReplicaInspector`) resolves
  bookie ids to addresses through the bookie registry
  (cached: a bookie that just died keeps its last known address, so requests to it fail
  as connection errors, not as "unknown bookie") and bounds every request, including the
  wait for room on a saturated connection, by its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from bookie.client import BookieClientPool, BookieConnection, ClientOptions, LedgerAdder
from bookie.identity import BookieIdentity
from bookie.protocol import FEATURE_LAC_ENTRIES, FEATURE_REPLICA_CHECK, FEATURE_WRITE_LAC
from foundation.config import MetadataConfig
from foundation.errors import (
    BadRequestError,
    ConnectionLostError,
    NoLedgerError,
    NotFoundError,
    TimeoutError_,
)
from ledger.config import LedgerConfig
from ledger.interfaces import AddCallback, ChecksumPage, LacAnswer, ReadAnswer
from ledger.keys import bookie_identity
from ledger.placement import BookieCandidate
from metadata.bookies import BookieRegistry
from metadata.client import MetadataClient
from metadata.ledger_ids import LedgerIdAllocator
from metadata.ledger_metadata import LedgerMetadata
from metadata.ledgers import LedgerStore

log = logging.getLogger(__name__)

__all__ = ["PoolTransport", "ZkLedgerStore", "connect_cluster"]

# Slack on top of a request's own deadline for the pool's connect and queueing.
_REQUEST_SLACK_S = 1.0


class ZkLedgerStore:
    """:class:`ledger.interfaces.MetadataStore` on ZooKeeper."""

    def __init__(
        self,
        ledgers: LedgerStore,
        registry: BookieRegistry,
        ids: LedgerIdAllocator,
        *,
        identity: BookieIdentity | None = None,
    ) -> None:
        """``identity``: placement offers only bookies whose registration proves the
        credential the cluster issued them (bookie/identity.py); None: every one."""
        self._ledgers = ledgers
        self._registry = registry
        self._ids = ids
        self._identity = identity
        self.addresses: dict[str, str] = {}

    async def next_ledger_id(self) -> int:
        return await self._ids.next_id()

    async def create(self, meta: LedgerMetadata) -> int:
        return await self._ledgers.create(meta)

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        try:
            return await self._ledgers.read(ledger_id)
        except NotFoundError as exc:
            raise NoLedgerError(f"ledger {ledger_id} does not exist") from exc

    async def write(self, meta: LedgerMetadata, version: int) -> int:
        try:
            return await self._ledgers.update(meta, version)
        except NotFoundError as exc:
            raise NoLedgerError(f"ledger {meta.ledger_id} was deleted") from exc

    async def delete(self, ledger_id: int) -> None:
        try:
            await self._ledgers.delete(ledger_id)
        except NotFoundError as exc:
            raise NoLedgerError(f"ledger {ledger_id} does not exist") from exc

    async def writable_bookies(self) -> list[BookieCandidate]:
        out: list[BookieCandidate] = []
        for bookie_id in await self._registry.list_writable():
            try:
                info = await self._registry.get(bookie_id)
            except NotFoundError:
                continue  # left while we listed
            if info.state != "writable":
                continue
            if self._identity is not None and not self._identity.registration_ok(
                bookie_id, info.address, info.proof
            ):
                log.warning(
                    "bookie %s: registration without the cluster's proof, skipped", bookie_id
                )
                continue
            self.addresses[bookie_id] = info.address
            out.append(BookieCandidate(bookie_id, info.rack))
        return out

    async def address_of(self, bookie_id: str) -> str:
        address = self.addresses.get(bookie_id)
        if address is not None:
            return address
        try:
            info = await self._registry.get(bookie_id)
        except NotFoundError as exc:
            raise ConnectionLostError(f"bookie {bookie_id} is not registered") from exc
        self.addresses[bookie_id] = info.address
        return info.address


class PoolTransport:
    """:class:`ledger.interfaces.BookieTransport` over a :class:`BookieClientPool`."""

    def __init__(self, pool: BookieClientPool, resolve: Callable[[str], Awaitable[str]]) -> None:
        self._pool = pool
        self._resolve = resolve
        # Bookie id -> its connection, once resolved: lets add_callback stay synchronous.
        self._conns: dict[str, BookieConnection] = {}

    async def _conn(self, bookie: str) -> BookieConnection:
        conn = self._pool.get(await self._resolve(bookie))
        self._conns[bookie] = conn
        return conn

    def known_conn(self, bookie: str) -> BookieConnection | None:
        """The bookie's open connection if it was resolved already, else None."""
        conn = self._conns.get(bookie)
        return None if conn is None or conn.closed else conn

    def adder(
        self,
        bookie: str,
        ledger_id: int,
        master_key: bytes,
        *,
        recovery: bool = False,
        timeout_s: float,
    ) -> _PoolAdder:
        return _PoolAdder(
            self,
            bookie,
            ledger_id=ledger_id,
            master_key=master_key,
            recovery=recovery,
            timeout_s=timeout_s,
        )

    async def read(
        self,
        bookie: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool,
        master_key: bytes,
        timeout_s: float,
    ) -> ReadAnswer:
        conn = await self._conn(bookie)
        async with _answer_within(bookie, "answer", timeout_s):
            resp = await conn.read(
                ledger_id, entry_id, fence=fence, master_key=master_key, timeout_s=timeout_s
            )
        return ReadAnswer(resp.entry_id, resp.lac, resp.payload)

    async def read_lac(
        self,
        bookie: str,
        ledger_id: int,
        previous_lac: int,
        timeout_ms: int,
        *,
        timeout_s: float,
        piggyback_bytes_max: int = 0,
        master_key: bytes = b"",
    ) -> LacAnswer:
        conn = await self._conn(bookie)
        async with _answer_within(bookie, "LAC answer", timeout_s):
            if piggyback_bytes_max and FEATURE_LAC_ENTRIES not in await conn.features(
                timeout_s=timeout_s
            ):
                piggyback_bytes_max = 0  # an older bookie: one entry per answer
            resp = await conn.read_lac(
                ledger_id,
                previous_lac,
                timeout_ms,
                timeout_s=max(timeout_s - timeout_ms / 1000.0, 0.001),
                piggyback_bytes_max=piggyback_bytes_max,
                master_key=master_key,
            )
        return LacAnswer(resp.lac, resp.next_entry_id, resp.next_entry, resp.more_entries)

    async def write_lac(
        self, bookie: str, ledger_id: int, lac: int, master_key: bytes, *, timeout_s: float
    ) -> bool:
        conn = await self._conn(bookie)
        async with _answer_within(bookie, "WRITE_LAC answer", timeout_s):
            if FEATURE_WRITE_LAC not in await conn.features(timeout_s=timeout_s):
                return False  # an older bookie would drop the connection on the op
            await conn.write_lac(ledger_id, lac, master_key, timeout_s=timeout_s)
        return True

    async def _replica_check_conn(self, bookie: str, timeout_s: float) -> BookieConnection:
        conn = await self._conn(bookie)
        if FEATURE_REPLICA_CHECK not in await conn.features(timeout_s=timeout_s):
            # An older bookie would drop the connection on the op: say so instead.
            raise BadRequestError(f"bookie {bookie} does not serve replica checks (upgrade it)")
        return conn

    async def entry_checksums(
        self,
        bookie: str,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        timeout_s: float,
    ) -> ChecksumPage:
        async with _answer_within(bookie, "checksum answer", timeout_s):
            conn = await self._replica_check_conn(bookie, timeout_s)
            try:
                resp = await conn.entry_checksums(
                    ledger_id, first_entry_id, last_entry_id, timeout_s=timeout_s
                )
            except NoLedgerError:
                return ChecksumPage(last_entry_id, {}, frozenset())  # holds none of it
        fingerprints = {c.entry_id: (c.crc32c, c.length) for c in resp.checksums}
        return ChecksumPage(resp.last_entry_id, fingerprints, frozenset(resp.damaged))

    async def damaged_entries(
        self, bookie: str, *, limit: int, timeout_s: float
    ) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        start: tuple[int, int] | None = (0, 0)
        async with _answer_within(bookie, "damaged-entry list", timeout_s):
            conn = await self._replica_check_conn(bookie, timeout_s)
            while start is not None and len(out) < limit:
                page = await conn.list_damaged(*start, timeout_s=timeout_s)
                out.extend(page.damaged)
                start = page.next_from
        return out[:limit]


class _PoolAdder:
    """:class:`ledger.interfaces.EntryAdder` over the pool: a
    :class:`bookie.client.LedgerAdder` on the bookie's connection, made again when the
    bookie's connection changed (resolved anew, or reconnected after the pool closed
    one)."""

    __slots__ = (
        "_adder",
        "_bookie",
        "_conn",
        "_key",
        "_ledger_id",
        "_recovery",
        "_timeout_s",
        "_transport",
    )

    def __init__(
        self,
        transport: PoolTransport,
        bookie: str,
        *,
        ledger_id: int,
        master_key: bytes,
        recovery: bool,
        timeout_s: float,
    ) -> None:
        self._transport = transport
        self._bookie = bookie
        self._ledger_id = ledger_id
        self._key = master_key
        self._recovery = recovery
        self._timeout_s = timeout_s
        self._conn: BookieConnection | None = None
        self._adder: LedgerAdder | None = None

    def _on(self, conn: BookieConnection) -> LedgerAdder:
        adder = self._adder
        if adder is None or conn is not self._conn:
            adder = conn.adder(
                self._ledger_id, self._key, recovery=self._recovery, timeout_s=self._timeout_s
            )
            self._conn, self._adder = conn, adder
        return adder

    async def add(self, entry_id: int, lac: int, data: bytes) -> None:
        adder = self._on(await self._transport._conn(self._bookie))
        async with _answer_within(self._bookie, "answer", self._timeout_s):
            await adder.add(entry_id, lac, data)

    def add_callback(
        self, entry_id: int, lac: int, data: bytes, callback: AddCallback
    ) -> asyncio.Future[None] | None:
        """The writer's hot path: no coroutine or task once the bookie's connection is
        known (the connection's deadline sweep bounds the request, and its slow path --
        waiting for room or a reconnect -- is bounded by the other requests' deadlines
        and the connect timeout)."""
        conn = self._transport.known_conn(self._bookie)
        if conn is not None:
            return self._on(conn).add_callback(entry_id, lac, data, callback)
        task = asyncio.ensure_future(self.add(entry_id, lac, data))

        def done(t: asyncio.Future[None]) -> None:
            if not t.cancelled():
                callback(t.exception())

        task.add_done_callback(done)
        return task


@contextlib.asynccontextmanager
async def _answer_within(bookie: str, what: str, timeout_s: float) -> AsyncIterator[None]:
    """Bound a bookie call by its own timeout plus slack (a backstop: the connection
    normally times the request out first) and say which bookie did not answer."""
    try:
        async with asyncio.timeout(timeout_s + _REQUEST_SLACK_S):
            yield
    except TimeoutError as exc:
        raise TimeoutError_(f"bookie {bookie}: no {what} within {timeout_s:.3f}s") from exc


async def connect_cluster(
    zk: str, root: str, *, client_options: ClientOptions | None = None
) -> tuple[ZkLedgerStore, PoolTransport, Callable[[], Awaitable[None]]]:
    """Metadata store + bookie transport on a running cluster, and their closer."""
    md = MetadataClient(MetadataConfig(zk=zk, root=root))
    await md.connect()
    identity = bookie_identity(LedgerConfig())  # the process's ledger secret, if any
    store = ZkLedgerStore(md.ledgers, md.bookies, md.ledger_ids, identity=identity)
    pool = BookieClientPool(client_options, identity=identity)
    transport = PoolTransport(pool, store.address_of)

    async def close() -> None:
        await pool.close()
        await md.close()

    return store, transport, close
