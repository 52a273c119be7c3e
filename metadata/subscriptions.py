"""Named durable read positions per stream (``streams/<ns>/<s>/subscribers/<name>``).

A position is a DLSN-like ``(segment seqno, entry id, slot id)`` tuple. Advancing is a
compare-and-set loop that only moves forward: committing an older position (a slow or
retried consumer) leaves the stored one and says so in the result.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from foundation.errors import AlreadyExistsError, BadRequestError, BadVersionError, NotFoundError
from metadata import serde
from metadata.layout import Layout
from metadata.zk import ZkClient

KIND = "subscription"
FORMAT_VERSION = 1
# A few consumers committing the same subscription settle in a few rounds.
CAS_ATTEMPTS_MAX = 100

Position = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class AdvanceResult:
    position: Position  # what is stored now
    advanced: bool  # False: the stored position was already at or past the given one


def _check(position: Position) -> Position:
    if len(position) != 3 or not all(isinstance(x, int) and x >= -1 for x in position):
        raise BadRequestError(f"position must be 3 ints >= -1, got {position!r}")
    return (position[0], position[1], position[2])


def _encode(position: Position) -> bytes:
    return serde.encode(KIND, FORMAT_VERSION, {"position": list(position)})


def _decode(data: bytes, where: str) -> Position:
    _v, body = serde.decode(data, KIND, FORMAT_VERSION, where)
    raw = serde.field(body, "position", list, where)
    if len(raw) != 3 or not all(isinstance(x, int) for x in raw):
        raise serde.MetadataFormatError(f"subscription at {where} has a bad position")
    return (raw[0], raw[1], raw[2])


class SubscriptionStore:
    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    async def advance(self, ns: str, stream: str, name: str, position: Position) -> AdvanceResult:
        """Move the subscription forward to ``position`` (creating it if new)."""
        position = _check(position)
        path = self._layout.subscriber(ns, stream, name)
        for _ in range(CAS_ATTEMPTS_MAX):
            try:
                data, version = await self._zk.get(path)
            except NotFoundError:
                try:
                    await self._zk.create(path, _encode(position))
                except AlreadyExistsError:
                    continue  # created concurrently: compare against theirs
                except NotFoundError as exc:
                    raise NotFoundError(f"stream {ns}/{stream} does not exist") from exc
                return AdvanceResult(position, True)
            stored = _decode(data, path)
            if position <= stored:
                return AdvanceResult(stored, False)
            try:
                await self._zk.set(path, _encode(position), version)
            except BadVersionError:
                continue  # another commit won the race: re-read and compare again
            return AdvanceResult(position, True)
        raise BadVersionError(f"subscription {name} on {ns}/{stream}: too much contention")

    async def read(self, ns: str, stream: str, name: str) -> Position | None:
        path = self._layout.subscriber(ns, stream, name)
        try:
            data, _ = await self._zk.get(path)
        except NotFoundError:
            return None
        return _decode(data, path)

    async def list(self, ns: str, stream: str) -> dict[str, Position]:
        out: dict[str, Position] = {}
        for name in await self._zk.get_children(self._layout.subscribers(ns, stream)):
            position = await self.read(ns, stream, name)
            if position is not None:
                out[name] = position
        return out

    async def delete(self, ns: str, stream: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):  # already gone: goal reached
            await self._zk.delete(self._layout.subscriber(ns, stream, name))
