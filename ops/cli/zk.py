"""``bookline zk tree [PATH]``: the cluster's znodes, for debugging; ``bookline zk
restrict``: give every one the digest ACL of ``$BOOKLINE_METADATA_DIGEST_FILE``'s user
(``--parents``: the root's parents too, world-readable only).

Paths are under the cluster root (``bookline zk tree ledgers/underreplicated``); each
node shows its data size, whether it is ephemeral (and its session), and with
``--data`` its content: Bookline's own records (msgpack, :mod:`metadata.serde`) decoded
to JSON, other bytes as text when they are UTF-8, else hex. ``--depth`` and
``--nodes-max`` bound what is walked (a big cluster has millions of ledger nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any, Final

from ops.cli.common import add_cluster_flags, emit, open_metadata

if TYPE_CHECKING:
    from metadata.client import MetadataClient

__all__ = ["register"]

NODES_MAX_DEFAULT: Final = 500
DEPTH_DEFAULT: Final = 6
# Data shown per node at most (a ledger's metadata is a few hundred bytes).
DATA_CHARS_MAX: Final = 400


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("zk", help="look at the cluster's ZooKeeper nodes (debugging)")
    ops = p.add_subparsers(dest="zk_op", metavar="OP", required=True)
    t = ops.add_parser("tree", help="the znodes under the cluster root (or PATH below it)")
    t.add_argument("path", nargs="?", default="", help="below the root, e.g. bookies")
    t.add_argument("--depth", type=int, default=DEPTH_DEFAULT, help="levels to walk")
    t.add_argument("--nodes-max", type=int, default=NODES_MAX_DEFAULT, help="nodes to show")
    t.add_argument("--data", action="store_true", help="show each node's data")
    add_cluster_flags(t, token=False)
    t.set_defaults(handler=_run)
    r = ops.add_parser(
        "restrict",
        help="give every znode under the root the ACL of $BOOKLINE_METADATA_DIGEST_FILE's "
        "user alone (znodes made before the cluster had credentials)",
    )
    r.add_argument("--zk", help="ZooKeeper connect string (instead of --cluster)")
    r.add_argument("--root", help="cluster root with --zk (default /bookline)")
    r.add_argument(
        "--previous-digest-file",
        metavar="FILE",
        help="rotating the ZooKeeper password: the old credentials, whose znodes are "
        "handed over to $BOOKLINE_METADATA_DIGEST_FILE's user",
    )
    r.add_argument(
        "--parents",
        action="store_true",
        help="also the root's parents up to / (the world may only read them): for a "
        "ZooKeeper that serves this cluster alone",
    )
    add_cluster_flags(r, token=False)
    r.set_defaults(handler=_run_restrict)


def _run(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    async with open_metadata(args) as md:
        root = md.layout.root.rstrip("/")
        start = f"{root}/{args.path.strip('/')}" if args.path.strip("/") else root or "/"
        nodes: list[dict[str, Any]] = []
        await _walk(md, start, 0, args, nodes)
    emit({"root": start, "nodes": nodes}, args.json, _show)
    return 0


def _run_restrict(args: argparse.Namespace) -> int:
    return asyncio.run(_restrict(args))


async def _restrict(args: argparse.Namespace) -> int:
    """Every znode of the cluster admits only the credentials' user from now on
    (docs/security.md, ZooKeeper ACLs)."""
    async with open_metadata(args, previous_digest_file=args.previous_digest_file) as md:
        root = md.layout.root.rstrip("/") or "/"
        count = await md.zk.restrict_tree(root)
        parents = await md.zk.restrict_parents(root) if args.parents else 0
    view = {"root": root, "restricted": count, "parents": parents}
    emit(view, args.json, _show_restricted)
    return 0


def _show_restricted(view: dict[str, Any]) -> None:
    print(f"{view['restricted']} znodes under {view['root']} admit only the digest user now")
    if view["parents"]:
        print(f"{view['parents']} parents of {view['root']} admit only its changes now")


def _decode(data: bytes) -> object:
    import msgpack

    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
        json.dumps(value)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        pass
    else:
        return value
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()


async def _walk(
    md: MetadataClient, path: str, depth: int, args: argparse.Namespace, out: list[dict[str, Any]]
) -> None:
    from foundation.errors import NotFoundError

    if len(out) >= args.nodes_max:
        return
    try:
        data, stat = await md.zk.get_with_stat(path)
        children = await md.zk.get_children(path)
    except NotFoundError:
        if depth == 0:  # what was asked for does not exist: say so (exit 1)
            raise NotFoundError(f"no znode {path}") from None
        return  # gone while we walked
    node: dict[str, Any] = {
        "path": path,
        "depth": depth,
        "bytes": len(data),
        "children": len(children),
        "ephemeral_owner": f"0x{stat.ephemeral_owner:x}" if stat.ephemeral_owner else "",
    }
    if args.data and data:
        node["data"] = _decode(data)
    out.append(node)
    if depth >= args.depth:
        return
    for child in sorted(children):
        if len(out) >= args.nodes_max:
            out.append({"path": f"{path}/...", "depth": depth + 1, "truncated": True})
            return
        await _walk(md, f"{path.rstrip('/')}/{child}", depth + 1, args, out)


def _show(obj: dict[str, Any]) -> None:
    for node in obj["nodes"]:
        name = node["path"] if node["depth"] == 0 else node["path"].rsplit("/", 1)[1]
        indent = "  " * node["depth"]
        if node.get("truncated"):
            print(f"{indent}... (--nodes-max reached)")
            continue
        notes = []
        if node["bytes"]:
            notes.append(f"{node['bytes']} B")
        if node["ephemeral_owner"]:
            notes.append(f"ephemeral {node['ephemeral_owner']}")
        if (
            node["children"]
            and node["depth"]
            and not any(n["path"].startswith(node["path"] + "/") for n in obj["nodes"])
        ):
            notes.append(f"{node['children']} children")
        suffix = f"  ({', '.join(notes)})" if notes else ""
        print(f"{indent}{name}{suffix}")
        if "data" in node:
            text = json.dumps(node["data"], default=str)
            if len(text) > DATA_CHARS_MAX:
                text = text[:DATA_CHARS_MAX] + "..."
            print(f"{indent}  = {text}")
