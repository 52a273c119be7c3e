"""The store of ledger metadata in ZooKeeper.

A ledger's znode (``ledgers/L/<h4>/<h4>/<h4>/L<h4>``) holds versioned msgpack of
:class:`~metadata.ledger_metadata.LedgerMetadata` (the model and its format live
there). Every change is a compare-and-set on the znode version: a writer changing the
ensemble and a recovering reader closing the ledger can't both win, and the loser gets
:class:`~foundation.errors.BadVersionError` (re-read and decide again).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from foundation.errors import NotFoundError
from metadata.layout import Layout, ledger_id_from_hex
from metadata.ledger_metadata import LedgerMetadata
from metadata.zk import Watch, ZkClient

__all__ = ["LedgerStore"]


class LedgerStore:
    """Create / read / CAS-update / delete / watch / list ledger metadata."""

    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    async def create(self, md: LedgerMetadata) -> int:
        """Store a new ledger; AlreadyExistsError if the id is taken. Returns the version."""
        await self._zk.create(self._layout.ledger(md.ledger_id), md.encode(), makepath=True)
        return 0

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        path = self._layout.ledger(ledger_id)
        try:
            data, version = await self._zk.get(path)
        except NotFoundError as exc:
            raise NotFoundError(f"ledger {ledger_id} does not exist") from exc
        return LedgerMetadata.decode(data, path), version

    async def update(self, md: LedgerMetadata, expected_version: int) -> int:
        """Compare-and-set: BadVersionError if the stored version is not
        ``expected_version``, NotFoundError if the ledger is gone. Returns the new version."""
        return await self._zk.set(self._layout.ledger(md.ledger_id), md.encode(), expected_version)

    async def delete(self, ledger_id: int, expected_version: int = -1) -> None:
        await self._zk.delete(self._layout.ledger(ledger_id), expected_version)

    async def exists(self, ledger_id: int) -> bool:
        return await self._zk.exists(self._layout.ledger(ledger_id)) is not None

    async def watch(
        self, ledger_id: int, callback: Callable[[tuple[LedgerMetadata, int] | None], None]
    ) -> Watch[tuple[bytes, int] | None]:
        """Call ``callback((metadata, version))`` on every change, None once deleted."""
        path = self._layout.ledger(ledger_id)

        def deliver(snapshot: tuple[bytes, int] | None) -> None:
            if snapshot is None:
                callback(None)
            else:
                callback((LedgerMetadata.decode(snapshot[0], path), snapshot[1]))

        return await self._zk.watch_data(path, deliver)

    async def iter_ledger_ids(self) -> AsyncIterator[int]:
        """Every stored ledger id, ascending, walking the hierarchy one level at a time."""
        root = self._layout.ledgers_root
        for a in await self._children(root):
            for b in await self._children(f"{root}/{a}"):
                for c in await self._children(f"{root}/{a}/{b}"):
                    for leaf in await self._children(f"{root}/{a}/{b}/{c}"):
                        if leaf.startswith("L"):
                            yield ledger_id_from_hex(a + b + c + leaf[1:])

    async def list_ledger_ids(self) -> list[int]:
        return [ledger_id async for ledger_id in self.iter_ledger_ids()]

    async def _children(self, path: str) -> list[str]:
        try:
            return await self._zk.get_children(path)
        except NotFoundError:
            return []  # the branch was removed while we walked
