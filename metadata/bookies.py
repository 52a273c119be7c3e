"""The bookie registry and bookie cookies.

* ``bookies/available/<id>`` and ``bookies/readonly/<id>``: ephemeral registrations
  carrying :class:`BookieInfo`; a bookie sits in exactly one of them. Switching between
  writable and read-only is one transaction (delete one, create the other), so a
  listing never shows a bookie twice or not at all.
* ``bookies/cookies/<id>``: a persistent :class:`Cookie` (cluster instance id + the
  bookie's three directories) written at first start and checked at every start, so a
  bookie that starts on the wrong or wiped disks stops instead of serving bad data.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    CookieMismatchError,
    NotFoundError,
)
from metadata import serde
from metadata.layout import Layout
from metadata.zk import Stat, Watch, ZkClient

log = logging.getLogger(__name__)

BOOKIE_KIND = "bookie"
BOOKIE_FORMAT_VERSION = 1
COOKIE_KIND = "cookie"
COOKIE_FORMAT_VERSION = 1
WRITABLE = "writable"
READONLY = "readonly"
# Looks at both registration paths (see BookieRegistry._current).
_LOOKUP_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class BookieInfo:
    bookie_id: str  # stable name of the bookie, e.g. "127.0.0.1:3181" or "bookie-1"
    address: str  # host:port clients connect to
    state: str = WRITABLE  # WRITABLE or READONLY; kept in step with the registry dir
    rack: str = "/default-rack"  # placement hint for ensembles
    disk_usage: float = 0.0  # fraction of the ledger disks in use, 0..1
    free_bytes: int = 0
    total_bytes: int = 0
    http_address: str = ""  # admin/metrics endpoint, if any
    # Proof of the credential the cluster issued the bookie (bookie/identity.py), hex;
    # "": none, and placement by clients holding the ledger secret skips the bookie.
    proof: str = ""

    def __post_init__(self) -> None:
        if self.state not in (WRITABLE, READONLY):
            raise BadRequestError(f"bookie state must be {WRITABLE!r} or {READONLY!r}")
        if not 0.0 <= self.disk_usage <= 1.0:
            raise BadRequestError(f"disk_usage must be within 0..1, got {self.disk_usage}")

    def encode(self) -> bytes:
        return serde.encode(BOOKIE_KIND, BOOKIE_FORMAT_VERSION, dataclasses.asdict(self))

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> BookieInfo:
        _v, body = serde.decode(data, BOOKIE_KIND, BOOKIE_FORMAT_VERSION, where)
        known = {f.name for f in dataclasses.fields(cls)}
        # Fields added by newer writers of the same format version are ignored.
        return cls(**{k: v for k, v in body.items() if k in known})


@dataclass(frozen=True, slots=True)
class BookieSet:
    """Who is registered right now."""

    writable: frozenset[str]
    readonly: frozenset[str]

    @property
    def all(self) -> frozenset[str]:
        return self.writable | self.readonly


@dataclass(frozen=True, slots=True)
class Cookie:
    instance_id: str  # cluster the disks belong to
    journal_dir: str
    ledgers_dir: str
    index_dir: str

    def encode(self) -> bytes:
        return serde.encode(COOKIE_KIND, COOKIE_FORMAT_VERSION, dataclasses.asdict(self))

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> Cookie:
        _v, body = serde.decode(data, COOKIE_KIND, COOKIE_FORMAT_VERSION, where)
        return cls(
            **{f.name: serde.field(body, f.name, str, where) for f in dataclasses.fields(cls)}
        )

    def differences(self, other: Cookie) -> list[str]:
        """Human-readable list of fields that differ (stored vs. ``other``)."""
        return [
            f"{f.name}: stored {getattr(self, f.name)!r}, given {getattr(other, f.name)!r}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


class BookieRegistry:
    """Registration, state switches, listing and watching of bookies; cookies."""

    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    def _path(self, bookie_id: str, state: str) -> str:
        if state == READONLY:
            return self._layout.bookie_readonly(bookie_id)
        return self._layout.bookie_available(bookie_id)

    async def register(self, info: BookieInfo) -> None:
        """Create this session's ephemeral registration in the dir matching ``info.state``.

        AlreadyExistsError if another live session registered the same id (a second
        bookie with the same name, or our previous process whose session has not
        expired yet: retry after the session timeout).
        """
        for state in (WRITABLE, READONLY):
            stat = await self._zk.exists(self._path(info.bookie_id, state))
            if stat is not None and stat.ephemeral_owner != self._zk.session_id:
                raise AlreadyExistsError(
                    f"bookie {info.bookie_id} is already registered by session "
                    f"0x{stat.ephemeral_owner:x}"
                )
            if stat is not None:
                await self.unregister(info.bookie_id)
        await self._zk.create(self._path(info.bookie_id, info.state), info.encode(), ephemeral=True)
        log.info("bookie %s registered %s at %s", info.bookie_id, info.state, info.address)

    async def _current(self, bookie_id: str) -> tuple[BookieInfo, str, Stat]:
        # The two paths are read one after the other: a move from read-only to writable
        # between the reads misses both, so a miss is looked at again (a move is one
        # transaction; moves back and forth that fast are flapping, and end the retries).
        for _attempt in range(_LOOKUP_ATTEMPTS):
            for state in (READONLY, WRITABLE) if _attempt % 2 else (WRITABLE, READONLY):
                path = self._path(bookie_id, state)
                try:
                    data, stat = await self._zk.get_with_stat(path)
                except NotFoundError:
                    continue
                return BookieInfo.decode(data, path), path, stat
        raise NotFoundError(f"bookie {bookie_id} is not registered")

    async def get(self, bookie_id: str) -> BookieInfo:
        info, _path, _stat = await self._current(bookie_id)
        return info

    async def set_readonly(self, bookie_id: str, readonly: bool) -> BookieInfo:
        """Move the registration between writable and read-only in one transaction."""
        info, path, stat = await self._current(bookie_id)
        target = READONLY if readonly else WRITABLE
        if info.state == target:
            return info
        new = dataclasses.replace(info, state=target)
        tx = self._zk.transaction()
        tx.delete(path, stat.version)
        tx.create(self._path(bookie_id, target), new.encode(), ephemeral=True)
        await tx.commit()
        log.info("bookie %s is now %s", bookie_id, target)
        return new

    async def update(self, info: BookieInfo) -> None:
        """Replace the registered info (same state) e.g. with fresh disk usage."""
        current, path, stat = await self._current(info.bookie_id)
        if current.state != info.state:
            raise BadRequestError("use set_readonly() to change a bookie's state")
        await self._zk.set(path, info.encode(), stat.version)

    async def unregister(self, bookie_id: str) -> None:
        for state in (WRITABLE, READONLY):
            with contextlib.suppress(NotFoundError):  # not in this dir: nothing to remove
                await self._zk.delete(self._path(bookie_id, state))

    async def list_writable(self) -> list[str]:
        return await self._zk.get_children(self._layout.bookies_available)

    async def list_readonly(self) -> list[str]:
        return await self._zk.get_children(self._layout.bookies_readonly)

    async def list_all(self) -> BookieSet:
        return BookieSet(
            frozenset(await self.list_writable()), frozenset(await self.list_readonly())
        )

    async def list_info(self) -> dict[str, BookieInfo]:
        """Registered bookies with their info (one read per bookie)."""
        out: dict[str, BookieInfo] = {}
        for bookie_id in sorted((await self.list_all()).all):
            with contextlib.suppress(NotFoundError):  # left while we listed: not registered
                out[bookie_id] = await self.get(bookie_id)
        return out

    async def forced_read_only(self, bookie_id: str) -> bool:
        """Whether an operator holds the bookie read-only."""
        return await self._zk.exists(self._layout.bookie_forced_readonly(bookie_id)) is not None

    async def set_forced_read_only(self, bookie_id: str, forced: bool) -> None:
        """Hold the bookie read-only (the bookie watches this), or release it; idempotent."""
        path = self._layout.bookie_forced_readonly(bookie_id)
        if forced:
            with contextlib.suppress(AlreadyExistsError):  # already held: goal reached
                await self._zk.create(path, b"", makepath=True)
        else:
            with contextlib.suppress(NotFoundError):  # not held: goal reached
                await self._zk.delete(path)

    async def watch(self, callback: Callable[[BookieSet], None] | None = None) -> BookieWatch:
        """Watch membership (writable and read-only sets); see :class:`BookieWatch`."""
        bw = BookieWatch(callback)
        bw.writable_watch = await self._zk.watch_children(
            self._layout.bookies_available, bw.on_writable
        )
        bw.readonly_watch = await self._zk.watch_children(
            self._layout.bookies_readonly, bw.on_readonly
        )
        return bw

    # -- cookies -------------------------------------------------------------------

    async def write_cookie(self, bookie_id: str, cookie: Cookie) -> int:
        """Store the cookie at first start; AlreadyExistsError if one is there."""
        await self._zk.create(self._layout.cookie(bookie_id), cookie.encode())
        return 0

    async def read_cookie(self, bookie_id: str) -> tuple[Cookie, int]:
        path = self._layout.cookie(bookie_id)
        data, version = await self._zk.get(path)
        return Cookie.decode(data, path), version

    async def check_cookie(self, bookie_id: str, cookie: Cookie) -> None:
        """Raise CookieMismatchError naming every differing field; NotFoundError if none."""
        stored, _version = await self.read_cookie(bookie_id)
        diffs = stored.differences(cookie)
        if diffs:
            raise CookieMismatchError(
                f"bookie {bookie_id} cookie does not match its disks/cluster: " + "; ".join(diffs)
            )

    async def ensure_cookie(self, bookie_id: str, cookie: Cookie) -> None:
        """Write the cookie if absent, else check it (what a bookie does at start)."""
        try:
            await self.write_cookie(bookie_id, cookie)
        except AlreadyExistsError:
            await self.check_cookie(bookie_id, cookie)

    async def delete_cookie(self, bookie_id: str, version: int = -1) -> None:
        await self._zk.delete(self._layout.cookie(bookie_id), version)

    async def forget(self, bookie_id: str) -> list[str]:
        """Delete every znode kept for the bookie beyond its registration (the cookie,
        the operator's read-only hold); the paths deleted. Retiring a bookie: the caller
        checks first that it is not registered and no ledger names it."""
        deleted = []
        for path in (
            self._layout.cookie(bookie_id),
            self._layout.bookie_forced_readonly(bookie_id),
        ):
            with contextlib.suppress(NotFoundError):  # not there: nothing to forget
                await self._zk.delete(path)
                deleted.append(path)
        return deleted


class BookieWatch:
    """Membership snapshots: callback in the loop, or ``await next_change()``."""

    def __init__(self, callback: Callable[[BookieSet], None] | None) -> None:
        self._callback = callback
        self._writable: frozenset[str] = frozenset()
        self._readonly: frozenset[str] = frozenset()
        self._changed = asyncio.Event()
        self.writable_watch: Watch[Any] | None = None
        self.readonly_watch: Watch[Any] | None = None

    @property
    def current(self) -> BookieSet:
        return BookieSet(self._writable, self._readonly)

    def on_writable(self, children: list[str] | None) -> None:
        self._writable = frozenset(children or ())
        self._notify()

    def on_readonly(self, children: list[str] | None) -> None:
        self._readonly = frozenset(children or ())
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        if self._callback is not None:
            self._callback(self.current)

    async def next_change(self, timeout_s: float | None = None) -> BookieSet:
        """Wait for a change since the last call; return the newest membership."""
        await asyncio.wait_for(self._changed.wait(), timeout_s)
        self._changed.clear()
        return self.current

    def cancel(self) -> None:
        for watch in (self.writable_watch, self.readonly_watch):
            if watch is not None:
                watch.cancel()
