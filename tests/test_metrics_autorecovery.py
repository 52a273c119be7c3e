"""``bookline autorecovery --http-port``: its ``/health`` and ``/metrics`` (issue 16:
"autorecovery exports nothing"). A real process on the session's ZooKeeper and a
closed ledger whose bookies are all gone (metadata only): the auditor marks it, the
worker fails to repair it (no bookie to copy to) and keeps it under-replicated -- each
step shows in its family."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import aiohttp
import pytest

from foundation.config import MetadataConfig
from metadata.client import MetadataClient
from metadata.ledger_metadata import LedgerMetadata, LedgerState, Segment
from ops.cluster import procs
from tests.metrics_support import family_types, sample_sum, scrape
from tests.test_ledger_integration import BOOKLINE
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

READY_S = 60.0


async def _wait_ready(proc: subprocess.Popen[bytes], log: Path) -> str:
    def text() -> str:
        return log.read_text(errors="replace") if log.exists() else ""

    def ready() -> str:
        m = re.search(r"autorecovery ready id=\S+ http=(\S+)", text())
        assert m or proc.poll() is None, text()[-3000:]
        return m.group(1) if m else ""

    def what() -> str:
        return f"autorecovery ready:\n{text()[-3000:]}"

    return await wait_for(ready, what, timeout_s=READY_S)


async def test_autorecovery_serves_health_and_metrics(
    zk_connect: str, cluster_root: str, tmp_path: Path
) -> None:
    md = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root))
    await md.connect()
    log = tmp_path / "autorecovery.log"
    argv = [BOOKLINE, "autorecovery", "--zk", zk_connect, "--root", cluster_root,
            "--http-port", "0", "--grace-ms", "0", "--retry-backoff-ms", "200"]  # fmt: skip
    try:
        await md.init_cluster()
        gone = ("gone-0", "gone-1", "gone-2")
        ledger_id = await md.ledger_ids.next_id()
        await md.ledgers.create(
            LedgerMetadata(
                ledger_id=ledger_id, ensemble_size=3, write_quorum=3, ack_quorum=2,
                segments=(Segment(0, gone),), state=LedgerState.CLOSED, last_entry_id=9,
                length=90,
            )
        )  # fmt: skip
        proc = procs.spawn(argv, log_path=log)
        try:
            url = await _wait_ready(proc, log)
            async with aiohttp.ClientSession() as session:

                async def failed_once() -> str:  # the auditor marks, the worker tries
                    text = await scrape(session, f"{url}/metrics")
                    failures = "bookline_autorecovery_replication_failures_total"
                    return text if sample_sum(text, failures) else ""

                text = await wait_for(failed_once, "a replication failure", timeout_s=READY_S)
                async with session.get(f"{url}/health") as resp:
                    assert resp.status == 200
                    health = await resp.json()
            assert health["service"] == "autorecovery"
            assert health["state"] == "ok", health
            assert health["underreplicated_ledgers"] == 1
            assert health["auditor_leader"] is True
            assert sample_sum(text, "bookline_autorecovery_underreplicated_ledgers") == 1
            assert sample_sum(text, "bookline_autorecovery_ledgers_marked_total") >= 1
            assert sample_sum(text, "bookline_autorecovery_audits_total") >= 1
            assert sample_sum(text, "bookline_autorecovery_auditor_leader") == 1
            types = family_types(text)
            for family in (
                "bookline_autorecovery_ledgers_replicated",
                "bookline_autorecovery_entries_copied",
                "bookline_autorecovery_copied_bytes",
                "bookline_autorecovery_replica_checks",
                "bookline_ledger_recoveries",
            ):
                assert types[family] == "counter", family
            assert sample_sum(text, "process_cpu_seconds_total") > 0
        finally:
            code = await asyncio.to_thread(procs.stop, proc, 10.0)
        assert code == 0, log.read_text()[-3000:]
    finally:
        await md.close()
