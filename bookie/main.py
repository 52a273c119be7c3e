"""``bookline bookie``: run one bookie process until SIGTERM.

Start-up, in order:

1. take the :class:`BookieConfig` the CLI loaded (``ops/cli/bookie.py``: ``--config``'s
   [bookie] section, ``BOOKLINE_BOOKIE_*`` and flags);
2. connect to ZooKeeper and read (or create) the cluster identity;
3. check the **cookie** (cluster instance id + the three directories): a ``COOKIE`` file
   in each directory and ``bookies/cookies/<id>`` in ZooKeeper must agree; a first start
   (no cookie anywhere) writes them. Any mismatch -- other cluster, moved or wiped
   directory, only some directories carrying a cookie -- refuses to start
   (CookieMismatchError, exit 1) before storage touches the disks;
4. start storage (journal replay), then the TCP server and metrics endpoint;
5. register ephemeral in ZooKeeper (waiting out a previous session of ours after a
   crash), print ``bookie ready id=... address=... metrics=...`` on stdout.

Signals: SIGTERM/SIGINT -> clean shutdown (deregister first so no new ledger picks
this bookie, stop accepting, drain, checkpoint and close storage, close the session);
SIGHUP -> re-read ``disk_usage_threshold`` / ``disk_usage_lwm`` from the config file
(how operators -- and the integration tests -- move the read-only thresholds at
runtime). ``bookline bookie readonly ID`` holds the bookie read-only whatever its disks
say (a znode ``bookies/forcedreadonly/<id>`` it watches) until ``bookline bookie
writable ID``. A fatal storage error exits with status 3, and so does a start that finds
acknowledged journal data damaged beyond what replay can work around
(JournalCorruptError, logged with the file and offset).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from bookie.config import BookieConfig
from bookie.gc import LedgerGc
from bookie.identity import registration_proof
from bookie.registration import Registration
from bookie.server import BookieServer, install_uvloop
from bookie.storage.engine import BookieStorage
from bookie.storage.journal import JournalCorruptError
from foundation.config import MetadataConfig
from foundation.errors import (
    AlreadyExistsError,
    ConfigError,
    CookieMismatchError,
    NotFoundError,
)
from foundation.gctune import settle_heap
from metadata.bookies import READONLY, WRITABLE, BookieInfo, Cookie
from metadata.client import MetadataClient
from metadata.ledger_metadata import LedgerMetadata

log = logging.getLogger(__name__)

__all__ = ["check_local_cookies", "run"]

# Re-reads the configuration (SIGHUP), the way the process was started.
Reload = Callable[[], BookieConfig]

COOKIE_FILE: Final = "COOKIE"
EXIT_FATAL: Final = 3
# After a crash our previous ZK session keeps the registration until it expires; wait
# this much longer than the session timeout before giving up.
REGISTER_GRACE_S: Final = 5.0
REGISTER_RETRY_S: Final = 0.5


def run(config: BookieConfig, reload: Reload) -> int:
    """Serve as a bookie until SIGTERM; the process's exit status."""
    install_uvloop()
    sys.setswitchinterval(config.gil_switch_interval_ms / 1000.0)  # see BookieConfig
    return asyncio.run(_serve(config, reload))


# -- cookies -----------------------------------------------------------------------------


def _dirs(config: BookieConfig) -> tuple[Path, Path, Path]:
    return (
        Path(config.journal_dir).resolve(),
        Path(config.ledgers_dir).resolve(),
        Path(config.index_dir).resolve(),
    )


def _cookie_for(config: BookieConfig, instance_id: str) -> Cookie:
    journal, ledgers, index = _dirs(config)
    return Cookie(instance_id, str(journal), str(ledgers), str(index))


