"""Helpers for tests against a ``LocalCluster`` (real processes): one started for a block
and stopped by pid when it ends, also on failure; its ``cluster.json`` as it is now; and
the credentials of one started with ``auth=True`` (its signing secret, a token, the
header that carries it)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from foundation.auth import load_secrets, sign_token
from ops.cluster import procs
from ops.cluster.local import LocalCluster
from tests.waiting import wait_for

# A token's default lifetime: longer than any test that does not let it expire.
TOKEN_LIFETIME_S = 600.0


@contextlib.contextmanager
def started_cluster(
    directory: Path, *, extra_args: Mapping[str, list[str]] | None = None, **options: Any
) -> Iterator[LocalCluster]:
    """``LocalCluster(directory, **options)``, started (``extra_args``: more flags for the
    named children, e.g. ``{"bookie-1": [...]}``); every process it started is stopped
    when the block ends."""
    cluster = LocalCluster(directory, **options)
    cluster.extra_args.update(extra_args or {})
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def cluster_doc(path: Path) -> dict[str, Any]:
    """``cluster.json`` (``bookline local``'s) as it is now: ``{}`` while it is missing or
    half written."""
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc


def cluster_secret(cluster: LocalCluster) -> bytes:
    """The secret the cluster's services check tokens with (its first, current one)."""
    return load_secrets(str(cluster.dir / "auth" / "secret"))[0]


def token(secret: bytes, principal: str, lifetime_s: float = TOKEN_LIFETIME_S) -> str:
    return sign_token(secret, principal, time.time() + lifetime_s)


def bearer(tok: str) -> dict[str, str]:
    """The ``Authorization`` header that carries ``tok``."""
    return {"Authorization": f"Bearer {tok}"}


def kill_bookies(cluster: LocalCluster) -> None:
    """Every bookie of ``cluster`` killed at once (kill -9, by pid): an outage."""
    for bookie in cluster.bookies:
        procs.kill9(bookie.proc)


async def restart_bookies(cluster: LocalCluster, timeout_s: float = 90.0) -> None:
    """Every bookie of ``cluster`` started again on its ports and directories, and
    serving (a restarted machine gets ``timeout_s``, scaled)."""
    fresh = [cluster.respawn(b) for b in list(cluster.bookies)]
    await wait_for(
        lambda: all(cluster.is_ready(b) for b in fresh), "the bookies to serve", timeout_s=timeout_s
    )


def bytes_on_disk(paths: Iterator[Path]) -> int:
    """The total size of the files named; one deleted between its listing and its size
    (a bookie's GC at work) counts as gone (0 bytes), which is what it is."""
    total = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total
