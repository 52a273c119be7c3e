"""``bookline ledger ...`` and ``bookline underreplicated list``: ledgers as the
metadata and the bookies hold them (an operator's view below streams).

* ``ledger list [--stream NAME] [--limit N]`` -- id, state, E/Qw/Qa, last entry, size,
  the bookies of its last ensemble, the stream it belongs to and its role there: a
  ``segment``, a live writer's ``spare`` (created in advance for its next segment), or an
  ``orphan`` a dead writer left (the elected auditor deletes it, ``ledger.orphans``);
* ``ledger show ID`` -- everything the metadata says (ensembles per segment with their
  bookies, quorums, digest, custom tags) plus, for an open ledger, its last add
  confirmed asked of the bookies, and whether it is under-replicated;
* ``ledger read ID [--from N] [--to N] [--out FILE]`` -- raw entries (the digest
  verified; payloads as the writer packed them, e.g. record sets of a stream):
  ``entry<TAB>bytes<TAB>base64`` per line, JSON lines with ``--json``, or the bare
  payloads concatenated into ``--out FILE`` (with a progress bar on a terminal). Never
  recovers or fences the ledger: an open ledger is read up to its last add confirmed;
* ``underreplicated list`` -- the autorecovery work items: ledger, missing bookies,
  entries to repair, since when, and the worker holding it.

Every command takes ``--cluster`` (or ``$BOOKLINE_CLUSTER``) and ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

from foundation.errors import BadRequestError, NoLedgerError, NotFoundError
from ops.cli.common import add_cluster_flags, emit, open_metadata, table
from ops.cluster.client_env import use_cluster_credentials
from ops.progress import progress

if TYPE_CHECKING:
    from ledger.client import LedgerClient
    from metadata.client import MetadataClient
    from metadata.ledger_metadata import LedgerMetadata

__all__ = ["ledger_view", "register"]

# `ledger list` reads this many ledgers' metadata at once.
METADATA_READS_IN_FLIGHT_MAX: Final = 32
# ... and lists at most this many unless --limit says otherwise.
LIST_LIMIT_DEFAULT: Final = 1_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ledger", help="list, show and read ledgers (below streams)")
    ops = p.add_subparsers(dest="ledger_op", metavar="OP", required=True)
    ls = ops.add_parser("list", help="ledgers with state, quorums, size and bookies")
    ls.add_argument("--stream", help="only the ledgers of this stream (namespace/stream or stream)")
    ls.add_argument("--limit", type=int, default=LIST_LIMIT_DEFAULT, help="at most N ledgers")
    show = ops.add_parser("show", help="a ledger's metadata, ensembles and last entry")
    show.add_argument("ledger_id", type=int, metavar="ID")
    read = ops.add_parser("read", help="a ledger's raw entries (never fences it)")
    read.add_argument("ledger_id", type=int, metavar="ID")
    read.add_argument("--from", dest="first", type=int, default=0, help="first entry (0)")
    read.add_argument("--to", dest="last", type=int, default=None, help="last entry (the end)")
    read.add_argument("--out", type=Path, help="write the payloads, concatenated, to this file")
    for q in (ls, show, read):
        add_cluster_flags(q)
        q.set_defaults(handler=_run)

    u = sub.add_parser("underreplicated", help="ledgers autorecovery still has to repair")
    u_ops = u.add_subparsers(dest="ur_op", metavar="OP", required=True)
    ul = u_ops.add_parser("list", help="missing bookies, entries to repair, claims")
    add_cluster_flags(ul, token=False)
    ul.set_defaults(handler=_run_underreplicated)


def _run(args: argparse.Namespace) -> int:
    use_cluster_credentials(args)
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    async with open_metadata(args) as md:
        if args.ledger_op == "list":
            rows = await _list(md, args.stream, args.limit)
            emit({"ledgers": rows}, args.json, _show_list)
        elif args.ledger_op == "show":
            emit(await _show(md, args.ledger_id), args.json, _show_one)
        else:
            return await _read(md, args)
    return 0


# -- views -------------------------------------------------------------------------------


def _iso(ms: int) -> str:
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def ledger_view(meta: LedgerMetadata) -> dict[str, Any]:
    """A ledger's metadata as plain JSON (no password)."""
    custom = {k: v.decode("utf-8", "replace") for k, v in meta.custom.items()}
    return {
        "ledger_id": meta.ledger_id,
        "state": meta.state.value,
        "ensemble_size": meta.ensemble_size,
        "write_quorum": meta.write_quorum,
        "ack_quorum": meta.ack_quorum,
        "digest_type": meta.digest_type.name.lower(),
        "last_entry_id": meta.last_entry_id,
        "length": meta.length,
        "ctime": _iso(meta.ctime_ms),
        "stream": custom.get("stream", ""),
        "custom": custom,
        "ensembles": [
            {"first_entry_id": s.first_entry_id, "bookies": list(s.bookies)} for s in meta.segments
        ],
    }


