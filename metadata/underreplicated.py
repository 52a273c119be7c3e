"""Autorecovery work items: ledgers that lost replicas, and who is repairing each.

``ledgers/underreplicated/<id16>`` (persistent) says a ledger needs re-replication and
which bookies it lost; ``ledgers/urlocks/<id16>`` (ephemeral) is a worker's claim, so
a crashed worker's claim disappears with its session and another worker picks it up.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from bookline.errors import AlreadyExistsError, BadVersionError, LockOwnedError, NotFoundError
from metadata import serde
from metadata.layout import Layout, ledger_id_from_hex
from metadata.zk import ZkClient

KIND = "underreplicated"
CLAIM_KIND = "urclaim"
FORMAT_VERSION = 1
MARK_ATTEMPTS_MAX = 50  # concurrent auditors merging missing-bookie sets


@dataclass(frozen=True, slots=True)
class UnderreplicatedLedger:
    ledger_id: int
    missing_bookies: frozenset[str]
    ctime_ms: int
    # znode version: clear() with it fails if the auditor merged more bookies meanwhile.
    version: int = -1


class UnderreplicationStore:
    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    async def mark(self, ledger_id: int, missing_bookies: set[str] | frozenset[str]) -> None:
        """Record that ``ledger_id`` lost replicas on ``missing_bookies`` (merged with any
        bookies already recorded)."""
        path = self._layout.underreplicated(ledger_id)
        for _ in range(MARK_ATTEMPTS_MAX):
            try:
                data, version = await self._zk.get(path)
            except NotFoundError:
                try:
                    await self._zk.create(path, _encode(set(missing_bookies)), makepath=True)
                except AlreadyExistsError:
                    continue  # another auditor marked it first: merge into theirs
                return
            _v, body = serde.decode(data, KIND, FORMAT_VERSION, path)
            known = set(serde.field(body, "missing_bookies", list, path))
            if known >= set(missing_bookies):
                return
            try:
                await self._zk.set(path, _encode(known | set(missing_bookies)), version)
            except BadVersionError:
                continue
            return
        raise BadVersionError(f"could not mark ledger {ledger_id} under-replicated: contention")

    async def get(self, ledger_id: int) -> UnderreplicatedLedger:
        path = self._layout.underreplicated(ledger_id)
        data, stat = await self._zk.get_with_stat(path)
        _v, body = serde.decode(data, KIND, FORMAT_VERSION, path)
        return UnderreplicatedLedger(
            ledger_id,
            frozenset(serde.field(body, "missing_bookies", list, path)),
            stat.ctime_ms,
            stat.version,
        )

    async def list(self) -> list[int]:
        names = await self._zk.get_children(self._layout.underreplicated_root)
        return [ledger_id_from_hex(n) for n in names]

    async def claim(self, ledger_id: int, worker: str) -> None:
        """Take the ephemeral claim; LockOwnedError(owner=worker) if another holds it."""
        path = self._layout.underreplicated_lock(ledger_id)
        try:
            await self._zk.create(
                path, serde.encode(CLAIM_KIND, FORMAT_VERSION, {"worker": worker}), ephemeral=True
            )
        except AlreadyExistsError as exc:
            holder = None
            with contextlib.suppress(NotFoundError):  # released meanwhile: owner unknown
                data, _ = await self._zk.get(path)
                holder = serde.field(
                    serde.decode(data, CLAIM_KIND, FORMAT_VERSION, path)[1], "worker", str, path
                )
            raise LockOwnedError(
                f"ledger {ledger_id} is being re-replicated by {holder}", owner=holder
            ) from exc

    async def release(self, ledger_id: int) -> None:
        with contextlib.suppress(NotFoundError):  # already released: goal reached
            await self._zk.delete(self._layout.underreplicated_lock(ledger_id))

    async def clear(self, ledger_id: int, version: int = -1) -> None:
        """The ledger is fully replicated again: drop the item and our claim together.

        With ``version`` (from :meth:`get`), BadVersionError says the item changed since
        it was read (the auditor found more lost bookies) and nothing is deleted.
        """
        tx = self._zk.transaction()
        tx.delete(self._layout.underreplicated(ledger_id), version)
        stat = await self._zk.exists(self._layout.underreplicated_lock(ledger_id))
        if stat is not None and stat.ephemeral_owner == self._zk.session_id:
            tx.delete(self._layout.underreplicated_lock(ledger_id), stat.version)
        await tx.commit()


def _encode(missing: set[str]) -> bytes:
    return serde.encode(KIND, FORMAT_VERSION, {"missing_bookies": sorted(missing)})
