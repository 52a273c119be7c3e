"""Reading Prometheus text in tests: scrape, sum a family's samples, family types; and the
msgpack requests to a proxy whose counting the tests check."""

from __future__ import annotations

import io
import re

import aiohttp

from httpapi import wire

# Label values may hold braces (route patterns: endpoint="/v1/streams/{name}").
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? ([-+0-9.eE]+|NaN|[+-]Inf)$", re.M)
_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)$", re.M)


_MSGPACK_HEADERS = {"Content-Type": wire.MSGPACK, "Accept": wire.MSGPACK}


async def post_msgpack(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> None:
    """POST ``body`` in msgpack; the proxy accepted it (200 or 201)."""
    data = io.BytesIO(wire.encode_body(body, wire.MSGPACK))
    async with session.post(url, data=data, headers=_MSGPACK_HEADERS) as resp:
        await resp.read()
        assert resp.status in (200, 201), (url, resp.status)


async def get_msgpack(session: aiohttp.ClientSession, url: str) -> None:
    """GET ``url`` in msgpack, read to the end; the proxy answered 200."""
    async with session.get(url, headers={"Accept": wire.MSGPACK}) as resp:
        await resp.read()
        assert resp.status == 200, (url, resp.status)


async def scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as resp:
        assert resp.status == 200, (url, resp.status)
        return await resp.text()


def sample_sum(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples named exactly ``name`` whose label text contains ``labels``."""
    total = 0.0
    for m in _SAMPLE.finditer(text):
        if m.group(1) == name and labels in (m.group(2) or ""):
            total += float(m.group(3))
    return total


def sample_names(text: str) -> set[str]:
    return {m.group(1) for m in _SAMPLE.finditer(text)}


def family_types(text: str) -> dict[str, str]:
    """``# TYPE`` lines: family name -> counter/gauge/histogram/... (a counter's family
    name without ``_total``, which prometheus_client's text format adds)."""
    out: dict[str, str] = {}
    for m in _TYPE.finditer(text):
        name, kind = m.group(1), m.group(2)
        out[name.removesuffix("_total") if kind == "counter" else name] = kind
    return out
