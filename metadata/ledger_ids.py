"""Unique 64-bit ledger ids, never handed out twice across processes.

``ledgers/idgen`` holds the next unclaimed id. An allocator claims a block of
``block_size`` ids by compare-and-set on that znode (so concurrent allocators can't claim
overlapping blocks) and hands them out locally; ids are unique, not dense (a crashed
allocator's unused block is skipped). The first id is 1.
"""

from __future__ import annotations

import asyncio
import logging
import random

from foundation.errors import AlreadyExistsError, BadVersionError, MetadataError, NotFoundError
from metadata import serde
from metadata.layout import LEDGER_ID_MAX, Layout
from metadata.zk import ZkClient

log = logging.getLogger(__name__)

KIND = "idgen"
FORMAT_VERSION = 1
FIRST_ID = 1
# One CAS per 100 ids keeps ZooKeeper writes rare without wasting much on a crash.
BLOCK_SIZE_DEFAULT = 100
# Contention among a handful of allocators settles in a few rounds; 200 is far beyond.
CAS_ATTEMPTS_MAX = 200
CAS_BACKOFF_MAX_S = 0.05


class LedgerIdAllocator:
    """Hands out ledger ids from blocks claimed in ZooKeeper. Safe for concurrent tasks."""

    def __init__(
        self,
        zk: ZkClient,
        layout: Layout,
        block_size: int = BLOCK_SIZE_DEFAULT,
        rng: random.Random | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self._zk = zk
        self._path = layout.ledger_idgen
        self._block_size = block_size
        self._next = 0
        self._end = 0  # exclusive end of the local block
        self._lock = asyncio.Lock()
        self._rng = rng or random.Random()

    async def next_id(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                self._next, self._end = await self._claim_block()
            ledger_id = self._next
            self._next += 1
            return ledger_id

    async def _claim_block(self) -> tuple[int, int]:
        for attempt in range(CAS_ATTEMPTS_MAX):
            try:
                data, version = await self._zk.get(self._path)
            except NotFoundError:
                await self._create_counter()
                continue
            _v, body = serde.decode(data, KIND, FORMAT_VERSION, self._path)
            start: int = serde.field(body, "next", int, self._path)
            end = start + self._block_size
            if end > LEDGER_ID_MAX:
                raise MetadataError("ledger ids exhausted (2^63)")
            try:
                await self._zk.set(self._path, _encode(end), version)
            except BadVersionError:
                # Another allocator claimed a block first: back off with jitter, retry.
                await asyncio.sleep(self._rng.uniform(0, CAS_BACKOFF_MAX_S * min(1, attempt / 4)))
                continue
            log.debug("claimed ledger ids [%d, %d)", start, end)
            return start, end
        raise MetadataError(f"could not claim ledger ids after {CAS_ATTEMPTS_MAX} attempts")

    async def _create_counter(self) -> None:
        try:
            await self._zk.create(self._path, _encode(FIRST_ID), makepath=True)
        except AlreadyExistsError:
            log.debug("ledger id counter created concurrently")


def _encode(next_id: int) -> bytes:
    return serde.encode(KIND, FORMAT_VERSION, {"next": next_id})
