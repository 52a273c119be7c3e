"""Logs: quiet libraries, no false alarm at start-up, -v anywhere, JSON lines."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from foundation import logs
from ops.cluster import procs
from tests.cli_support import run_cli
from tests.waiting import wait_until


def test_verbose_and_log_format_work_after_the_sub_command(tmp_path: Path) -> None:
    """Before: ``bookline stream list -v`` was 'unrecognized arguments: -v' (exit 2)."""
    missing = str(tmp_path / "nothere.json")
    out = run_cli("stream", "list", "--cluster", missing, "-v", "--log-format", "json")
    assert "unrecognized arguments" not in out.stderr, out.stderr
    assert out.returncode != 2, out.stderr
    assert "CONFIG (14)" in out.stderr
    # ... and still before it
    out = run_cli("-v", "stream", "list", "--cluster", missing)
    assert out.returncode != 2 and "CONFIG (14)" in out.stderr, out.stderr


@pytest.mark.integration
def test_a_service_logs_no_kazoo_chatter_nor_a_false_session_loss(
    zk_connect: str, cluster_root: str, tmp_path: Path
) -> None:
    """Before: every service logged kazoo's INFO lines ('Connecting to ...',
    'Zookeeper connection established') and 'session state LOST -> CONNECTED' at start."""
    asyncio.run(_init_cluster(zk_connect, cluster_root))
    log_path = tmp_path / "autorecovery.log"
    argv = [sys.executable, "-m", "ops.cli", "autorecovery", "--zk", zk_connect]
    argv += ["--root", cluster_root]
    proc = procs.spawn(argv, log_path=log_path, env=dict(os.environ))
    try:
        wait_until(
            lambda: b"autorecovery ready" in log_path.read_bytes() or proc.poll() is not None,
            "autorecovery to start",
            timeout_s=60,
        )
        time.sleep(0.5)  # let late session-state callbacks log, if they would
    finally:
        proc.send_signal(signal.SIGTERM)
        procs.stop(proc)
    text = log_path.read_text()
    assert "autorecovery ready" in text, text[-2000:]
    assert " kazoo" not in text, text[-2000:]
    assert "LOST -> CONNECTED" not in text, text[-2000:]


async def _init_cluster(zk: str, root: str) -> None:
    from foundation.config import MetadataConfig
    from metadata.client import MetadataClient

    async with MetadataClient(MetadataConfig(zk=zk, root=root)) as md:
        await md.init_cluster()


def test_json_lines_carry_the_ids_a_message_names() -> None:
    out = io.StringIO()
    logs.setup(fmt="json", stream=out, environ={})
    try:
        logs.set_identity("bookie", "bookie-1")
        log = logging.getLogger("bookline.test")
        log.info("ledger %d of stream %s copied to bookie %s: 100%% done", 7, "s1", "b2")
        log.warning("plain message", extra={"path": "/v1/x"})
        logging.getLogger("kazoo.client").info("Connecting to ...")
    finally:
        logs.setup(environ={})
        logs.set_identity("", "")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2, lines  # kazoo's INFO is not shown
    first = lines[0]
    assert first["msg"] == "ledger 7 of stream s1 copied to bookie b2: 100% done"
    assert (first["ledger"], first["stream"], first["bookie"]) == (7, "s1", "b2")
    assert (first["service"], first["id"], first["level"]) == ("bookie", "bookie-1", "INFO")
    assert lines[1]["path"] == "/v1/x"


def test_plain_is_the_default() -> None:
    out = io.StringIO()
    logs.setup(stream=out, environ={})
    try:
        logging.getLogger("bookline.test").info("hello %s", "there")
    finally:
        logs.setup(environ={})
    assert out.getvalue().rstrip().endswith("INFO bookline.test: hello there")
