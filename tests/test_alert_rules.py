"""The alert rules (ops/monitoring/bookline-alerts.yml) against real scrapes, with
``promtool test rules`` (Debian's prometheus package; ops/setup.sh installs it).

A local cluster (3 bookies, a write and a read proxy, no autorecovery) is put through
states one after another; in each, every target's ``/metrics`` is scraped twice around
what the state does (``up`` is 0 for a target that does not answer, as Prometheus
records it). Each scrape pair becomes promtool input series: a gauge stays at its
second value, a counter grows per minute at the rate the two scrapes saw. promtool then
evaluates the real rules file (annotations dropped: templates are not what is tested)
and checks exactly which alerts fire:

* healthy (writes answered quickly): nothing fires but ``BooklineNoAuditor`` -- no
  autorecovery runs, so ``bookline_autorecovery_auditor_leader`` is absent (issue 22,
  8: the rule was empty then and could never fire);
* slow writes (the write proxy's test-only stall hook): ``BooklineWriteLatencyHigh``;
* every bookie killed, writes answered 5xx: ``BooklineServiceDown`` for each bookie
  and ``BooklineProxyServerErrors`` for the write proxy (issue 22, 8: the rule added
  two per-instance sums that never share an instance, so it matched nothing).

Every rule of the file is evaluated in every state, so a rule that fires on a healthy
cluster fails here too.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from ops import procs
from ops.local import LocalCluster

pytestmark = pytest.mark.integration

RULES = Path(__file__).resolve().parents[1] / "ops" / "monitoring" / "bookline-alerts.yml"
# Input series span this many 1-minute steps; the alerts are checked at EVAL_MIN, after
# the longest `for:` (30m) plus the longest rate window (15m).
STEPS = 60
EVAL_MIN = 50
# A write stalled by the proxy's fault hook answers after this long (> the rule's 0.5 s).
STALL_MS = 1500
SCRAPE_TIMEOUT_S = 10.0
# Requests made while every bookie is down; concurrent, so their 5xx rate is well
# above the rule's 0.1/s whatever the machine's speed (they fail within their timeout).
FAILING_REQUESTS = 30
REQUEST_TIMEOUT_S = 120.0

JOBS = {
    "bookie": "bookline-bookie",
    "writeproxy": "bookline-writeproxy",
    "readproxy": "bookline-readproxy",
    "autorecovery": "bookline-autorecovery",
}


@dataclass
class Scrape:
    at: float
    up: dict[tuple[str, str], int]  # (job, instance) -> 1/0
    samples: dict[str, float]  # series selector -> value
    counters: set[str]  # selectors of samples that only grow


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: ops/setup.sh installs Debian's prometheus package"
    return path


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _parse(text: str, job: str, instance: str, out: Scrape) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        growing = family.type in ("counter", "histogram", "summary")
        for s in family.samples:
            if not math.isfinite(s.value) or s.name.endswith("_created"):
                continue
            key = _selector(s.name, {**s.labels, "job": job, "instance": instance})
            out.samples[key] = s.value
            if (growing and not s.name.endswith("_sum")) or s.name.endswith("_count"):
                out.counters.add(key)


def _targets(cluster: LocalCluster) -> list[tuple[str, str]]:
    """(job, metrics URL) of every child, alive or not."""
    out = []
    for info in cluster.children():
        if info.kind in JOBS and "metrics" in info.extra:
            out.append((JOBS[info.kind], str(info.extra["metrics"])))
    return out


async def _scrape(cluster: LocalCluster) -> Scrape:
    result = Scrape(time.monotonic(), {}, {}, set())
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for job, url in _targets(cluster):
            instance = url.split("//", 1)[1].split("/", 1)[0]
            try:
                async with session.get(url) as resp:
                    text = await resp.text() if resp.status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                text = None
            result.up[(job, instance)] = int(text is not None)
            if text is not None:
                _parse(text, job, instance, result)
    return result


def _series(before: Scrape, after: Scrape) -> list[dict[str, str]]:
    """promtool input series: gauges at their last value, counters growing per minute
    at the rate seen between the scrapes."""
    minutes = max(after.at - before.at, 1e-3) / 60
    out = [
        {"series": _selector("up", {"job": j, "instance": i}), "values": f"{v}x{STEPS}"}
        for (j, i), v in after.up.items()
    ]
    for key, value in after.samples.items():
        if key in after.counters:
            # A counter's new label set (a first 503) starts from 0, as Prometheus
            # counts a series that appears.
            per_min = max(0.0, value - before.samples.get(key, 0.0)) / minutes
            start = value - per_min * STEPS
            out.append({"series": key, "values": f"{start:.9g}+{per_min:.9g}x{STEPS}"})
        else:
            out.append({"series": key, "values": f"{value:.9g}x{STEPS}"})
    return out


def _rules_without_annotations(tmp: Path) -> tuple[Path, list[str]]:
    doc = yaml.safe_load(RULES.read_text())
    names = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
            names.append(rule["alert"])
    path = tmp / "rules.yml"
    path.write_text(json.dumps(doc))
    return path, names


def _check(
    tmp: Path, name: str, series: list[dict[str, str]], firing: dict[str, list[dict[str, str]]]
) -> None:
    """promtool: exactly the ``firing`` alerts (with those labels) fire, no other."""
    rules, names = _rules_without_annotations(tmp)
    unknown = set(firing) - set(names)
    assert not unknown, f"no such rules: {unknown}"
    severities = {
        r["alert"]: r["labels"]["severity"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
    }
    tests = [
        {
            "eval_time": f"{EVAL_MIN}m",
            "alertname": alert,
            "exp_alerts": [
                {"exp_labels": {**labels, "severity": severities[alert]}}
                for labels in firing.get(alert, [])
            ],
        }
        for alert in names
    ]
    doc = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {"name": name, "interval": "1m", "input_series": series, "alert_rule_test": tests}
        ],
    }
    path = tmp / f"{name}.test.yml"
    path.write_text(json.dumps(doc))
    run = subprocess.run(
        [_promtool(), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, f"{name}:\n{run.stdout}\n{run.stderr}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("alerts"),
        bookies=3,
        write_proxies=1,
        read_proxies=1,
        proxy_args={
            "writeproxy": ["--fault-stall-writes", "1000", "--fault-stall-ms", str(STALL_MS)]
        },
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


async def _during(
    cluster: LocalCluster, act: Callable[[], Awaitable[None]]
) -> list[dict[str, str]]:
    before = await _scrape(cluster)
    await act()
    return _series(before, await _scrape(cluster))


def _instance(url: str) -> str:
    return url.split("//", 1)[1].split("/", 1)[0]


async def _post(session: aiohttp.ClientSession, url: str, stream: str) -> int:
    body = {"payload": "hi"}
    async with session.post(f"{url}/v1/streams/{stream}/records", json=body) as resp:
        await resp.read()
        return resp.status


async def _get(session: aiohttp.ClientSession, url: str, stream: str) -> int:
    async with session.get(f"{url}/v1/streams/{stream}/records?from=earliest&limit=1") as resp:
        await resp.read()
        return resp.status


async def test_each_alert_fires_in_the_state_it_catches_and_only_there(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    wp = str(cluster.write_proxies[0].extra["url"])
    rp = str(cluster.read_proxies[0].extra["url"])
    stream = f"alerts-{uuid.uuid4().hex[:8]}"
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def healthy() -> None:
            for _ in range(20):
                assert await _post(session, wp, stream) == 200
            assert await _get(session, rp, stream) == 200

        series = await _during(cluster, healthy)
        _check(tmp_path, "healthy", series, {"BooklineNoAuditor": [{}]})

        async def slow_writes() -> None:
            statuses = await asyncio.gather(
                *(_post(session, wp, f"fault-{stream}") for _ in range(5))
            )
            assert set(statuses) == {200}

        series = await _during(cluster, slow_writes)
        _check(
            tmp_path,
            "slow-writes",
            series,
            {
                "BooklineNoAuditor": [{}],
                "BooklineWriteLatencyHigh": [{"instance": _instance(wp)}],
            },
        )

        for bookie in cluster.bookies:
            procs.kill9(bookie.proc)

        async def failing() -> None:
            fresh = f"down-{uuid.uuid4().hex[:8]}"
            statuses = await asyncio.gather(
                *(_post(session, wp, f"{fresh}-{i}") for i in range(FAILING_REQUESTS))
            )
            assert all(s >= 500 for s in statuses), statuses

        series = await _during(cluster, failing)
    bookies = [
        {"job": "bookline-bookie", "instance": _instance(str(b.extra["metrics"]))}
        for b in cluster.bookies
    ]
    _check(
        tmp_path,
        "bookies-down",
        series,
        {
            "BooklineNoAuditor": [{}],
            "BooklineServiceDown": bookies,
            "BooklineProxyServerErrors": [{"instance": _instance(wp)}],
            # Failing writes take their retries' time: write latency is high too.
            "BooklineWriteLatencyHigh": [{"instance": _instance(wp)}],
        },
    )


def test_rules_file_is_valid_for_promtool() -> None:
    run = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
