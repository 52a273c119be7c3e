"""Autorecovery work items: ledgers that lost replicas, and who is repairing each.

``ledgers/underreplicated/<id16>`` (persistent) says a ledger needs repair;
``ledgers/urlocks/<id16>`` (ephemeral) is a worker's claim, so a crashed worker's claim
disappears with its session and another worker picks it up.

Item body (serde kind ``underreplicated``)::

    version 1  {"missing_bookies": [bookie, ...]}
    version 2  {"missing_bookies": [bookie, ...],
                "repair_entries": {bookie: [[first, last], ...], ...}}

``missing_bookies`` are gone: their fragments move to other bookies. ``repair_entries``
(the replica check) names live bookies that lack intact copies of some entries: each
``[first, last]`` range (inclusive, ascending, disjoint) stands for the entries in it
whose write set, per the ledger's metadata, includes that bookie; the worker re-copies
them to the same bookie. At most ``RANGES_PER_BOOKIE_MAX`` ranges per bookie: beyond
that the closest ranges are merged, which only widens what is re-copied (a recovery add
of an entry a bookie already holds intact is harmless). An item without repair entries
is written as version 1, so workers that predate version 2 keep handling lost bookies;
they refuse a version-2 item (and retry later) instead of clearing it half done.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from foundation.errors import AlreadyExistsError, BadVersionError, LockOwnedError, NotFoundError
from metadata import serde
from metadata.layout import Layout, ledger_id_from_hex
from metadata.zk import ZkClient

__all__ = [
    "RANGES_PER_BOOKIE_MAX",
    "EntryRanges",
    "UnderreplicatedLedger",
    "UnderreplicationStore",
    "merge_ranges",
    "ranges_cover",
]

KIND = "underreplicated"
CLAIM_KIND = "urclaim"
FORMAT_VERSION = 2
_FORMAT_VERSION_LOST_ONLY = 1  # what an item without repair entries is written as
CLAIM_FORMAT_VERSION = 1
MARK_ATTEMPTS_MAX = 50  # concurrent auditors merging missing-bookie sets
# Entry ranges per bookie in one item: keeps an item far below the znode limit
# (~20 bytes a range) however scattered the damage; more are merged (see above).
RANGES_PER_BOOKIE_MAX = 256

# Inclusive (first, last) entry ranges, ascending and disjoint.
EntryRanges = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class UnderreplicatedLedger:
    ledger_id: int
    missing_bookies: frozenset[str]
    ctime_ms: int
    # znode version: clear() with it fails if the auditor merged more bookies meanwhile.
    version: int = -1
    # Live bookie -> entry ranges to re-copy to it (the replica check; see the module).
    repair_entries: Mapping[str, EntryRanges] = field(default_factory=dict)


def merge_ranges(
    ranges: Iterable[tuple[int, int]], limit: int = RANGES_PER_BOOKIE_MAX
) -> EntryRanges:
    """Sorted, coalesced (overlapping or adjacent ranges joined) and at most ``limit``
    ranges: beyond it, the ranges separated by the smallest gaps are joined."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    if len(out) <= limit:
        return tuple(out)
    gaps = sorted(range(len(out) - 1), key=lambda i: out[i + 1][0] - out[i][1])
    join = set(gaps[: len(out) - limit])  # join range i with range i + 1
    merged: list[tuple[int, int]] = []
    for i, (first, last) in enumerate(out):
        if i - 1 in join:
            merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return tuple(merged)


def ranges_cover(outer: EntryRanges, inner: EntryRanges) -> bool:
    """Every range of ``inner`` lies inside one of ``outer`` (both merged)."""
    return all(any(a <= first and last <= b for a, b in outer) for first, last in inner)


def _merge_repairs(
    a: Mapping[str, EntryRanges], b: Mapping[str, Iterable[tuple[int, int]]]
) -> dict[str, EntryRanges]:
    out = dict(a)
    for bookie, ranges in b.items():
        merged = merge_ranges((*out.get(bookie, ()), *ranges))
        if merged:
            out[bookie] = merged
    return out


def _repairs_cover(outer: Mapping[str, EntryRanges], inner: Mapping[str, EntryRanges]) -> bool:
    return all(ranges_cover(outer.get(b, ()), r) for b, r in inner.items())


