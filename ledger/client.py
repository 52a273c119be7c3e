"""The ledger client facade: create, open (with or without recovery) and delete ledgers.

::

    client = await LedgerClient.connect("127.0.0.1:2181", "/bookline")
    writer = await client.create_ledger()      # E/Qw/Qa from LedgerConfig, a key of its own
    entry_id = await writer.add_entry(b"hello")
    await writer.close()
    reader = await client.open_ledger(writer.ledger_id)  # recovers if still open
    data = await reader.read(0, reader.last_add_confirmed)
    await client.close()

Built from a :class:`~ledger.interfaces.MetadataStore` and a
:class:`~ledger.interfaces.BookieTransport`; :meth:`LedgerClient.connect` wires the real
ZooKeeper store and bookie connection pool (``ledger.adapters``), tests may pass the
in-memory ones (``ledger.testing``). The client bundles them with its settings, bookie
health, clock and randomness in one :class:`~ledger.env.LedgerEnv`, which every writer,
reader and recovery it opens shares.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping

from foundation.errors import NoEntryError
from foundation.quorum import check_quorum
from ledger.config import LedgerConfig
from ledger.digest import DigestType
from ledger.env import LedgerEnv
from ledger.interfaces import BookieTransport, MetadataStore
from ledger.keys import check_legacy_password, new_ledger_key
from ledger.placement import BookieHealth, choose_ensemble
from ledger.reader import LedgerReader
from ledger.recovery import LedgerRecovery
from ledger.writer import LedgerWriter
from metadata.ledger_metadata import LedgerMetadata, Segment

log = logging.getLogger(__name__)

__all__ = ["LedgerClient"]


class LedgerClient:
    def __init__(
        self,
        store: MetadataStore,
        transport: BookieTransport,
        config: LedgerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.env = LedgerEnv.create(store, transport, config, clock=clock, rng=rng)
        self._on_close = on_close

    @property
    def config(self) -> LedgerConfig:
        return self.env.config

    @property
    def store(self) -> MetadataStore:
        return self.env.store

    @property
    def transport(self) -> BookieTransport:
        return self.env.transport

    @property
    def health(self) -> BookieHealth:
        return self.env.health

    @classmethod
    async def connect(
        cls, zk: str, root: str, config: LedgerConfig | None = None, **kwargs: object
    ) -> LedgerClient:
        """A client on a real cluster: ZooKeeper at ``zk`` under ``root``."""
        from ledger.adapters import connect_cluster

        store, transport, closer = await connect_cluster(zk, root)
        return cls(store, transport, config, on_close=closer, **kwargs)  # type: ignore[arg-type]

    async def close(self) -> None:
        if self._on_close is not None:
            closer, self._on_close = self._on_close, None
            await closer()

    async def __aenter__(self) -> LedgerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def create_ledger(
        self,
        *,
        ensemble_size: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        password: bytes | None = None,
        digest_type: DigestType | str | None = None,
        custom: Mapping[str, bytes] | None = None,
    ) -> LedgerWriter:
        """A new ledger and its writer. It gets a key of its own (ledger/keys.py:
        derived from the cluster's ledger secret, or random); ``password`` instead
        makes a legacy ledger keyed by that password, kept in its metadata in clear
        (for tests and old tools; deprecated)."""
        cfg = self.config
        e = cfg.ensemble_size if ensemble_size is None else ensemble_size
        qw = cfg.write_quorum if write_quorum is None else write_quorum
        qa = cfg.ack_quorum if ack_quorum is None else ack_quorum
        check_quorum(e, qw, qa, "new ledger")
        dtype = DigestType.parse(cfg.digest_type if digest_type is None else digest_type)
        candidates = await self.store.writable_bookies()
        ensemble = choose_ensemble(candidates, e, avoid=self.health.avoided(), rng=self.env.rng)
        ledger_id = await self.store.next_ledger_id()
        if password is None:
            new = new_ledger_key(ledger_id, self.env.secret)
            stored, salt, check = new.password, new.key_salt, new.key_check
        else:
            stored, salt, check = password, b"", b""
        meta = LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=e,
            write_quorum=qw,
            ack_quorum=qa,
            digest_type=dtype,
            segments=(Segment(0, tuple(ensemble)),),
            custom=dict(custom or {}),
            password=stored,
            key_salt=salt,
            key_check=check,
            ctime_ms=int(time.time() * 1000),
        )
        version = await self.store.create(meta)
        log.info("created ledger %d on %s (E=%d Qw=%d Qa=%d)", ledger_id, ensemble, e, qw, qa)
        return LedgerWriter(meta, version, self.env)

    async def open_ledger(
        self, ledger_id: int, password: bytes | None = None, *, recover: bool = True
    ) -> LedgerReader:
        """Open for reading. ``recover=True`` fences any writer and closes the ledger at
        its true end first; ``recover=False`` reads what is confirmed and can tail.
        The key comes from the metadata and the cluster's ledger secret
        (:func:`ledger.keys.ledger_key`); ``password`` is only compared with a legacy
        ledger's own (UnauthorizedError when it differs)."""
        if recover:
            result = await LedgerRecovery(ledger_id, self.env).run(password)
            meta, version = result.meta, result.version
        else:
            meta, version = await self.store.read(ledger_id)
            check_legacy_password(meta, password)
        reader = LedgerReader(meta, version, self.env)
        if not meta.is_closed:
            try:
                await reader.read_lac()
            except NoEntryError:
                log.debug("ledger %d: no bookie holds an entry yet; LAC -1", ledger_id)
        return reader

    async def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; bookies garbage-collect its entries."""
        await self.store.delete(ledger_id)
        log.info("deleted ledger %d", ledger_id)
