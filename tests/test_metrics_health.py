"""``/health`` states (foundation/health.py) as a bookie reports them: ok, degraded while
read-only, down after a fatal storage error, down when its event loop stops publishing;
404 for other paths. An in-process bookie on a real storage engine."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bookie import metrics as bookie_metrics
from foundation.errors import IOFailureError
from foundation.health import RecentErrors, State, health_body, http_status
from tests.test_bookie_server import bookie_config, start_bookie, stop_bookie
from tests.waiting import wait_for


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        data = exc.read()
        return exc.code, json.loads(data) if data.startswith(b"{") else {}


async def _wait_state(url: str, state: str) -> dict[str, object]:
    async def reached() -> dict[str, object]:
        status, body = await asyncio.to_thread(_get, url)
        if body["state"] != state:
            return {}
        assert status == http_status(State(state)), (status, body)
        return body

    return await wait_for(reached, f"{url} in state {state}", timeout_s=10.0)


def test_states_and_statuses() -> None:
    assert [http_status(s) for s in State] == [200, 200, 503, 503, 503]
    body = health_body("x", "x-1", State.DEGRADED, "because", extra=1)
    assert body["state"] == body["status"] == "degraded"
    assert (body["why"], body["extra"], body["service"]) == ("because", 1, "x")


def test_recent_errors_keep_warnings_newest_first() -> None:
    errors = RecentErrors.installed()
    log = logging.getLogger("tests.health")
    log.info("not kept")
    log.warning("first %d", 1)
    log.error("second")
    kept = [e["message"] for e in errors.snapshot()]
    assert kept[:2] == ["second", "first 1"]
    assert "not kept" not in kept


async def test_bookie_health_follows_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = await start_bookie(bookie_config(tmp_path, metrics_port=0))
    url = b.server.metrics_address.removesuffix("/metrics") + "/health"
    try:
        body = await _wait_state(url, "ok")
        assert body["why"] == "writable" and body["id"] == "test-bookie"
        status, _ = await asyncio.to_thread(_get, url.replace("/health", "/nope"))
        assert status == 404
        b.server.set_disk_thresholds(1e-9, 1e-10)  # any usage is "too full"
        body = await _wait_state(url, "degraded")
        assert "read-only" in str(body["why"]) and body["read_only"] is True
        b.server.set_disk_thresholds(0.9999, 0.9998)
        await _wait_state(url, "ok")
        # A loop that stops publishing (blocked, hung) is reported down.
        monkeypatch.setattr(bookie_metrics, "HEALTH_STALE_S", 0.0)
        b.server._health_task.cancel()  # type: ignore[union-attr]
        body = await _wait_state(url, "down")
        assert "event loop unresponsive" in str(body["why"])
        monkeypatch.undo()
        b.server.fail(IOFailureError("journal fsync failed"))
        body = await _wait_state(url, "down")
        # why: a fixed sentence (public); the error's own text is a detail
        assert body["why"] == "fatal storage error", body
        assert "journal fsync failed" in str(body["error"])
    finally:
        await stop_bookie(b)


async def test_every_storage_stat_has_a_family(tmp_path: Path) -> None:
    """A stat the engine starts reporting needs a row in STORAGE_FAMILIES (its type,
    unit and help), or it would be logged and dropped."""
    b = await start_bookie(bookie_config(tmp_path))
    try:
        stats = b.storage.stats()  # type: ignore[attr-defined]
    finally:
        await stop_bookie(b)
    assert set(stats) - set(bookie_metrics.STORAGE_FAMILIES) == set()
