"""``docs/metrics.md`` is kept in step with the code: every family each service's
registry exports is listed under that service with its type, nothing listed is gone,
every test named as moving a family exists, and the monitoring kit in
``ops/monitoring/`` only uses listed families. Pure (registries built in process)."""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from bookie.metrics import BookieMetrics
from ledger.autorecovery_config import AutorecoveryConfig
from ledger.metrics import LedgerMetrics
from ops.cli.compact_metrics import CompactionMetrics
from ops.cluster.autorecovery_http import AutorecoveryHttp
from readproxy.metrics import ReadProxyMetrics
from writeproxy.metrics import WriteProxyMetrics

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "metrics.md"
SERVICES = ("bookie", "writeproxy", "readproxy", "autorecovery")
# Section heading -> the services whose registries hold its families.
SECTIONS = {
    "Every service": SERVICES,
    "Bookie": ("bookie",),
    "Write proxy": ("writeproxy",),
    "Read proxy": ("readproxy",),
    "Ledger client (in the proxies and autorecovery)": ("writeproxy", "readproxy", "autorecovery"),
    "Autorecovery": ("autorecovery",),
    "Compaction job": ("compaction",),
}
_NAME = re.compile(r"^`([a-z_:]+)`$")


def documented() -> Iterator[tuple[str, str, str, str]]:
    """(section, family as queried, type, checked by) for every table row."""
    section = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip().strip("`")
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = _NAME.match(cells[0]) if len(cells) == 5 else None
        if m:
            yield section, m.group(1), cells[1], cells[3]


def registries() -> dict[str, CollectorRegistry]:
    wp = WriteProxyMetrics()
    wp.bind_groups(lambda: [])
    fake_ar = types.SimpleNamespace(
        config=AutorecoveryConfig(),
        client=types.SimpleNamespace(env=types.SimpleNamespace(metrics=LedgerMetrics())),
        auditor=types.SimpleNamespace(
            is_leader=False,
            audits=0,
            marked=0,
            replica_marked=0,
            replica_checks=0,
            orphans=types.SimpleNamespace(collected=0),
        ),
    )
    return {
        "bookie": BookieMetrics().registry,
        "writeproxy": wp.registry,
        "readproxy": ReadProxyMetrics().registry,
        "autorecovery": AutorecoveryHttp(cast(Any, fake_ar)).registry,
        "compaction": CompactionMetrics().registry,  # a job's, written to a file
    }


def exported(registry: CollectorRegistry) -> dict[str, str]:
    """Family name as queried (counters with ``_total``) -> type."""
    out: dict[str, str] = {}
    for metric in registry.collect():
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        out[name] = metric.type
    return out


def test_every_section_is_known() -> None:
    assert {s for s, *_ in documented()} == set(SECTIONS)


@pytest.mark.parametrize("service", [*SERVICES, "compaction"])
def test_docs_list_exactly_what_the_service_exports(service: str) -> None:
    wanted = {
        name: kind for section, name, kind, _by in documented() if service in SECTIONS[section]
    }
    have = exported(registries()[service])
    assert sorted(set(have) - set(wanted)) == [], f"exported by {service}, not in {DOC.name}"
    assert sorted(set(wanted) - set(have)) == [], f"in {DOC.name}, not exported by {service}"
    assert {n: k for n, k in have.items() if wanted[n] != k} == {}, "types differ"


def test_names_follow_the_conventions() -> None:
    for _section, name, kind, _by in documented():
        if not name.startswith("bookline_"):
            continue
        assert (kind == "counter") == name.endswith("_total"), name
        assert not name.endswith(("_milliseconds", "_ms", "_fraction", "_percent")), name


def test_named_tests_exist() -> None:
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    for _section, name, _kind, by in documented():
        if by in ("workload", "present"):
            continue
        assert re.search(rf"def {re.escape(by)}\(", sources), (name, by)


def test_monitoring_kit_uses_documented_families() -> None:
    names = {name for _s, name, _k, _b in documented()}
    bases = {n.removesuffix("_total") for n in names} | names
    kit = ROOT / "ops" / "monitoring"
    files = sorted(p for p in kit.rglob("*") if p.is_file())
    assert files, kit
    for path in files:
        for used in set(re.findall(r"\b(?:bookline|process|python)_[a-z_]+", path.read_text())):
            base = re.sub(r"_(bucket|sum|count)$", "", used)
            assert used in bases or base in bases, (path.name, used)


def test_alert_rules_and_dashboard_parse() -> None:
    import json

    import yaml

    kit = ROOT / "ops" / "monitoring"
    rules = yaml.safe_load((kit / "bookline-alerts.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    assert len(alerts) >= 10
    for rule in alerts:
        assert set(rule) >= {"alert", "expr", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("page", "warn"), rule
        assert rule["annotations"]["summary"], rule
    scrape = yaml.safe_load((kit / "prometheus.yml").read_text())
    assert scrape["rule_files"] == ["bookline-alerts.yml"]
    dashboard = json.loads((kit / "grafana-dashboard.json").read_text())
    assert all(t["expr"] for p in dashboard["panels"] for t in p["targets"])
