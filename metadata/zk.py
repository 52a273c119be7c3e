"""The asyncio face of ZooKeeper: a kazoo client on its own threads, bridged into the loop.

kazoo has no asyncio handler. :class:`ZkClient` runs kazoo's threading handler and turns
every ``*_async`` result into an asyncio future completed with
``loop.call_soon_threadsafe``, so no coroutine ever blocks the event loop on ZooKeeper.
Blocking kazoo calls that have no async form (start, stop, close) run in the default
executor.

Session states, znode stats and the translation of kazoo's exceptions are
:mod:`metadata.zk_boundary`'s; re-arming watches are :mod:`metadata.zk_watch`'s (both
re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from kazoo import exceptions as kex
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import READ_ACL_UNSAFE, make_digest_acl

from foundation.errors import ClosedError, ConfigError, MetadataError, NotFoundError
from foundation.tls import TlsConfig
from metadata.zk_boundary import FROM_KAZOO, SessionState, Stat, translate
from metadata.zk_watch import Watch

log = logging.getLogger(__name__)

__all__ = ["SessionState", "Stat", "Transaction", "Watch", "ZkClient"]

# Each listener sees every state change; a slow listener must not hold up the others.
LISTENERS_MAX = 10_000


def kazoo_tls(tls: TlsConfig | None) -> dict[str, Any]:
    """kazoo's TLS arguments: verify the server against the CA and the host dialled;
    present our certificate when we have one (ZooKeeper's ``ssl.clientAuth=need``)."""
    if tls is None:
        return {}
    options: dict[str, Any] = {
        "use_ssl": True,
        "ca": tls.ca_file,
        "verify_certs": True,
        "check_hostname": True,
    }
    if tls.cert_file:
        options.update(certfile=tls.cert_file, keyfile=tls.key_file)
    return options


def read_digest(path: str) -> tuple[str, str]:
    """``(user, password)`` from a digest credentials file ("user:password"); ConfigError
    when others may read or write it, or it holds no such pair."""
    try:
        mode = os.stat(path).st_mode
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"metadata.digest_file {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXO | stat.S_IWGRP):
        raise ConfigError(
            f"metadata.digest_file {path} has mode {stat.S_IMODE(mode):o}: others may read "
            "or write it (chmod 600)"
        )
    user, sep, password = text.partition(":")
    if not (sep and user and password) or "\n" in text:
        raise ConfigError(f"metadata.digest_file {path} must hold one line user:password")
    return user, password


def kazoo_digest(path: str) -> dict[str, Any]:
    """kazoo's arguments for digest credentials in ``path`` ("": none): authenticate the
    session, and give every znode this session creates an ACL for that user alone."""
    if not path:
        return {}
    user, password = read_digest(path)
    return {
        "auth_data": [("digest", f"{user}:{password}")],
        "default_acl": [make_digest_acl(user, password, all=True)],
    }


class _QuietUntilOpen(logging.LoggerAdapter[logging.Logger]):
    """kazoo's logger for one client: until the session first opens, its warnings (a
    "Connection dropped" per retry: 18 before a server's one-line error when ZooKeeper
    is down) are DEBUG; :meth:`ZkClient.connect` then fails with one error naming the
    connect string and the deadline. Once open, a lost connection is worth a warning."""

    def __init__(self, client: ZkClient) -> None:
        super().__init__(logging.getLogger("kazoo.client"), {})
        self._client = client

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if level == logging.WARNING and not self._client.opened:
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)


