"""The live dashboard a read proxy serves: ``GET /dashboard`` (a static page, vanilla
JavaScript, assets shipped in the package under ``readproxy/static/``; nothing is
fetched from outside) polling ``GET /v1/cluster`` (:mod:`readproxy.cluster`).

The page shows the bookies with their state and disks, the proxies, streams and topics
with segments, sizes and write rates, consumer groups' lag, under-replicated ledgers,
autorecovery's auditor and replication switch, ZooKeeper's session and servers, recent
errors, and throughput and serving-latency graphs drawn from the counters' deltas
between polls (SVG, with axes; the last 10 minutes, kept in the tab's sessionStorage
so a reload keeps them). The page names an empty favicon (no request, no 404), and
without a token on a cluster with auth on it says it needs one.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Final

from aiohttp import web

from foundation.errors import NotFoundError, UnavailableError
from httpapi.wire import API_PREFIX

if TYPE_CHECKING:
    from readproxy.cluster import ClusterView

__all__ = ["register_dashboard"]

# The files the page is made of, and their media types (nothing else is served).
ASSETS: Final = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}


def _asset(name: str) -> bytes:
    return (resources.files("readproxy") / "static" / name).read_bytes()


def register_dashboard(app: web.Application, view: Callable[[], ClusterView | None]) -> None:
    """``/dashboard``, its assets and ``/v1/cluster``; ``view`` is None while starting."""
    files = {name: _asset(name) for name in ASSETS}  # read once: small, and shipped

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=files["index.html"], content_type=ASSETS["index.html"])

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["file"]
        if name not in files:
            raise NotFoundError(f"no dashboard file {name}")
        resp = web.Response(body=files[name], content_type=ASSETS[name])
        resp.headers["Cache-Control"] = "no-cache"
        return resp

    async def cluster(request: web.Request) -> web.Response:
        current = view()
        if current is None:
            raise UnavailableError("read proxy is starting; retry")
        return web.json_response(await current.summary())

    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/{file}", asset)
    app.router.add_get(f"{API_PREFIX}/cluster", cluster)
