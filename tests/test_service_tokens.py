"""Proxies that hold the token-signing secret sign their own short-lived tokens of the
services' principal for the bookies, and keep working across their expiry (issue 21:
bookie connections refuse expired tokens; the static ``$BOOKLINE_TOKEN`` it was given
expires too and must not be what it relies on).

Real processes: ZooKeeper and 3 bookies with auth on (``LocalCluster(auth=True)``) and
a write and a read proxy started here with ``--auth-service-token-lifetime-s`` of a few
seconds and a ``$BOOKLINE_TOKEN`` of the same lifetime, so a proxy still presenting the
static token is refused by the bookies once it has expired.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foundation.auth import SERVICE_PRINCIPAL, TOKEN_ENV, load_secrets, sign_token
from ledger.keys import SECRET_FILE_ENV
from metadata.client import DIGEST_FILE_ENV
from ops.cluster import procs
from ops.cluster.children import READY_MARKERS
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from tests.values import values
from tests.waiting import wait_until
from thinclient.client import ClientConfig, ProxyClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
# Whole seconds (a token's expiry is), with room for a renewal at 4/5 of it on a
# loaded machine.
LIFETIME_S = 6
READY_TIMEOUT_S = 90.0
CLIENT = ClientConfig(retry_deadline_ms=20_000)


def _spawn_proxy(
    cluster: LocalCluster, kind: str, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    assert cluster.auth is not None and cluster.ledger_secret_file is not None
    secret = load_secrets(str(cluster.auth.secret_file))[0]
    port = procs.free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        SECRET_FILE_ENV: str(cluster.ledger_secret_file),
        DIGEST_FILE_ENV: str(cluster.zk_digest_file),
        # What `bookline local` and the kit hand every service (a year there): here it
        # lapses within the test, so relying on it fails.
        TOKEN_ENV: sign_token(secret, SERVICE_PRINCIPAL, time.time() + LIFETIME_S),
    }
    argv = [
        sys.executable, "-m", "ops.cli", kind,
        "--zk", cluster.zk_connect, "--root", CLUSTER_ROOT, "--port", str(port),
        "--auth-enabled", "true",
        "--auth-secret-file", str(cluster.auth.secret_file),
        "--auth-grants-file", str(cluster.auth.grants_file),
        "--auth-service-token-lifetime-s", str(LIFETIME_S),
    ]  # fmt: skip
    proc = procs.spawn(argv, log_path=log, env=env, cwd=ROOT)
    return proc, f"http://127.0.0.1:{port}"


def _ready(kind: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"{kind} exited: {log.read_text()[-3000:]}")
    return READY_MARKERS[kind] in log.read_bytes()


def test_proxies_that_can_sign_keep_working_across_their_tokens_expiry(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "local", bookies=3, write_proxies=0, read_proxies=0, auth=True
    )
    running: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    cluster.start()
    try:
        assert cluster.auth is not None
        admin = cluster.auth.token
        started = time.time()
        urls = {}
        for kind in ("writeproxy", "readproxy"):
            log = tmp_path / f"{kind}.log"
            proc, urls[kind] = _spawn_proxy(cluster, kind, log)
            running.append((kind, proc, log))
        for kind, proc, log in running:
            ready = functools.partial(_ready, kind, proc, log)
            wait_until(ready, f"{kind} ready", timeout_s=READY_TIMEOUT_S)

        async def write_and_read(stream: str, payload: bytes) -> list[bytes]:
            async with ProxyClient(
                write_urls=[urls["writeproxy"]], read_urls=[urls["readproxy"]],
                token=admin, config=CLIENT,
            ) as client:  # fmt: skip
                await client.write(stream, payload)
                page = await client.read(stream)
                return values(page.records)

        assert asyncio.run(write_and_read("svc-a", b"before")) == [b"before"]
        # Past two lifetimes: the static token and the proxies' first own tokens have
        # expired; their open bookie connections must have presented fresher ones.
        expired = started + 2 * LIFETIME_S + 1
        time.sleep(max(0.0, expired - time.time()))  # behaviour: the tokens left to expire
        assert asyncio.run(write_and_read("svc-a", b"after")) == [b"before", b"after"]
        assert asyncio.run(write_and_read("svc-b", b"new ledger")) == [b"new ledger"]
        for _kind, _proc, log in running:
            assert b"no fresher one is at hand" not in log.read_bytes(), log
    finally:
        for _kind, proc, _log in reversed(running):
            procs.stop(proc)
        cluster.stop()
