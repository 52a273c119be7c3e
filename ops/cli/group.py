"""``bookline group ...``: consumer groups through their coordinators (the write proxies).

``--cluster DIR/cluster.json`` (or ``BOOKLINE_CLUSTER``) says where the proxies are;
every command prints readable tables, or the coordinator's answer as JSON with ``--json``.

* ``list`` -- the namespace's groups with state, members, generation and total lag;
* ``describe GROUP`` -- members (ids, instance ids, assignment), generation, assignor,
  and per partition the committed offset, end offset and lag;
* ``reset-offsets GROUP --to-earliest | --to-latest | --to-datetime TIME | --to-offset N
  [--topic T ...] [--execute]`` -- shows the plan (a dry run, as Kafka's tool) and applies
  it only with ``--execute``; an offset past a partition's end is clamped to the end and
  the plan says so; refused (GROUP_NOT_EMPTY) while the group has live members, as Kafka
  does; without ``--topic``, every topic the group knows;
* ``delete GROUP`` -- the group and its committed offsets (also refused while members live).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from foundation.errors import BadRequestError, BooklineError, ConfigError
from foundation.names import validate_name

if TYPE_CHECKING:
    from groups.coordinator_client import CoordinatorClient
    from groups.wire import ResetPlan

ENV_CLUSTER = "BOOKLINE_CLUSTER"
# `group list` describes this many groups at once (each may load a coordinator).
DESCRIBES_CONCURRENT = 8


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("group", help="list, describe, reset the offsets of, delete consumer groups")
    ops = p.add_subparsers(dest="group_op", metavar="OP", required=True)

    def add(name: str, help_text: str, with_group: bool = True) -> argparse.ArgumentParser:
        q = ops.add_parser(name, help=help_text)
        q.add_argument(
            "--cluster",
            default=os.environ.get(ENV_CLUSTER),
            help=f"cluster.json of a running cluster (default ${ENV_CLUSTER})",
        )
        q.add_argument("--json", action="store_true", help="print JSON instead of tables")
        if with_group:
            q.add_argument("group", help="consumer group name")
        q.set_defaults(handler=_run)
        return q

    add("list", "groups with their state, members, generation and lag", with_group=False)
    add("describe", "members, assignment, generation, committed offsets and lag")
    r = add("reset-offsets", "set committed offsets (only while the group has no live members)")
    to = r.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the oldest offset kept")
    to.add_argument("--to-latest", action="store_true", help="the end (skip everything)")
    to.add_argument(
        "--to-datetime",
        metavar="TIME",
        help="the first record at or after TIME: ISO 8601 (2026-01-31T12:00:00Z; without a "
        "zone: local time) or milliseconds since the epoch",
    )
    to.add_argument("--to-offset", metavar="N", type=int, help="offset N of every partition")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument(
        "--execute", action="store_true", help="apply the plan (default: only show it)"
    )
    mode.add_argument(
        "--dry-run", action="store_true", help="only show the plan (the default, as Kafka's tool)"
    )
    r.add_argument(
        "--topic",
        action="append",
        dest="topics",
        metavar="T",
        help="only this topic (repeatable; default: every topic the group knows)",
    )
    add("delete", "delete the group and its committed offsets")


def _run(args: argparse.Namespace) -> int:
    if not args.cluster:
        raise ConfigError(f"say where the cluster is: --cluster DIR/cluster.json or ${ENV_CLUSTER}")
    if getattr(args, "group", None) is not None:
        validate_name(args.group, "group")
    for topic in getattr(args, "topics", None) or ():
        validate_name(topic, "topic")
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


async def _main(args: argparse.Namespace) -> int:
    # aiohttp and the thin client: only when a command runs.
    from groups.coordinator_client import CoordinatorClient
    from thinclient.client import ProxyClient

    async with ProxyClient.from_cluster_file(args.cluster) as client:
        cc = CoordinatorClient.of(client)
        op = args.group_op
        if op == "list":
            await _list(cc, args.json)
        elif op == "describe":
            answer = await cc.describe(args.group)
            _emit(answer, args.json, _describe_tables)
        elif op == "reset-offsets":
            to, value = reset_target(args)
            plan = await cc.plan_reset(args.group, to, value, args.topics, dry_run=not args.execute)
            _emit(reset_answer(args.group, plan, value), args.json, _reset_tables)
        else:
            await cc.delete(args.group)
            _emit({"deleted": args.group}, args.json, lambda a: [f"deleted group {a['deleted']}"])
    return 0


def reset_target(args: argparse.Namespace) -> tuple[str, int | None]:
    """(to, value) of the coordinator's reset request from the flags."""
    if args.to_earliest:
        return "earliest", None
    if args.to_latest:
        return "latest", None
    if args.to_offset is not None:
        if args.to_offset < 0:
            raise BadRequestError(f"--to-offset {args.to_offset} is negative")
        return "offset", args.to_offset
    return "datetime", parse_datetime_ms(args.to_datetime)