class ZkClient:
    """One ZooKeeper session, used from one asyncio event loop."""

    def __init__(
        self,
        hosts: str,
        *,
        session_timeout_ms: int = 10_000,
        connect_timeout_ms: int = 15_000,
        tls: TlsConfig | None = None,
        digest_file: str = "",
    ) -> None:
        self._hosts = hosts
        self._connect_timeout_ms = connect_timeout_ms
        self.session_timeout_s = session_timeout_ms / 1000.0
        # Reconnect forever with capped backoff: only session expiry ends a session.
        conn_retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0)
        self._kazoo: Any = KazooClient(
            hosts=hosts,
            timeout=session_timeout_ms / 1000.0,
            connection_retry=conn_retry,
            logger=_QuietUntilOpen(self),
            **kazoo_tls(tls),
            **kazoo_digest(digest_file),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = SessionState.LOST
        self._listeners: list[Callable[[SessionState], None]] = []
        self._closed = False
        self._opened = False  # connect() finished once

    # -- lifecycle ---------------------------------------------------------------

    async def connect(self) -> None:
        """Open the session; raise MetadataError if ZooKeeper does not answer in time."""
        self._loop = asyncio.get_running_loop()
        self._kazoo.add_listener(self._on_kazoo_state)
        timeout_s = self._connect_timeout_ms / 1000.0
        try:
            await self._loop.run_in_executor(None, self._kazoo.start, timeout_s)
        except (kex.KazooException, KazooTimeoutError) as exc:
            raise MetadataError(
                f"could not connect to ZooKeeper at {self._hosts} within {timeout_s:.1f} s"
            ) from exc
        self._state = SessionState.CONNECTED
        self._opened = True
        log.info("ZooKeeper session 0x%x open on %s", self.session_id, self._hosts)

    async def close(self) -> None:
        """End the session (its ephemeral nodes go at once) and stop kazoo's threads."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._kazoo.stop)
        await loop.run_in_executor(None, self._kazoo.close)
        self._state = SessionState.LOST

    async def tidy(self, cleanup: Awaitable[None], what: str) -> bool:
        """Run a clean-up of a stop (remove a registration, give up an election node)
        for at most the session timeout; False, with a warning naming ``what``, if it
        gave up. With ZooKeeper unreachable kazoo holds a request until it reconnects,
        which may be never, and a stop must not wait for that: by the session timeout
        ZooKeeper expires the session, and the ephemeral node goes with it."""
        try:
            async with asyncio.timeout(self.session_timeout_s):
                await cleanup
        except TimeoutError:
            log.warning(
                "ZooKeeper did not answer within %.0fs to %s; it goes when ZooKeeper "
                "expires the session",
                self.session_timeout_s,
                what,
            )
            return False
        return True

    async def __aenter__(self) -> ZkClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def opened(self) -> bool:
        """connect() finished once (the session may have been lost since)."""
        return self._opened

    @property
    def session_id(self) -> int:
        """Current session id (0 when not connected)."""
        client_id = self._kazoo.client_id
        return int(client_id[0]) if client_id else 0

    @property
    def session_password(self) -> bytes:
        """Current session password; with :attr:`session_id` it lets tests expire us."""
        client_id = self._kazoo.client_id
        return bytes(client_id[1]) if client_id else b""

    # -- session state -------------------------------------------------------------

    def add_state_listener(self, listener: Callable[[SessionState], None]) -> None:
        """Call ``listener(state)`` in the loop on every session state change."""
        if len(self._listeners) >= LISTENERS_MAX:
            raise MetadataError(f"more than {LISTENERS_MAX} session listeners")
        self._listeners.append(listener)

    def remove_state_listener(self, listener: Callable[[SessionState], None]) -> None:
        with contextlib.suppress(ValueError):  # already removed: the goal holds
            self._listeners.remove(listener)

    def _on_kazoo_state(self, kstate: Any) -> None:
        # Called on kazoo's connection thread: hand over to the loop, never block here.
        self.call_in_loop(self._dispatch_state, FROM_KAZOO[kstate])

    def _dispatch_state(self, state: SessionState) -> None:
        if state is self._state:
            return
        # The first CONNECTED arrives while connect() is still waiting for kazoo's
        # start(), and LOST follows our own close(): news to nobody, so DEBUG.
        level = logging.INFO if self._opened and not self._closed else logging.DEBUG
        log.log(level, "ZooKeeper session state %s -> %s", self._state.value, state.value)
        self._state = state
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                # One faulty listener must not starve the others of the news.
                log.exception("session state listener %r failed", listener)

    def call_in_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Schedule ``fn(*args)`` in the loop from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            log.debug("event loop gone; dropping callback %r", fn)
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            # The loop closed between the check and the call: nobody is left to tell.
            log.debug("event loop closed; dropping callback %r", fn)

    # -- bridging ------------------------------------------------------------------

    async def _await(self, async_result: Any, path: str) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(res: Any) -> None:
            if fut.done():
                return  # the awaiting coroutine was cancelled
            try:
                fut.set_result(res.get_nowait())
            except Exception as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                fut.set_exception(exc)

        def on_done(res: Any) -> None:
            # kazoo's callback thread.
            self.call_in_loop(settle, res)

        async_result.rawlink(on_done)
        try:
            return await fut
        except (kex.KazooException, KazooTimeoutError) as exc:
            raise translate(exc, path) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the ZooKeeper client was closed")

    # -- operations ----------------------------------------------------------------

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        """Create a znode; return its actual path (with the sequence suffix)."""
        self._check_open()
        res = self._kazoo.create_async(
            path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath
        )
        return str(await self._await(res, path))

    async def get(self, path: str, watch: Callable[[Any], None] | None = None) -> tuple[bytes, int]:
        """Return ``(data, version)``."""
        data, stat = await self.get_with_stat(path, watch)
        return data, stat.version

    async def get_with_stat(
        self, path: str, watch: Callable[[Any], None] | None = None
    ) -> tuple[bytes, Stat]:
        self._check_open()
        data, stat = await self._await(self._kazoo.get_async(path, watch=watch), path)
        return bytes(data or b""), Stat.from_kazoo(stat)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Set data if the znode is at ``version`` (-1: any); return the new version."""
        self._check_open()
        stat = await self._await(self._kazoo.set_async(path, data, version), path)
        return int(stat.version)

    async def delete(self, path: str, version: int = -1) -> None:
        self._check_open()
        await self._await(self._kazoo.delete_async(path, version), path)

    async def delete_recursive(self, path: str) -> None:
        """Delete ``path`` and everything under it (not atomic; missing nodes are fine)."""
        try:
            children = await self.get_children(path)
        except NotFoundError:
            return
        for child in children:
            await self.delete_recursive(f"{path}/{child}")
        with contextlib.suppress(NotFoundError):  # someone else deleted it: goal reached
            await self.delete(path)

    async def exists(self, path: str, watch: Callable[[Any], None] | None = None) -> Stat | None:
        self._check_open()
        stat = await self._await(self._kazoo.exists_async(path, watch=watch), path)
        return None if stat is None else Stat.from_kazoo(stat)

    async def get_children(
        self, path: str, watch: Callable[[Any], None] | None = None
    ) -> list[str]:
        self._check_open()
        children = await self._await(self._kazoo.get_children_async(path, watch=watch), path)
        return sorted(str(c) for c in children)

    async def restrict_tree(self, path: str) -> int:
        """Give ``path`` and every znode below it this session's digest ACL (the user of
        ``metadata.digest_file`` alone): znodes made before the credentials were set
        keep the open ACL they were made with. Returns how many were set; ConfigError
        when the session has no credentials (nothing to restrict to)."""
        acl = self._kazoo.default_acl
        if not acl:
            raise ConfigError("no metadata.digest_file: there is no user to restrict znodes to")
        self._check_open()
        done = 0
        todo = [path]
        while todo:
            node = todo.pop()
            await self._await(self._kazoo.set_acls_async(node, acl), node)
            done += 1
            todo.extend(f"{node.rstrip('/')}/{child}" for child in await self.get_children(node))
        return done

    async def add_digest(self, path: str) -> None:
        """Authenticate this session as the user of digest file ``path`` too (the
        session keeps its own credentials): rotating the password, the old user may
        hand its znodes over (:meth:`restrict_tree`) to the new one."""
        self._check_open()
        user, password = read_digest(path)
        await self._await(self._kazoo.add_auth_async("digest", f"{user}:{password}"), path)

    async def restrict_parents(self, path: str) -> int:
        """Give every parent of ``path`` (``/`` included, ``path`` not) this session's
        digest ACL plus read for everyone: nobody else may then create, delete or
        re-ACL beside or above the cluster's root. For a ZooKeeper that serves this
        cluster alone (other clusters could no longer create their roots there).
        Returns how many were set; ConfigError without credentials."""
        acl = self._kazoo.default_acl
        if not acl:
            raise ConfigError("no metadata.digest_file: there is no user to restrict znodes to")
        self._check_open()
        parts = path.strip("/").split("/")[:-1]
        parents = ["/", *("/" + "/".join(parts[: i + 1]) for i in range(len(parts)))]
        for node in parents:
            await self._await(self._kazoo.set_acls_async(node, [*acl, *READ_ACL_UNSAFE]), node)
        return len(parents)

    async def ensure_path(self, path: str) -> None:
        """Create ``path`` and its parents if missing (idempotent, race-safe)."""
        self._check_open()
        await self._await(self._kazoo.ensure_path_async(path), path)

    def transaction(self) -> Transaction:
        self._check_open()
        return Transaction(self)

    # -- watches -------------------------------------------------------------------

    async def watch_data(
        self, path: str, callback: Callable[[tuple[bytes, int] | None], None] | None = None
    ) -> Watch[tuple[bytes, int] | None]:
        """Watch a znode's data; snapshots are ``(data, version)`` or None when absent.

        The returned watch is armed and has delivered its first snapshot."""

        async def read(watcher: Callable[[Any], None]) -> tuple[bytes, int] | None:
            while True:
                if await self.exists(path, watch=watcher) is None:
                    return None
                try:
                    return await self.get(path, watch=watcher)
                except NotFoundError:
                    continue  # deleted between exists and get: look again

        watch: Watch[tuple[bytes, int] | None] = Watch(self, read, callback)
        await watch.start()
        return watch

    async def watch_children(
        self, path: str, callback: Callable[[list[str] | None], None] | None = None
    ) -> Watch[list[str] | None]:
        """Watch a znode's children; snapshots are sorted names or None when absent.

        The returned watch is armed and has delivered its first snapshot."""

        async def read(watcher: Callable[[Any], None]) -> list[str] | None:
            while True:
                try:
                    return await self.get_children(path, watch=watcher)
                except NotFoundError:
                    if await self.exists(path, watch=watcher) is None:
                        return None

        watch: Watch[list[str] | None] = Watch(self, read, callback)
        await watch.start()
        return watch


class Transaction:
    """A ZooKeeper multi-op: all operations apply, or none does."""

    def __init__(self, client: ZkClient) -> None:
        self._client = client
        self._tx: Any = client._kazoo.transaction()
        self._paths: list[str] = []

    def create(
        self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequence: bool = False
    ) -> Transaction:
        self._tx.create(path, data, ephemeral=ephemeral, sequence=sequence)
        self._paths.append(path)
        return self

    def set(self, path: str, data: bytes, version: int = -1) -> Transaction:
        self._tx.set_data(path, data, version)
        self._paths.append(path)
        return self

    def delete(self, path: str, version: int = -1) -> Transaction:
        self._tx.delete(path, version)
        self._paths.append(path)
        return self

    def check(self, path: str, version: int) -> Transaction:
        self._tx.check(path, version)
        self._paths.append(path)
        return self

    def __len__(self) -> int:
        return len(self._paths)

    async def commit(self) -> list[object]:
        """Apply atomically. Results per op: created path (str), new version (int) for
        set, True for delete and check. On failure raise the first failing op's error
        (its path in the message); nothing was applied."""
        self._client._check_open()
        results: Sequence[Any] = await self._client._await(self._tx.commit_async(), "")
        out: list[object] = []
        for path, res in zip(self._paths, results, strict=True):
            if isinstance(res, kex.RolledBackError):
                continue
            if isinstance(res, BaseException):
                raise translate(res, f"{path} (transaction rolled back)") from res
            out.append(res.version if isinstance(res, ZnodeStat) else res)
        return out