def check_local_cookies(config: BookieConfig, expected: Cookie) -> bool:
    """Compare the ``COOKIE`` file of each directory with ``expected``.

    Returns False when no directory has one (a first start), True when all match;
    raises CookieMismatchError when any differs or only some directories have one.
    """
    found: dict[Path, Cookie] = {}
    for d in _dirs(config):
        path = d / COOKIE_FILE
        try:
            found[d] = Cookie.decode(path.read_bytes(), str(path))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot read cookie {path}: {exc.strerror}") from exc
    if not found:
        return False
    missing = [str(d) for d in _dirs(config) if d not in found]
    if missing:
        raise CookieMismatchError(
            f"directories {missing} have no cookie while {sorted(map(str, found))} do: "
            "a disk was wiped or replaced"
        )
    for d, cookie in found.items():
        diffs = cookie.differences(expected)
        if diffs:
            raise CookieMismatchError(f"cookie in {d} does not match: " + "; ".join(diffs))
    return True


def write_local_cookies(config: BookieConfig, cookie: Cookie) -> None:
    """Write the cookie into each directory (atomically: temp file, fsync, rename)."""
    data = cookie.encode()
    for d in _dirs(config):
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / (COOKIE_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, d / COOKIE_FILE)
        dir_fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


async def _check_cookies(md: MetadataClient, config: BookieConfig, bookie_id: str) -> None:
    cluster = await md.cluster.init()
    cookie = _cookie_for(config, cluster.instance_id)
    if check_local_cookies(config, cookie):
        try:
            await md.bookies.check_cookie(bookie_id, cookie)
        except NotFoundError:
            # Its disks joined this cluster, which has forgotten it: retired (`bookline
            # bookie retire`), and a retired bookie never comes back on its old disks.
            raise CookieMismatchError(
                f"bookie {bookie_id} was retired (its directories hold a cookie of this "
                "cluster, ZooKeeper none): to reuse the id, wipe its directories"
            ) from None
        return
    # No local cookie: a new bookie -- unless ZooKeeper remembers disks for this id.
    try:
        await md.bookies.read_cookie(bookie_id)
    except NotFoundError:
        await md.bookies.write_cookie(bookie_id, cookie)
        write_local_cookies(config, cookie)
        log.info("bookie %s: first start, cookie written", bookie_id)
        return
    raise CookieMismatchError(
        f"bookie {bookie_id} has a cookie in ZooKeeper but its directories have none: "
        "they were wiped or are the wrong ones (to reuse the id on new disks, delete "
        "the cookie in ZooKeeper first)"
    )


# -- registration ------------------------------------------------------------------------


async def _register(md: MetadataClient, info: BookieInfo, config: BookieConfig) -> None:
    deadline = time.monotonic() + config.session_timeout_ms / 1000.0 + REGISTER_GRACE_S
    while True:
        try:
            await md.bookies.register(info)
            return
        except AlreadyExistsError:
            if time.monotonic() > deadline:
                raise
            log.info("bookie %s: waiting for a previous session to expire", info.bookie_id)
            await asyncio.sleep(REGISTER_RETRY_S)


def _info(server: BookieServer, config: BookieConfig, bookie_id: str) -> BookieInfo:
    usage = server.storage.disk_usage()
    return BookieInfo(
        bookie_id=bookie_id,
        address=server.address,
        state=READONLY if usage.read_only else WRITABLE,
        rack=config.rack or "/default-rack",
        disk_usage=min(max(usage.used_fraction, 0.0), 1.0),
        free_bytes=usage.free_bytes,
        total_bytes=usage.total_bytes,
        http_address=server.metrics_address,
        proof=""
        if server.credential is None
        else registration_proof(server.credential, bookie_id, server.address),
    )


# -- the process ---------------------------------------------------------------------


def _bookie_id(config: BookieConfig) -> str:
    if config.bookie_id:
        return config.bookie_id
    if config.port == 0:
        raise ConfigError("bookie.port 0 needs an explicit bookie_id (the id must be stable)")
    return f"{config.host}:{config.port}"


