"""Scrapes of a local cluster turned into ``promtool test rules`` input, and the check
of which alerts of ops/monitoring/bookline-alerts.yml fire (tests/test_alert_rules.py).

Every target's ``/metrics`` is scraped twice around what a state does (``up`` is 0 for
a target that does not answer, as Prometheus records it). The pair becomes promtool
input series: a gauge stays at its second value, a counter grows per minute at the
rate the two scrapes saw. promtool then evaluates the real rules file (annotations
dropped: templates are not what is tested).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from ops.cluster.local import LocalCluster

RULES = Path(__file__).resolve().parents[1] / "ops" / "monitoring" / "bookline-alerts.yml"
# Input series span this many 1-minute steps; the alerts are checked at EVAL_MIN, after
# the longest `for:` (30m) plus the longest rate window (15m).
STEPS = 60
EVAL_MIN = 50
SCRAPE_TIMEOUT_S = 10.0

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


@dataclass
class Window:
    """The two scrapes around one state's action."""

    before: Scrape
    after: Scrape

    def grew(self, name: str) -> set[str]:
        """Instances where a sample of family ``name`` grew between the scrapes."""
        out = set()
        for key, value in self.after.samples.items():
            if key.startswith(name + "{") and value > self.before.samples.get(key, 0.0):
                out.add(_label(key, "instance"))
        return out

    def value(self, name: str, instance: str) -> float | None:
        for key, value in self.after.samples.items():
            if key.startswith(name + "{") and _label(key, "instance") == instance:
                return value
        return None


def _label(selector: str, label: str) -> str:
    m = re.search(rf'[{{,]{label}="([^"]*)"', selector)
    return m.group(1) if m else ""


def instance(url: str) -> str:
    return url.split("//", 1)[1].split("/", 1)[0]


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: ops/setup.sh installs Debian's prometheus package"
    return path


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _parse(text: str, job: str, inst: str, out: Scrape) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        growing = family.type in ("counter", "histogram", "summary")
        for s in family.samples:
            if not math.isfinite(s.value) or s.name.endswith("_created"):
                continue
            key = _selector(s.name, {**s.labels, "job": job, "instance": inst})
            out.samples[key] = s.value
            if (growing and not s.name.endswith("_sum")) or s.name.endswith("_count"):
                out.counters.add(key)


def _targets(cluster: LocalCluster) -> list[tuple[str, str]]:
    """(job, metrics URL) of every child, alive or not."""
    return [
        (JOBS[info.kind], str(info.extra["metrics"]))
        for info in cluster.children()
        if info.kind in JOBS and "metrics" in info.extra
    ]


async def scrape(cluster: LocalCluster) -> Scrape:
    result = Scrape(time.monotonic(), {}, {}, set())
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for job, url in _targets(cluster):
            try:
                async with session.get(url) as resp:
                    text = await resp.text() if resp.status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                text = None
            result.up[(job, instance(url))] = int(text is not None)
            if text is not None:
                _parse(text, job, instance(url), result)
    return result


def series(window: Window) -> list[dict[str, str]]:
    """promtool input series: gauges at their last value, counters growing per minute
    at the rate seen between the scrapes."""
    before, after = window.before, window.after
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


def rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _rules_without_annotations(tmp: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = tmp / "rules.yml"
    path.write_text(json.dumps(doc))
    return path


def _evidence(window: Window, alerts: set[str]) -> str:
    """The input series of the metric families the checked rules use (a failure's
    diagnosis: what the cluster showed, not only which alerts came out)."""
    families = set()
    for rule in rules():
        if rule["alert"] in alerts:
            families |= set(re.findall(r"\b(up|bookline_[a-z_]+)\b", str(rule["expr"])))
    lines = [
        f"{s['series']} {s['values']}"
        for s in series(window)
        if any(s["series"].startswith(f) for f in families)
    ]
    return "\n".join(lines[:300])


def check(
    tmp: Path,
    name: str,
    window: Window,
    fire: dict[str, list[dict[str, str]]],
    quiet: set[str] = frozenset(),  # type: ignore[assignment]
) -> None:
    """promtool: the ``fire`` alerts fire with exactly those label sets, the ``quiet``
    ones do not fire; other alerts are not looked at (their outcome may depend on the
    machine's speed, e.g. a write's latency on a loaded machine)."""
    severities = {str(r["alert"]): r["labels"]["severity"] for r in rules()}  # type: ignore[index]
    unknown = (set(fire) | quiet) - set(severities)
    assert not unknown, f"no such rules: {unknown}"
    assert not set(fire) & quiet, "an alert cannot both fire and stay quiet"
    tests = [
        {
            "eval_time": f"{EVAL_MIN}m",
            "alertname": alert,
            "exp_alerts": [
                {"exp_labels": {**labels, "severity": severities[alert]}}
                for labels in fire.get(alert, [])
            ],
        }
        for alert in sorted(set(fire) | quiet)
    ]
    doc = {
        "rule_files": [str(_rules_without_annotations(tmp))],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": name,
                "interval": "1m",
                "input_series": series(window),
                "alert_rule_test": tests,
            }
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
    assert run.returncode == 0, (
        f"state {name} ({path}):\n{run.stdout}\n{run.stderr}\n"
        f"series of the checked rules' metrics:\n{_evidence(window, set(fire) | quiet)}"
    )