def reset_answer(group: str, plan: ResetPlan, asked: int | None) -> dict[str, Any]:
    """The reset's plan as the CLI prints it: each partition's new offset, and a note
    where an asked offset past the partition's end was clamped to the end."""
    rows = []
    for (t, p), o in sorted(plan.offsets.items()):
        clamped = (t, p) in plan.clamped
        note = f"offset {asked} is past the end: clamped to the end {o}" if clamped else ""
        rows.append({"topic": t, "partition": p, "offset": o, "clamped": clamped, "note": note})
    return {"group": group, "executed": not plan.dry_run, "offsets": rows}


def parse_datetime_ms(text: str) -> int:
    """ISO 8601 (local time without a zone, as Kafka's tools) or ms since the epoch."""
    if text.isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise BadRequestError(
            f"--to-datetime {text!r}: not ISO 8601 (2026-01-31T12:00:00Z) nor milliseconds"
        ) from exc
    if when.tzinfo is None:
        when = when.astimezone()  # local time
    return int(when.timestamp() * 1000)


async def _list(cc: CoordinatorClient, as_json: bool) -> None:
    names = await cc.list_groups()
    limit = asyncio.Semaphore(DESCRIBES_CONCURRENT)

    async def one(group: str) -> dict[str, Any]:
        async with limit:
            try:
                return await cc.describe(group)
            except BooklineError as exc:  # one group's failure must not hide the others
                return {"group": group, "error": f"{exc.name} ({exc.code}): {exc.message}"}

    described = await asyncio.gather(*(one(g) for g in names))
    _emit({"groups": list(described)}, as_json, _list_tables)


# -- output ------------------------------------------------------------------------------

Table = tuple[str, Sequence[str], list[Sequence[object]]]


def _emit(answer: dict[str, Any], as_json: bool, tables: Any) -> None:
    if as_json:
        print(json.dumps(answer, indent=2, default=str))
        return
    for item in tables(answer):
        if isinstance(item, str):
            print(item)
        else:
            _print_table(*item)


def _list_tables(answer: dict[str, Any]) -> list[Table | str]:
    rows: list[Sequence[object]] = []
    for g in answer["groups"]:
        if "error" in g:
            rows.append([g["group"], "error", "", "", "", g["error"]])
            continue
        rows.append(
            [g["group"], g["state"], len(g["members"]), g["generation"], g["lag"], g["coordinator"]]
        )
    if not rows:
        return ["no consumer groups"]
    return [("", ["GROUP", "STATE", "MEMBERS", "GENERATION", "LAG", "COORDINATOR"], rows)]


def _describe_tables(d: dict[str, Any]) -> list[Table | str]:
    head = (
        f"group {d['group']}: {d['state']}, generation {d['generation']}, "
        f"assignor {d['assignor'] or '-'}, coordinator {d['coordinator']}, lag {d['lag']}"
    )
    members: list[Sequence[object]] = [
        [
            m["member_id"],
            m["instance_id"] or "-",
            ",".join(m["topics"]),
            _tps(m["assignment"]),
            _tps(m["consuming"]),
        ]
        for m in d["members"]
    ]
    partitions: list[Sequence[object]] = [
        [
            p["topic"],
            p["partition"],
            _dash(p["committed"]),
            _dash(p["end"]),
            _dash(p["lag"]),
            p["member_id"] or "-",
        ]
        for p in d["partitions"]
    ]
    out: list[Table | str] = [head]
    if members:
        out.append(
            ("members", ["MEMBER", "INSTANCE", "TOPICS", "ASSIGNMENT", "CONSUMING"], members)
        )
    else:
        out.append("no live members")
    if partitions:
        out.append(
            ("offsets", ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "MEMBER"], partitions)
        )
    return out


def _reset_tables(answer: dict[str, Any]) -> list[Table | str]:
    rows: list[Sequence[object]] = [
        [o["topic"], o["partition"], o["offset"], o["note"]] for o in answer["offsets"]
    ]
    if answer["executed"]:
        title, tail = f"group {answer['group']}: new offsets", []
    else:
        title = f"group {answer['group']}: plan (dry run, nothing changed)"
        tail = ["add --execute to apply it"]
    return [(title, ["TOPIC", "PARTITION", "NEW-OFFSET", "NOTE"], rows), *tail]


def _tps(tps: Sequence[Sequence[object]]) -> str:
    """[[t, 0], [t, 1], [u, 3]] -> 't:0-1 u:3' (ranges per topic, readable)."""
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(str(t), []).append(int(str(p)))
    parts = []
    for topic, ps in sorted(by_topic.items()):
        ps.sort()
        runs: list[str] = []
        start = prev = ps[0]
        for p in ps[1:]:
            if p != prev + 1:
                runs.append(str(start) if start == prev else f"{start}-{prev}")
                start = p
            prev = p
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        parts.append(f"{topic}:{','.join(runs)}")
    return " ".join(parts) or "-"


def _dash(value: object) -> object:
    return "-" if value is None else value


def _print_table(title: str, columns: Sequence[str], rows: list[Sequence[object]]) -> None:
    """A table with ``rich`` when it is installed, plain aligned columns otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table as RichTable
    except ImportError:
        _print_plain(title, columns, rows)
        return
    table = RichTable(title=title or None, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def _print_plain(title: str, columns: Sequence[str], rows: list[Sequence[object]]) -> None:
    cells = [list(columns), *([str(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    if title:
        print(title)
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
