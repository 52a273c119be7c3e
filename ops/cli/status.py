"""``bookline status``: the cluster's health at a glance.

One look at ZooKeeper and the metadata it holds, plus what ``cluster.json`` knows:

* **ZooKeeper** -- each server's mode (standalone, leader, follower) from ``srvr``, or
  down;
* **bookies** -- writable, read-only (and whether an operator set it) or down, with disk
  use. *Down* is a bookie that has a cookie (it joined once) or that ``cluster.json``
  lists, but is not registered; a local cluster's supervisor says it at once, with the
  exit status, before its ZooKeeper session expires;
* **ledgers** -- how many are under-replicated, and being repaired right now;
* **autorecovery** -- enabled or paused, the elected auditor, the local processes;
* **proxies** -- every registered write and read proxy, its ``/health`` state, and how
  many streams and consumer-group logs (``g~group``) each write proxy owns.

``--json`` prints the same as one object. Exit status 0 when all is well, 3
(:data:`ops.cli.common.EXIT_FOUND`) when something is down, read-only, under-replicated
or paused -- so a script or a cron job can act on it -- and 5 when nothing answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from foundation import tls
from ops.cli.common import (
    EXIT_FOUND,
    EXIT_OK,
    add_cluster_flags,
    open_metadata,
    require_cluster,
    table,
)

if TYPE_CHECKING:
    from foundation.cluster_file import ClusterFile
    from metadata.client import MetadataClient

__all__ = ["gather", "register"]

# Owner records read at once when counting what each write proxy owns.
OWNER_READS_IN_FLIGHT_MAX: Final = 64
# A proxy's /health gets this long to answer (it is in memory: milliseconds).
HEALTH_TIMEOUT_S: Final = 2.0
READ_PREFIX: Final = "read@"  # httpapi.proxy_config.READ_PROXY_PREFIX


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="cluster health at a glance (exit 3 if something is wrong)")
    add_cluster_flags(p, token=False)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    cluster = require_cluster(args)
    status = asyncio.run(_gather(args, cluster))
    if args.json:
        print(json.dumps(status, sort_keys=True, default=str))
    else:
        _show(status)
    return EXIT_OK if not status["problems"] else EXIT_FOUND


async def _gather(args: argparse.Namespace, cluster: ClusterFile) -> dict[str, Any]:
    async with open_metadata(args) as md:
        return await gather(md, cluster)


# -- gathering -------------------------------------------------------------------------


def _srvr_mode(address: str) -> str:
    from ops.cluster.zookeeper import four_letter_word

    host, _sep, port = address.rpartition(":")
    answer = four_letter_word(host or "127.0.0.1", int(port), "srvr", timeout_s=1.0)
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0):
            return "up (srvr not allowed)" if not answer else "not serving"
    except OSError:
        return "down"


async def _zookeeper(cluster: ClusterFile) -> list[dict[str, Any]]:
    listed = cluster.raw.get("zookeepers") or []
    addresses = [str(z.get("address")) for z in listed if isinstance(z, dict)]
    if not addresses:
        addresses = [h.strip() for h in cluster.zk.split("/", 1)[0].split(",") if h.strip()]
    modes = await asyncio.gather(*(asyncio.to_thread(_srvr_mode, a) for a in addresses))
    return [
        {"address": a, "mode": m, "state": "down" if m == "down" else "up"}
        for a, m in zip(addresses, modes, strict=True)
    ]


def _listed(cluster: ClusterFile, key: str) -> dict[str, dict[str, Any]]:
    entries = cluster.raw.get(key) or []
    return {str(e["id"]): e for e in entries if isinstance(e, dict) and "id" in e}


async def _bookies(md: MetadataClient, cluster: ClusterFile) -> list[dict[str, Any]]:
    from foundation.errors import NotFoundError
    from metadata.bookies import READONLY

    registered = await md.bookies.list_info()
    known: set[str] = set()
    with contextlib.suppress(NotFoundError):  # every bookie that ever joined has a cookie
        known = set(await md.zk.get_children(md.layout.cookies))
    listed = _listed(cluster, "bookies")
    ids = sorted(set(registered) | set(listed) | known, key=_natural)
    rows = []
    for bookie_id in ids:
        info = registered.get(bookie_id)
        local = listed.get(bookie_id, {})
        forced = await md.zk.exists(md.layout.bookie_forced_readonly(bookie_id)) is not None
        row: dict[str, Any] = {"id": bookie_id, "forced_readonly": forced}
        if local.get("state") == "down" or info is None:
            row["state"] = "down"
            if "exit_status" in local:
                row["exit_status"] = local["exit_status"]
                row["exited_at"] = local.get("exited_at", "")
            row["address"] = local.get("address", "")
        else:
            row["state"] = "readonly" if info.state == READONLY else "writable"
            row.update(
                address=info.address,
                disk_used=round(info.disk_usage, 4),
                free_bytes=info.free_bytes,
                total_bytes=info.total_bytes,
                rack=info.rack,
            )
        if local.get("state") == "starting":
            row["state"] = "starting"
        rows.append(row)
    return rows


async def _autorecovery(md: MetadataClient, cluster: ClusterFile) -> dict[str, Any]:
    from ledger.auditor import current_leader

    processes = []
    for p in _listed(cluster, "autorecovery").values():
        row = {"id": p["id"], "pid": p.get("pid"), "state": p.get("state", "running")}
        if p.get("url") and row["state"] == "running":
            row["health"], row["why"] = await _health(str(p["url"]))
        processes.append(row)
    return {
        "enabled": await md.underreplicated.replication_enabled(),
        "auditor": await current_leader(md),
        "repairing": sorted((await md.underreplicated.list_claims()).items()),
        "processes": processes,
    }


async def _owners(md: MetadataClient) -> tuple[dict[str, int], dict[str, int]]:
    """Streams and group logs (``g~``) owned, per write proxy id."""
    from foundation.errors import NotFoundError

    streams: dict[str, int] = {}
    groups: dict[str, int] = {}
    pairs: list[tuple[str, str]] = []
    with contextlib.suppress(NotFoundError):
        for ns in await md.zk.get_children(md.layout.owners):
            with contextlib.suppress(NotFoundError):
                pairs += [(ns, s) for s in await md.zk.get_children(f"{md.layout.owners}/{ns}")]
    slots = asyncio.Semaphore(OWNER_READS_IN_FLIGHT_MAX)

    async def one(ns: str, stream: str) -> None:
        async with slots:
            record = await md.proxies.get_owner(ns, stream)
        if record is not None:
            counts = groups if stream.startswith("g~") else streams
            counts[record.proxy_id] = counts.get(record.proxy_id, 0) + 1

    await asyncio.gather(*(one(ns, s) for ns, s in pairs))
    return streams, groups


async def _health(url: str) -> tuple[str, str]:
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(
                timeout=timeout,
                # https proxies (`local --tls`) chain to the [tls] CA, not the system's
                connector=aiohttp.TCPConnector(ssl=tls.client_context() or True),
            ) as session,
            session.get(url.rstrip("/") + "/health") as resp,
        ):
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return "down", f"/health: {type(exc).__name__}"
    if isinstance(body, dict) and "state" in body:
        return str(body["state"]), str(body.get("why", ""))
    return "up", ""


async def _proxies(md: MetadataClient, cluster: ClusterFile) -> list[dict[str, Any]]:
    registered = await md.proxies.list()
    streams, groups = await _owners(md)
    rows: list[dict[str, Any]] = []
    seen_urls = set()
    for proxy_id, info in sorted(registered.items(), key=lambda kv: _natural(kv[0])):
        kind = "read" if proxy_id.startswith(READ_PREFIX) else "write"
        state, why = await _health(info.address)
        seen_urls.add(info.address.rstrip("/"))
        row: dict[str, Any] = {
            "id": proxy_id.removeprefix(READ_PREFIX),
            "kind": kind,
            "url": info.address,
            "state": state,
            "why": why,
        }
        if kind == "write":
            row.update(streams=streams.get(proxy_id, 0), groups=groups.get(proxy_id, 0))
        rows.append(row)
    for key, kind in (("write_proxies", "write"), ("read_proxies", "read")):
        for entry in _listed(cluster, key).values():
            url = str(entry.get("url", "")).rstrip("/")
            if url and url not in seen_urls:  # listed by `bookline local`, not registered
                row = {"id": entry["id"], "kind": kind, "url": url, "state": "down", "why": ""}
                if "exit_status" in entry:
                    row["exit_status"] = entry["exit_status"]
                rows.append(row)
    return rows


def _problems(status: dict[str, Any]) -> list[str]:
    out = [f"ZooKeeper {z['address']} is down" for z in status["zookeeper"] if z["state"] == "down"]
    for b in status["bookies"]:
        if b["state"] != "writable":
            out.append(f"bookie {b['id']} is {b['state']}")
    if status["underreplicated"]:
        out.append(f"{status['underreplicated']} ledgers are under-replicated")
    ar = status["autorecovery"]
    if not ar["enabled"]:
        out.append("re-replication is paused (`bookline autorecovery enable` resumes it)")
    if ar["auditor"] is None:
        out.append("no autorecovery auditor is running: lost bookies go unnoticed")
    out += [
        f"{p['kind']} proxy {p['id']} is {p['state']}"
        for p in status["proxies"]
        if p["state"] not in ("ok", "up")
    ]
    return out


async def gather(md: MetadataClient, cluster: ClusterFile) -> dict[str, Any]:
    """Everything ``bookline status`` shows, as one JSON-able object."""
    info = await md.cluster.read()
    status: dict[str, Any] = {
        "cluster": {
            "file": cluster.path,
            "zk": cluster.zk,
            "root": cluster.root,
            "instance_id": info.instance_id,
            "state": cluster.raw.get("state", "running"),
        },
        "zookeeper": await _zookeeper(cluster),
        "bookies": await _bookies(md, cluster),
        "underreplicated": len(await md.underreplicated.list()),
        "autorecovery": await _autorecovery(md, cluster),
        "proxies": await _proxies(md, cluster),
    }
    status["problems"] = _problems(status)
    return status


# -- showing -----------------------------------------------------------------------------


def _natural(text: str) -> tuple[object, ...]:
    """'bookie-10' after 'bookie-9'."""
    head, _sep, tail = text.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (text, 0)


def _size(n: object) -> str:
    if not isinstance(n, int):
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


def _bookie_cells(b: dict[str, Any]) -> Iterable[object]:
    from ops.cluster.supervisor import describe_exit

    state = b["state"] + (" (by operator)" if b.get("forced_readonly") else "")
    if "exit_status" in b and b["state"] == "down":
        state += f": {describe_exit(int(b['exit_status']))}"
    disk = f"{b['disk_used']:.1%}" if "disk_used" in b else ""
    free = f"{_size(b.get('free_bytes'))} of {_size(b.get('total_bytes'))}" if disk else ""
    return (b["id"], state, b.get("address", ""), disk, free)


def _show(status: dict[str, Any]) -> None:
    c = status["cluster"]
    print(f"cluster {c['instance_id']} at {c['zk']}{c['root']} ({c['file']})")
    table("ZooKeeper", ("server", "state", "mode"),
          [(z["address"], z["state"], z["mode"]) for z in status["zookeeper"]])  # fmt: skip
    table("bookies", ("bookie", "state", "address", "disk used", "free"),
          [tuple(_bookie_cells(b)) for b in status["bookies"]])  # fmt: skip
    ar = status["autorecovery"]
    repairing = ", ".join(f"{lid} ({w})" for lid, w in ar["repairing"]) or "none"
    processes = ", ".join(
        f"{p['id']} {p['state']}" + (f" ({p['health']})" if p.get("health") else "")
        for p in ar["processes"]
    )
    table(
        "ledgers and autorecovery",
        ("what", "value"),
        [
            ("under-replicated ledgers", status["underreplicated"]),
            ("being repaired", repairing),
            ("re-replication", "enabled" if ar["enabled"] else "PAUSED"),
            ("auditor", ar["auditor"] or "none"),
            *([("processes (local)", processes)] if processes else []),
        ],
    )
    table(
        "proxies",
        ("proxy", "kind", "state", "url", "streams", "groups"),
        [
            (p["id"], p["kind"], p["state"] + (f": {p['why']}" if p.get("why") else ""),
             p["url"], p.get("streams", ""), p.get("groups", ""))
            for p in status["proxies"]
        ],
    )  # fmt: skip
    if status["problems"]:
        print("problems:")
        for problem in status["problems"]:
            print(f"  - {problem}")
    else:
        print("all well")