class UnderreplicationStore:
    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    async def mark(
        self,
        ledger_id: int,
        missing_bookies: set[str] | frozenset[str] = frozenset(),
        repair_entries: Mapping[str, Iterable[tuple[int, int]]] | None = None,
    ) -> None:
        """Record that ``ledger_id`` lost replicas on ``missing_bookies`` and/or needs
        ``repair_entries`` re-copied to live bookies (merged with what is recorded)."""
        path = self._layout.underreplicated(ledger_id)
        repairs = _merge_repairs({}, repair_entries or {})
        for _ in range(MARK_ATTEMPTS_MAX):
            try:
                data, version = await self._zk.get(path)
            except NotFoundError:
                try:
                    await self._zk.create(
                        path, _encode(set(missing_bookies), repairs), makepath=True
                    )
                except AlreadyExistsError:
                    continue  # another auditor marked it first: merge into theirs
                return
            known, known_repairs = _decode(data, path)
            if known >= set(missing_bookies) and _repairs_cover(known_repairs, repairs):
                return
            merged = _merge_repairs(known_repairs, repairs)
            try:
                await self._zk.set(path, _encode(known | set(missing_bookies), merged), version)
            except BadVersionError:
                continue
            return
        raise BadVersionError(f"could not mark ledger {ledger_id} under-replicated: contention")

    async def get(self, ledger_id: int) -> UnderreplicatedLedger:
        path = self._layout.underreplicated(ledger_id)
        data, stat = await self._zk.get_with_stat(path)
        missing, repairs = _decode(data, path)
        return UnderreplicatedLedger(
            ledger_id, frozenset(missing), stat.ctime_ms, stat.version, repairs
        )

    async def list(self) -> list[int]:
        names = await self._zk.get_children(self._layout.underreplicated_root)
        return [ledger_id_from_hex(n) for n in names]

    async def list_claims(self) -> dict[int, str]:
        """Items being worked on now: ledger id -> the worker holding the claim."""
        out: dict[int, str] = {}
        for name in await self._zk.get_children(self._layout.underreplicated_locks):
            path = f"{self._layout.underreplicated_locks}/{name}"
            with contextlib.suppress(NotFoundError):  # released while we listed
                data, _ = await self._zk.get(path)
                body = serde.decode(data, CLAIM_KIND, CLAIM_FORMAT_VERSION, path)[1]
                out[ledger_id_from_hex(name)] = serde.field(body, "worker", str, path)
        return out

    async def replication_enabled(self) -> bool:
        """False while an operator has paused re-replication."""
        return await self._zk.exists(self._layout.replication_disabled) is None

    async def set_replication_enabled(self, enabled: bool) -> None:
        """Pause (False) or resume (True) the replication workers; idempotent."""
        path = self._layout.replication_disabled
        if enabled:
            with contextlib.suppress(NotFoundError):  # not paused: goal reached
                await self._zk.delete(path)
        else:
            with contextlib.suppress(AlreadyExistsError):  # already paused
                await self._zk.create(path, b"", makepath=True)

    async def claim(self, ledger_id: int, worker: str) -> None:
        """Take the ephemeral claim; LockOwnedError(owner=worker) if another holds it."""
        path = self._layout.underreplicated_lock(ledger_id)
        try:
            await self._zk.create(
                path,
                serde.encode(CLAIM_KIND, CLAIM_FORMAT_VERSION, {"worker": worker}),
                ephemeral=True,
            )
        except AlreadyExistsError as exc:
            holder = None
            with contextlib.suppress(NotFoundError):  # released meanwhile: owner unknown
                data, _ = await self._zk.get(path)
                holder = serde.field(
                    serde.decode(data, CLAIM_KIND, CLAIM_FORMAT_VERSION, path)[1],
                    "worker",
                    str,
                    path,
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


def _encode(missing: set[str], repairs: Mapping[str, EntryRanges]) -> bytes:
    body: dict[str, Any] = {"missing_bookies": sorted(missing)}
    if not repairs:
        return serde.encode(KIND, _FORMAT_VERSION_LOST_ONLY, body)
    body["repair_entries"] = {b: [list(r) for r in ranges] for b, ranges in repairs.items()}
    return serde.encode(KIND, FORMAT_VERSION, body)


def _decode(data: bytes, path: str) -> tuple[set[str], dict[str, EntryRanges]]:
    version, body = serde.decode(data, KIND, FORMAT_VERSION, path)
    missing = serde.field(body, "missing_bookies", list, path)
    if not all(isinstance(b, str) for b in missing):
        raise serde.MetadataFormatError(f"{path}: missing_bookies must be bookie ids")
    repairs: dict[str, EntryRanges] = {}
    if version >= FORMAT_VERSION:
        raw = serde.field(body, "repair_entries", dict, path)
        for bookie, ranges in raw.items():
            if not (isinstance(ranges, list) and all(_is_range(r) for r in ranges)):
                raise serde.MetadataFormatError(f"{path}: bad entry ranges for {bookie!r}")
            repairs[bookie] = merge_ranges((r[0], r[1]) for r in ranges)
    return set(missing), repairs


def _is_range(r: object) -> bool:
    return (
        isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) and 0 <= r[0] <= r[1]
    )
