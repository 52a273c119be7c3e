"""``bookline bookie list|info|readonly|writable`` and ``bookline cookie show``.

* ``bookie list`` -- every bookie the cluster knows (registered now, or holding a
  cookie: it joined once) with its state (writable, read-only, down), whether an
  operator holds it read-only, address, rack and disk use;
* ``bookie info ID`` -- the same for one bookie, its cookie, the ledgers whose ensembles
  name it (a scan of the ledger metadata) and the under-replicated ones missing it;
* ``bookie readonly ID`` / ``bookie writable ID`` -- hold a bookie read-only (it takes
  no new entries but serves reads and recovery: before a decommission, or to drain a
  disk) or let its disks decide again; the bookie follows a znode it watches, and the
  command waits up to ``--timeout`` to see the registry agree;
* ``bookie retire ID`` -- the end of a decommission: forget a bookie that is down and
  that no ledger names any more (its cookie and its read-only hold go from ZooKeeper),
  so no view lists it again; refused while it is registered, while a ledger's
  ensemble names it or a work item still waits for it. The retired bookie cannot
  rejoin on its old disks (its start refuses: they hold a cookie ZooKeeper does not);
  ``bookline local`` drops it from ``cluster.json`` and never starts it again;
* ``cookie show ID`` -- the cookie a bookie wrote at first start (cluster instance id
  and its three directories), checked against the cluster's instance id.

``bookie decommission`` and ``bookie scrub`` live in :mod:`ops.cli.autorecovery`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BadRequestError, NotFoundError
from ops.cli.common import add_cluster_flags, emit, open_metadata, sub_ops, table

if TYPE_CHECKING:
    from metadata.client import MetadataClient

__all__ = ["register"]

# How often `readonly`/`writable` look at the registry while waiting for the bookie.
REGISTRY_POLL_S: Final = 0.2


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """After ``bookie`` and its ``decommission``: adds operations to the same table."""
    bookie = sub.choices["bookie"]
    ops = sub_ops(bookie, "bookie_op")
    ls = ops.add_parser("list", help="every bookie: state, address, disk use")
    info = ops.add_parser("info", help="one bookie: state, cookie, the ledgers it holds")
    ro = ops.add_parser("readonly", help="hold a bookie read-only (no new entries)")
    rw = ops.add_parser("writable", help="release a held bookie (its disks decide again)")
    rt = ops.add_parser(
        "retire", help="forget a decommissioned, stopped bookie (its cookie and hold)"
    )
    for q in (info, ro, rw, rt):
        q.add_argument("bookie_id", metavar="ID", help="bookie id as registered")
    for q in (ls, info, ro, rw, rt):
        add_cluster_flags(q, token=False)
        q.set_defaults(handler=_run)

    cookie = sub.add_parser("cookie", help="bookie cookies (identity of a bookie's disks)")
    c_ops = cookie.add_subparsers(dest="cookie_op", metavar="OP", required=True)
    show = c_ops.add_parser("show", help="a bookie's cookie, checked against the cluster")
    show.add_argument("bookie_id", metavar="ID")
    add_cluster_flags(show, token=False)
    show.set_defaults(handler=_run_cookie)


def _run(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    async with open_metadata(args) as md:
        op = args.bookie_op
        if op == "list":
            emit({"bookies": await bookie_rows(md)}, args.json, _show_list)
        elif op == "info":
            emit(await _info(md, args.bookie_id), args.json, _show_info)
        elif op == "retire":
            emit(await _retire(md, args.bookie_id), args.json, _show_retire)
        else:
            row = await _hold(md, args.bookie_id, op == "readonly", args.timeout)
            emit(row, args.json, _show_hold)
    return 0


async def bookie_rows(md: MetadataClient) -> list[dict[str, Any]]:
    """Every known bookie as a row (registered ones first-class, the rest down)."""
    from metadata.bookies import READONLY

    registered = await md.bookies.list_info()
    try:
        known = set(await md.zk.get_children(md.layout.cookies))
    except NotFoundError:
        known = set()
    rows = []
    for bookie_id in sorted(set(registered) | known, key=_natural):
        info = registered.get(bookie_id)
        row: dict[str, Any] = {
            "id": bookie_id,
            "forced_readonly": await md.bookies.forced_read_only(bookie_id),
        }
        if info is None:
            row["state"] = "down"
        else:
            row.update(
                state="readonly" if info.state == READONLY else "writable",
                address=info.address,
                rack=info.rack,
                disk_used=round(info.disk_usage, 4),
                free_bytes=info.free_bytes,
                total_bytes=info.total_bytes,
                http=info.http_address,
            )
        rows.append(row)
    return rows


def _natural(text: str) -> tuple[object, ...]:
    head, _sep, tail = text.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (text, 0)


async def _info(md: MetadataClient, bookie_id: str) -> dict[str, Any]:
    from ledger.autorecovery import ledgers_on

    rows = {r["id"]: r for r in await bookie_rows(md)}
    if bookie_id not in rows:
        raise NotFoundError(f"no bookie {bookie_id!r}: not registered and no cookie")
    row = rows[bookie_id]
    row["cookie"] = await _cookie(md, bookie_id)
    row["ledgers"] = await ledgers_on(md, bookie_id)
    missing = []
    for ledger_id in await md.underreplicated.list():
        try:
            item = await md.underreplicated.get(ledger_id)
        except NotFoundError:
            continue
        if bookie_id in item.missing_bookies or bookie_id in item.repair_entries:
            missing.append(ledger_id)
    row["underreplicated_ledgers"] = missing
    return row


async def _retire(md: MetadataClient, bookie_id: str) -> dict[str, Any]:
    """Forget the bookie, or refuse (BAD_REQUEST) saying what still needs it."""
    from ledger.autorecovery import ledgers_on

    rows = {r["id"]: r for r in await bookie_rows(md)}
    if bookie_id not in rows:
        raise NotFoundError(f"no bookie {bookie_id!r}: not registered and no cookie")
    if rows[bookie_id]["state"] != "down":
        raise BadRequestError(
            f"bookie {bookie_id} is {rows[bookie_id]['state']}: decommission it, stop it, "
            "then retire it"
        )
    named = await ledgers_on(md, bookie_id)
    info = await _info(md, bookie_id)
    waiting = info["underreplicated_ledgers"]
    if named or waiting:
        raise BadRequestError(
            f"bookie {bookie_id} is still needed: {len(named)} ledgers name it "
            f"({_first(named)}), {len(waiting)} under-replicated ledgers wait for it "
            f"({_first(waiting)}); run `bookline bookie decommission {bookie_id}` first"
        )
    deleted = await md.bookies.forget(bookie_id)
    return {"id": bookie_id, "retired": True, "deleted": deleted}


def _first(ids: list[int], shown: int = 5) -> str:
    text = ", ".join(map(str, ids[:shown]))
    return text + (", ..." if len(ids) > shown else "") if ids else "none"


async def _hold(
    md: MetadataClient, bookie_id: str, read_only: bool, timeout_s: float
) -> dict[str, Any]:
    rows = {r["id"]: r for r in await bookie_rows(md)}
    if bookie_id not in rows:
        raise NotFoundError(f"no bookie {bookie_id!r}: not registered and no cookie")
    await md.bookies.set_forced_read_only(bookie_id, read_only)
    deadline = time.monotonic() + timeout_s
    want = "readonly" if read_only else "writable"
    row = rows[bookie_id]
    while row["state"] != want and row["state"] != "down" and time.monotonic() < deadline:
        await asyncio.sleep(REGISTRY_POLL_S)
        row = {r["id"]: r for r in await bookie_rows(md)}[bookie_id]
    row["requested"] = want
    return row


async def _cookie(md: MetadataClient, bookie_id: str) -> dict[str, Any] | None:
    try:
        cookie, version = await md.bookies.read_cookie(bookie_id)
    except NotFoundError:
        return None
    return {
        "instance_id": cookie.instance_id,
        "journal_dir": cookie.journal_dir,
        "ledgers_dir": cookie.ledgers_dir,
        "index_dir": cookie.index_dir,
        "version": version,
    }


def _run_cookie(args: argparse.Namespace) -> int:
    return asyncio.run(_cookie_main(args))


async def _cookie_main(args: argparse.Namespace) -> int:
    async with open_metadata(args) as md:
        cookie = await _cookie(md, args.bookie_id)
        if cookie is None:
            raise NotFoundError(f"bookie {args.bookie_id!r} has no cookie: it never started")
        cluster = await md.cluster.read()
        cookie["bookie_id"] = args.bookie_id
        cookie["cluster_instance_id"] = cluster.instance_id
        cookie["matches_cluster"] = cookie["instance_id"] == cluster.instance_id
    emit(cookie, args.json, _show_cookie)
    return 0


# -- showing -------------------------------------------------------------------------------


def _size(n: object) -> str:
    if not isinstance(n, int):
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _state(r: dict[str, Any]) -> str:
    return str(r["state"]) + (" (held by operator)" if r.get("forced_readonly") else "")


def _show_list(listed: dict[str, list[dict[str, Any]]]) -> None:
    rows = listed["bookies"]
    table(
        f"{len(rows)} bookies",
        ("bookie", "state", "address", "rack", "disk used", "free"),
        [
            (
                r["id"],
                _state(r),
                r.get("address", ""),
                r.get("rack", ""),
                f"{r['disk_used']:.1%}" if "disk_used" in r else "",
                f"{_size(r.get('free_bytes'))} of {_size(r.get('total_bytes'))}"
                if "free_bytes" in r
                else "",
            )
            for r in rows
        ],
    )


def _show_info(r: dict[str, Any]) -> None:
    cookie = r.get("cookie") or {}
    ledgers = r["ledgers"]
    shown = ", ".join(map(str, ledgers[:20]))
    if len(ledgers) > 20:
        shown += f" (+{len(ledgers) - 20})"
    dirs = " ".join(cookie.get(k, "") for k in ("journal_dir", "ledgers_dir", "index_dir"))
    under = ", ".join(map(str, r["underreplicated_ledgers"]))
    table(
        f"bookie {r['id']}",
        ("what", "value"),
        [
            ("state", _state(r)),
            ("address", r.get("address", "")),
            ("rack", r.get("rack", "")),
            ("disk used", f"{r['disk_used']:.1%}" if "disk_used" in r else ""),
            ("metrics / health", r.get("http", "")),
            ("cookie", cookie.get("instance_id", "none")),
            ("journal / ledgers / index", dirs),
            (f"ledgers naming it ({len(ledgers)})", shown or "none"),
            ("under-replicated for it", under or "none"),
        ],
    )


def _show_hold(r: dict[str, Any]) -> None:
    if r["state"] == r["requested"]:
        print(f"bookie {r['id']} is {_state(r)}")
    elif r["state"] == "down":
        print(f"bookie {r['id']} is down; it will be {r['requested']} when it starts")
    else:
        print(
            f"bookie {r['id']} asked to be {r['requested']}; still {r['state']} (the bookie "
            "applies it within a moment; a full disk keeps it read-only)"
        )


def _show_retire(r: dict[str, Any]) -> None:
    print(f"bookie {r['id']} retired: {', '.join(r['deleted']) or 'nothing was left'} deleted")


def _show_cookie(c: dict[str, Any]) -> None:
    table(
        f"cookie of {c['bookie_id']}",
        ("what", "value"),
        [
            ("cluster instance id", c["instance_id"]),
            ("matches this cluster", "yes" if c["matches_cluster"] else "NO"),
            ("journal dir", c["journal_dir"]),
            ("ledgers dir", c["ledgers_dir"]),
            ("index dir", c["index_dir"]),
            ("znode version", c["version"]),
        ],
    )
