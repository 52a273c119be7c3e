"""``bookline subscription list|show|commit``: named read positions of a stream (the
core library's subscriptions, ``Namespace.commit``), through a read proxy.

* ``list STREAM`` -- every subscriber with its committed DLSN, next to the stream's
  last DLSN;
* ``show STREAM NAME`` -- one subscriber's committed DLSN (none: it never committed);
* ``commit STREAM NAME DLSN`` -- move it forward (never back: an older position is
  refused by the store and reported, as a slow consumer's late commit would be).

Consumer groups of topics keep their offsets elsewhere: ``bookline group describe``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from foundation.errors import NotFoundError
from foundation.names import validate_name
from ops.cli.common import add_cluster_flags, emit, require_cluster, table

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("subscription", help="a stream's named read positions")
    ops = p.add_subparsers(dest="sub_op", metavar="OP", required=True)
    ls = ops.add_parser("list", help="subscribers of a stream and their positions")
    show = ops.add_parser("show", help="one subscriber's committed position")
    commit = ops.add_parser("commit", help="move a subscriber's position forward")
    for q in (ls, show, commit):
        q.add_argument("stream", help="stream name")
    for q in (show, commit):
        q.add_argument("name", help="subscriber name")
    commit.add_argument("dlsn", help="position, seg:entry:slot (as `stream read --json` shows)")
    for q in (ls, show, commit):
        add_cluster_flags(q)
        q.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    require_cluster(args)
    validate_name(args.stream, "stream name")
    if getattr(args, "name", None) is not None:
        validate_name(args.name, "subscriber")
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    from httpapi.positions import parse_dlsn
    from streams.dlsn import DLSN
    from thinclient.client import ProxyClient

    async with ProxyClient.from_cluster_file(args.cluster) as client:
        if args.sub_op == "commit":
            dlsn = DLSN(*parse_dlsn(args.dlsn))
            advanced = await client.commit(args.stream, args.name, dlsn)
            now = await client.committed(args.stream, args.name)
            emit(
                {"stream": args.stream, "subscriber": args.name, "requested": str(dlsn),
                 "committed": str(now) if now else None, "advanced": advanced},
                args.json,
                _show_commit,
            )  # fmt: skip
            return 0
        names = await client.list_subscribers(args.stream)
        if args.sub_op == "show":
            if args.name not in names:
                raise NotFoundError(f"no subscriber {args.name} of stream {args.stream}")
            names = [args.name]
        positions = await asyncio.gather(*(client.committed(args.stream, n) for n in names))
        last_dlsn = (await client.stream_info(args.stream)).last_dlsn
        last = None if last_dlsn is None else str(last_dlsn)
    rows = [
        {"subscriber": n, "committed": str(p) if p else None}
        for n, p in zip(names, positions, strict=True)
    ]
    emit({"stream": args.stream, "last_dlsn": last, "subscribers": rows}, args.json, _show)
    return 0


def _show(obj: dict[str, Any]) -> None:
    table(
        f"subscribers of {obj['stream']} (last DLSN {obj['last_dlsn']})",
        ("subscriber", "committed"),
        [(r["subscriber"], r["committed"] or "(never committed)") for r in obj["subscribers"]],
    )


def _show_commit(obj: dict[str, Any]) -> None:
    if obj["advanced"]:
        print(f"{obj['subscriber']} on {obj['stream']} now at {obj['committed']}")
    else:
        print(
            f"{obj['subscriber']} on {obj['stream']} stays at {obj['committed']}: "
            f"already at or past {obj['requested']}"
        )