async def _serve(config: BookieConfig, reload: Reload) -> int:
    bookie_id = _bookie_id(config)
    md = MetadataClient(
        MetadataConfig(zk=config.zk, root=config.root, session_timeout_ms=config.session_timeout_ms)
    )
    await md.connect()
    try:
        await _check_cookies(md, config, bookie_id)
        storage = BookieStorage(config)
        try:
            await storage.start()
        except JournalCorruptError as exc:
            # Damaged acknowledged data the journal cannot replay around: say so plainly
            # and stop (exit 3), rather than drop entries; the operator decides.
            log.critical("bookie %s cannot start: %s", bookie_id, exc)
            await storage.abort()
            return EXIT_FATAL
        try:
            return await _run_server(md, config, storage, bookie_id, reload)
        finally:
            if storage.failed is None:
                await storage.close()  # checkpoint: the next start replays little
            else:
                await storage.abort()
    finally:
        await md.close()


async def _run_server(
    md: MetadataClient,
    config: BookieConfig,
    storage: BookieStorage,
    bookie_id: str,
    reload: Reload,
) -> int:
    async def ledger_lookup(ledger_id: int) -> LedgerMetadata:
        meta, _version = await md.ledgers.read(ledger_id)
        return meta

    server = BookieServer(config, storage, bookie_id=bookie_id, ledger_lookup=ledger_lookup)
    await server.start()
    stack = contextlib.AsyncExitStack()
    try:
        await _watch_forced_read_only(md, server, bookie_id, stack)
        await server.check_disk()  # registered read-only at once if an operator said so
        info = _info(server, config, bookie_id)
        await _register(md, info, config)

        async def on_read_only_change(read_only: bool) -> None:
            await md.bookies.set_readonly(bookie_id, read_only)

        server.watch_read_only(on_read_only_change, registered=info.state == READONLY)
        registration = Registration(
            md, lambda: _info(server, config, bookie_id), server.note_registered
        )
        registration.start()
        stack.push_async_callback(registration.stop)
        settle_heap()  # serving from here: keep full collections off the start-up heap
        gc = LedgerGc(storage, md.ledgers.list_ledger_ids, config.gc_interval_ms / 1000.0)
        gc_task = asyncio.create_task(gc.run(), name="bookie-ledger-gc")
        stack.push_async_callback(_cancel, gc_task)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, _reload_thresholds, server, reload)
        print(
            f"bookie ready id={bookie_id} address={server.address} "
            f"metrics={server.metrics_address or '-'}",
            flush=True,
        )
        stopped = asyncio.ensure_future(stop.wait())
        failed = asyncio.ensure_future(server.failed.wait())
        await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        failed.cancel()
        if server.failed.is_set():
            log.critical("bookie %s stopping after fatal error: %s", bookie_id, server.fatal_error)
            return EXIT_FATAL
        log.info("bookie %s: shutting down", bookie_id)
        await stack.aclose()  # no re-registration or gc from here on
        # Gone at once, so clients stop choosing this bookie now rather than at the
        # session's end (unregister ignores a registration already gone; tidy bounds it).
        await md.zk.tidy(
            md.bookies.unregister(bookie_id), f"the removal of bookie {bookie_id}'s registration"
        )
        return 0
    finally:
        try:
            await stack.aclose()
        finally:
            await server.stop()


async def _watch_forced_read_only(
    md: MetadataClient, server: BookieServer, bookie_id: str, stack: contextlib.AsyncExitStack
) -> None:
    """Follow ``bookies/forcedreadonly/<id>`` (``bookline bookie readonly|writable``):
    present, the bookie is held read-only; applied at once, not at the next disk check."""
    checks: set[asyncio.Task[object]] = set()

    def on_change(snapshot: tuple[bytes, int] | None) -> None:
        server.set_forced_read_only(snapshot is not None)
        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(server.check_disk())
        checks.add(task)
        task.add_done_callback(checks.discard)

    watch = await md.zk.watch_data(md.layout.bookie_forced_readonly(bookie_id), on_change)
    stack.callback(watch.cancel)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _reload_thresholds(server: BookieServer, reload: Reload) -> None:
    try:
        fresh = reload()
        server.set_disk_thresholds(fresh.disk_usage_threshold, fresh.disk_usage_lwm)
    except ConfigError as exc:
        log.error("SIGHUP: config not reloaded: %s", exc)
