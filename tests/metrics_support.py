"""Reading Prometheus text in tests: scrape, sum a family's samples, family types."""

from __future__ import annotations

import re

import aiohttp

# Label values may hold braces (route patterns: endpoint="/v1/streams/{name}").
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? ([-+0-9.eE]+|NaN|[+-]Inf)$", re.M)
_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)$", re.M)


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