async def _read_meta(md: MetadataClient, ledger_id: int) -> LedgerMetadata:
    try:
        meta, _version = await md.ledgers.read(ledger_id)
    except NotFoundError as exc:
        raise NoLedgerError(f"ledger {ledger_id} does not exist") from exc
    return meta


async def _list(md: MetadataClient, stream: str | None, limit: int) -> list[dict[str, Any]]:
    from ledger.orphans import OrphanCollector

    ids = sorted(await md.ledgers.list_ledger_ids())
    slots = asyncio.Semaphore(METADATA_READS_IN_FLIGHT_MAX)

    async def one(ledger_id: int) -> LedgerMetadata | None:
        async with slots:
            try:
                meta, _version = await md.ledgers.read(ledger_id)
            except NotFoundError:
                return None  # deleted while we listed
        return meta

    metas = [m for m in await asyncio.gather(*(one(i) for i in ids)) if m is not None]
    if stream:
        wanted = (stream, f"default/{stream}")
        metas = [m for m in metas if ledger_view(m)["stream"] in wanted]
    # Each stream ledger's role there: segment, a live writer's spare, or an orphan.
    roles = OrphanCollector(md, min_age_ms=0, reads_in_flight_max=METADATA_READS_IN_FLIGHT_MAX)
    streams: dict[Any, Any] = {}  # each stream's segments, read once
    views = []
    for meta in metas[:limit]:
        view = ledger_view(meta)
        view["role"] = (await roles.role(meta, streams)).value
        views.append(view)
    return views


async def _show(md: MetadataClient, ledger_id: int) -> dict[str, Any]:
    meta = await _read_meta(md, ledger_id)
    view = ledger_view(meta)
    try:
        item = await md.underreplicated.get(ledger_id)
    except NotFoundError:
        view["underreplicated"] = None
    else:
        view["underreplicated"] = {
            "missing_bookies": sorted(item.missing_bookies),
            "since": _iso(item.ctime_ms),
        }
    if meta.state.value != "CLOSED":
        async with _ledger_client(md) as client:
            try:
                reader = await client.open_ledger(ledger_id, recover=False)
                view["last_add_confirmed"] = reader.last_add_confirmed
            except Exception as exc:  # noqa: BLE001 - shown, not fatal: the metadata stands
                view["last_add_confirmed"] = None
                view["lac_error"] = str(exc)
    return view


_LIST_COLUMNS = (
    "ledger", "state", "E/Qw/Qa", "last entry", "bytes", "bookies (last ensemble)", "stream",
    "role",
)  # fmt: skip


def _show_list(listed: dict[str, list[dict[str, Any]]]) -> None:
    rows = listed["ledgers"]
    table(
        f"{len(rows)} ledgers",
        _LIST_COLUMNS,
        [
            (
                r["ledger_id"],
                r["state"],
                f"{r['ensemble_size']}/{r['write_quorum']}/{r['ack_quorum']}",
                r["last_entry_id"] if r["state"] == "CLOSED" else "(open)",
                r["length"] if r["state"] == "CLOSED" else "",
                ", ".join(r["ensembles"][-1]["bookies"]),
                r["stream"],
                r["role"],
            )
            for r in rows
        ],
    )


def _show_one(v: dict[str, Any]) -> None:
    last = v["last_entry_id"] if v["state"] == "CLOSED" else v.get("last_add_confirmed")
    ur = v.get("underreplicated")
    table(
        f"ledger {v['ledger_id']}",
        ("what", "value"),
        [
            ("state", v["state"]),
            ("quorums", f"E={v['ensemble_size']} Qw={v['write_quorum']} Qa={v['ack_quorum']}"),
            ("digest", v["digest_type"]),
            ("last entry" if v["state"] == "CLOSED" else "last add confirmed", last),
            ("bytes", v["length"] if v["state"] == "CLOSED" else "(open)"),
            ("created", v["ctime"]),
            ("stream", v["stream"]),
            (
                "under-replicated",
                f"missing {', '.join(ur['missing_bookies']) or '-'} since {ur['since']}"
                if ur
                else "no",
            ),
            *([("error", v["lac_error"])] if v.get("lac_error") else []),
        ],
    )
    ends = [e["first_entry_id"] - 1 for e in v["ensembles"][1:]] + [None]
    table(
        "ensembles",
        ("entries", "bookies"),
        [
            (f"{e['first_entry_id']}..{'' if end is None else end}", ", ".join(e["bookies"]))
            for e, end in zip(v["ensembles"], ends, strict=True)
        ],
    )


