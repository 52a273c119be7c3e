"""Every proxy answer leaves a line in the access log (method, path, status, duration,
bytes) -- before, 400 and 413 answers left no trace at all."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from foundation.errors import BadRequestError
from httpapi.proxy_config import ProxyConfig
from httpapi.server import proxy_app, read_body, start_site


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"state": "ok"})


async def _refuse(request: web.Request) -> web.Response:
    await read_body(request)
    raise BadRequestError("no thanks")


async def test_400_and_413_answers_are_in_the_access_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    requests = Counter("requests", "answers", ["endpoint", "status"], registry=registry)
    app = proxy_app(health=_health, registry=registry, requests=requests, client_max_size=1024)
    app.router.add_post("/v1/streams/{name}/records", _refuse)
    runner, url = await start_site(app, ProxyConfig(port=0))
    caplog.set_level(logging.INFO, logger="bookline.access")
    try:
        async with aiohttp.ClientSession() as session:
            for body in (b"{}", b"x" * 4096):
                async with session.post(
                    f"{url}/v1/streams/s1/records",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    await resp.read()
            async with session.get(f"{url}/health") as resp:
                await resp.read()
    finally:
        await runner.cleanup()
    lines = [r for r in caplog.records if r.name == "bookline.access"]
    text = [r.getMessage() for r in lines]
    assert any("POST /v1/streams/s1/records 400 " in t for t in text), text
    assert any("POST /v1/streams/s1/records 413 " in t for t in text), text
    assert any("GET /health 200 " in t for t in text), text
    first = lines[0].__dict__
    for field in ("method", "path", "status", "duration_ms", "bytes", "remote"):
        assert field in first, first