# -- reading entries -----------------------------------------------------------------------


@asynccontextmanager
async def _ledger_client(md: MetadataClient) -> AsyncIterator[LedgerClient]:
    """A ledger client on ``md``'s session (the caller closes ``md``)."""
    from bookie.client import BookieClientPool
    from ledger.adapters import PoolTransport, ZkLedgerStore
    from ledger.client import LedgerClient
    from ledger.config import LedgerConfig
    from ledger.keys import bookie_identity

    identity = bookie_identity(LedgerConfig())
    store = ZkLedgerStore(md.ledgers, md.bookies, md.ledger_ids, identity=identity)
    pool = BookieClientPool(identity=identity)
    client = LedgerClient(store, PoolTransport(pool, store.address_of), on_close=pool.close)
    try:
        yield client
    finally:
        await client.close()


async def _read(md: MetadataClient, args: argparse.Namespace) -> int:
    meta = await _read_meta(md, args.ledger_id)
    async with _ledger_client(md) as client:
        reader = await client.open_ledger(args.ledger_id, recover=False)
        end = reader.last_add_confirmed if not meta.is_closed else meta.last_entry_id
        last = end if args.last is None else min(args.last, end)
        if args.first < 0:
            raise BadRequestError(f"--from {args.first} is negative")
        count = max(0, last - args.first + 1)
        out: BinaryIO | None = None
        if args.out is not None:
            out = await asyncio.to_thread(args.out.open, "wb")
        written = 0
        try:
            with progress(f"ledger {args.ledger_id}", total=count, unit="entries") as bar:
                async for entry in reader.iter_entries(args.first, last):
                    if out is not None:
                        written += await asyncio.to_thread(out.write, entry.payload)
                        bar.update(advance=1)
                    else:
                        sys.stdout.write(_entry_line(entry.entry_id, entry.payload, args.json))
        finally:
            if out is not None:
                await asyncio.to_thread(out.close)
    if out is not None:
        print(f"{count} entries ({written} bytes) of ledger {args.ledger_id} to {args.out}")
    return 0


def _entry_line(entry_id: int, payload: bytes, as_json: bool) -> str:
    data = base64.b64encode(payload).decode()
    if as_json:
        return json.dumps({"entry_id": entry_id, "bytes": len(payload), "payload_b64": data}) + "\n"
    return f"{entry_id}\t{len(payload)}\t{data}\n"


# -- under-replicated -----------------------------------------------------------------------


def _run_underreplicated(args: argparse.Namespace) -> int:
    return asyncio.run(_underreplicated(args))


async def _underreplicated(args: argparse.Namespace) -> int:
    async with open_metadata(args) as md:
        ur = md.underreplicated
        claims = await ur.list_claims()
        rows = []
        for ledger_id in sorted(await ur.list()):
            try:
                item = await ur.get(ledger_id)
            except NotFoundError:
                continue  # repaired while we listed
            rows.append(
                {
                    "ledger_id": ledger_id,
                    "missing_bookies": sorted(item.missing_bookies),
                    "repair_entries": {
                        b: [list(r) for r in rs] for b, rs in item.repair_entries.items()
                    },
                    "since": _iso(item.ctime_ms),
                    "worker": claims.get(ledger_id),
                }
            )
    emit({"ledgers": rows}, args.json, _show_underreplicated)
    return 0


def _show_underreplicated(listed: dict[str, list[dict[str, Any]]]) -> None:
    rows = listed["ledgers"]
    table(
        f"{len(rows)} under-replicated ledgers",
        ("ledger", "missing bookies", "entries to repair", "since", "being repaired by"),
        [
            (
                r["ledger_id"],
                ", ".join(r["missing_bookies"]),
                ", ".join(f"{b}: {len(rs)} ranges" for b, rs in r["repair_entries"].items()),
                r["since"],
                r["worker"] or "",
            )
            for r in rows
        ],
    )
