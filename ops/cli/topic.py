"""``bookline topic ...`` and ``bookline produce``: topics through the write proxies
(the thin client). ``--cluster DIR/cluster.json`` (or ``BOOKLINE_CLUSTER``) says where
they are; ``--json`` prints one JSON object instead of a table.

* ``topic create NAME --partitions N [--retention-ms MS] [--retention-bytes B]
  [--segment-rollover-bytes B] [--segment-rollover-ms MS] [--ensemble-size E]
  [--write-quorum W] [--ack-quorum A]``
* ``topic list`` -- names and partition counts;
* ``topic describe NAME`` -- options, and per partition its start and end offsets,
  records, size and owning proxy;
* ``topic alter NAME --partitions N`` -- grow (never shrink);
* ``topic delete NAME``;
* ``produce TOPIC [--key K | --key-field F] [--header k=v ...] [--partition P]
  [--null-value LINE] [--timestamp MS]`` -- one record per stdin line; ``--key-field``
  reads each line as a JSON object and keys it by that field. ``--header`` repeats, in
  order, a name may come more than once (Kafka's headers), ``--header k`` without
  ``=`` gives ``k`` a null value; a line equal to ``--null-value`` is sent as a null
  value (a tombstone when keyed); ``--timestamp`` is every record's CreateTime (ms
  since the epoch; default: the log stamps it). Prints records per partition with
  their offset range; exits 1 if a record was refused, 6 if a record's outcome is
  unknown (retries ran out).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BadRequestError, BooklineError, ConfigError
from foundation.names import validate_name
from ops.cli.common import error_text, outcome_unknown, table, write_status
from ops.cli.parser import at_least

if TYPE_CHECKING:
    from thinclient.client import ProxyClient

ENV_CLUSTER: Final = "BOOKLINE_CLUSTER"
# Lines being produced at once; more wait (the client batches them into requests).
SENDS_OUTSTANDING_MAX: Final = 10_000
# Errors shown in full by `produce` (the rest are counted).
ERRORS_SHOWN_MAX: Final = 5
_OPTIONS: Final = (
    ("retention_ms", "drop sealed segments older than this"),
    ("retention_bytes", "keep at most this many bytes per partition"),
    ("segment_rollover_bytes", "roll a partition's segment past this size"),
    ("segment_rollover_ms", "roll a partition's segment past this age"),
    ("ensemble_size", "bookies per ledger (default: the proxy's)"),
    ("write_quorum", "copies of each entry"),
    ("ack_quorum", "copies acknowledged before a write is"),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("topic", help="create, list, describe, alter and delete topics")
    ops = p.add_subparsers(dest="topic_op", metavar="OP", required=True)

    def add(name: str, help_text: str, with_name: bool = True) -> argparse.ArgumentParser:
        q = ops.add_parser(name, help=help_text)
        _common(q)
        if with_name:
            q.add_argument("name", help="topic name")
        q.set_defaults(handler=_run)
        return q

    c = add("create", "create a topic of N partitions")
    c.add_argument("--partitions", type=at_least(1), required=True, help="partition count (>= 1)")
    for option, what in _OPTIONS:
        c.add_argument(f"--{option.replace('_', '-')}", type=int, default=None, help=what)
    add("list", "topics and their partition counts", with_name=False)
    add("describe", "options, and each partition's offsets, size and owner")
    a = add("alter", "grow a topic's partition count (never shrinks)")
    a.add_argument("--partitions", type=at_least(1), required=True, help="the new, larger count")
    add("delete", "delete a topic and its data")

    pr = sub.add_parser("produce", help="send stdin lines to a topic, one record each")
    _common(pr)
    pr.add_argument("topic", help="topic name")
    keys = pr.add_mutually_exclusive_group()
    keys.add_argument("--key", default=None, help="the key of every record")
    keys.add_argument(
        "--key-field", default=None, help="lines are JSON objects; key each by this field"
    )
    pr.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="K=V",
        help="a header (repeatable, in order, names may repeat; K alone: a null value)",
    )
    pr.add_argument("--partition", type=int, default=None, help="send every record here")
    pr.add_argument(
        "--null-value", default=None, metavar="LINE", help="send lines equal to LINE as null"
    )
    pr.add_argument(
        "--timestamp", type=at_least(0), default=None, metavar="MS", help="records' CreateTime"
    )
    pr.set_defaults(handler=_run_produce)


def _common(q: argparse.ArgumentParser) -> None:
    q.add_argument(
        "--cluster",
        default=os.environ.get(ENV_CLUSTER),
        help=f"cluster.json of a running cluster (default ${ENV_CLUSTER})",
    )
    q.add_argument("--json", action="store_true", help="print one JSON object")


def _check_cluster(args: argparse.Namespace) -> None:
    if not args.cluster:
        raise ConfigError(f"say where the cluster is: --cluster DIR/cluster.json or ${ENV_CLUSTER}")


def _run(args: argparse.Namespace) -> int:
    _check_cluster(args)
    if getattr(args, "name", None) is not None:
        validate_name(args.name, "topic")
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    from httpapi.topics import record_view
    from streams.vocabulary import TopicOptions
    from thinclient.client import ProxyClient  # aiohttp: only when a command runs

    async with ProxyClient.from_cluster_file(args.cluster) as client:
        op = args.topic_op
        if op == "create":
            options = TopicOptions(**{o: getattr(args, o) for o, _w in _OPTIONS})
            out = record_view(await client.create_topic(args.name, args.partitions, options))
            _show_topic(out, args.json, f"created topic {args.name}")
        elif op == "alter":
            out = record_view(await client.alter_partitions(args.name, args.partitions))
            _show_topic(out, args.json, f"topic {args.name} has {out['partitions']} partitions")
        elif op == "delete":
            await client.delete_topic(args.name)
            _emit({"deleted": args.name}, args.json, f"deleted topic {args.name}")
        elif op == "list":
            await _list(client, args.json)
        else:
            await _describe(client, args.name, args.json)
    return 0


def _emit(obj: dict[str, Any], as_json: bool, text: str) -> None:
    print(json.dumps(obj, sort_keys=True) if as_json else text)


def _show_topic(topic: dict[str, Any], as_json: bool, text: str) -> None:
    if as_json:
        print(json.dumps(topic, sort_keys=True))
        return
    print(text)
    options = topic.get("options") or {}
    rows = [("partitions", topic["partitions"]), *sorted(options.items())]
    table("", ("setting", "value"), rows)


async def _list(client: ProxyClient, as_json: bool) -> None:
    from httpapi.topics import record_view

    names = await client.list_topics()
    records = await asyncio.gather(*(client.get_topic(n) for n in names))
    topics = [record_view(r) for r in records]
    if as_json:
        listed = [{"name": t["name"], "partitions": t["partitions"],
                   "options": t.get("options", {})} for t in topics]  # fmt: skip
        print(json.dumps({"topics": listed}))
        return
    rows = [(t["name"], t["partitions"], _options_text(t.get("options") or {})) for t in topics]
    table("", ("topic", "partitions", "options"), rows)


def _options_text(options: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(options.items())) or "-"


async def _describe(client: ProxyClient, name: str, as_json: bool) -> None:
    from httpapi.topics import topic_view

    info = await client.describe_topic(name)
    options = dataclasses.asdict(info.options)
    topic = topic_view(info.name, len(info.partitions), options, info.ctime_ms)
    parts = info.partitions
    if as_json:
        infos = [dataclasses.asdict(p) for p in parts]
        print(json.dumps({**topic, "partition_info": infos}, sort_keys=True))
        return
    print(f"topic {name}: {topic['partitions']} partitions, {_options_text(topic['options'])}")
    rows = [
        (
            p.partition,
            p.start_offset,
            p.end_offset,
            p.record_count,
            p.size_bytes,
            p.segments,
            p.owner or "-",
        )
        for p in parts
    ]
    total = sum(p.record_count for p in parts)
    table(
        f"{total} records",
        ("partition", "start", "end", "records", "bytes", "segments", "owner"),
        rows,
    )


# -- produce ---------------------------------------------------------------------------


def _headers(pairs: Sequence[str]) -> list[tuple[str, bytes | None]] | None:
    """``--header`` arguments as Kafka's headers: in order, repeats kept; ``NAME``
    alone has a null value."""
    out: list[tuple[str, bytes | None]] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not name:
            raise BadRequestError(f"--header takes NAME=VALUE (or NAME), not {pair!r}")
        out.append((name, value.encode() if sep else None))
    return out or None


def _key_of(line: bytes, field: str) -> bytes:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise BadRequestError(f"--key-field: a line is not JSON: {line[:80]!r}") from exc
    if not isinstance(obj, dict) or field not in obj or obj[field] is None:
        raise BadRequestError(f"--key-field: a line has no field {field!r}: {line[:80]!r}")
    value = obj[field]
    return (value if isinstance(value, str) else json.dumps(value)).encode()


def _run_produce(args: argparse.Namespace) -> int:
    _check_cluster(args)
    validate_name(args.topic, "topic")
    headers = _headers(args.header)
    return asyncio.run(_produce(args, headers))


async def _produce(args: argparse.Namespace, headers: list[tuple[str, bytes | None]] | None) -> int:
    from thinclient.client import ProxyClient

    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(SENDS_OUTSTANDING_MAX)
    results: list[tuple[int, int] | BaseException] = []
    null_line = None if args.null_value is None else args.null_value.encode()

    async def one(line: bytes) -> None:
        try:
            key = args.key if args.key_field is None else _key_of(line, args.key_field)
            value = None if line == null_line else line
            sent = client.send(args.topic, value, key, headers, args.partition,
                               timestamp_ms=args.timestamp)  # fmt: skip
            results.append(await sent)
        except BooklineError as exc:
            results.append(exc)
        finally:
            slots.release()

    async with ProxyClient.from_cluster_file(args.cluster) as client:
        await client.partitions_for(args.topic)  # NOT_FOUND at once for a missing topic
        tasks = []
        while True:
            raw = await loop.run_in_executor(None, sys.stdin.buffer.readline)
            if not raw:
                break
            await slots.acquire()
            tasks.append(loop.create_task(one(raw.rstrip(b"\r\n"))))
        await asyncio.gather(*tasks)
    return _produce_report(results, args.json)


def _produce_report(results: list[tuple[int, int] | BaseException], as_json: bool) -> int:
    """Records and offset ranges per partition; a refused record failed, one whose
    retries ran out on a retriable error has an unknown outcome (exit 6, never
    "failed": it may be stored)."""
    per: dict[int, list[int]] = {}
    errors = [r for r in results if isinstance(r, BaseException)]
    unknown = [e for e in errors if outcome_unknown(e)]
    failed = [e for e in errors if not outcome_unknown(e)]
    for r in results:
        if not isinstance(r, BaseException):
            per.setdefault(r[0], []).append(r[1])
    partitions = {
        str(p): {"records": len(o), "first_offset": min(o), "last_offset": max(o)}
        for p, o in sorted(per.items())
    }
    summary: dict[str, Any] = {
        "records": len(results) - len(errors),
        "failed": len(failed),
        "unknown": len(unknown),
        "partitions": partitions,
    }
    if failed:
        summary["errors"] = [error_text(e) for e in failed[:ERRORS_SHOWN_MAX]]
    if unknown:
        summary["unknown_errors"] = [error_text(e) for e in unknown[:ERRORS_SHOWN_MAX]]
    if as_json:
        print(json.dumps(summary, sort_keys=True))
    else:
        rows = [(p, v["records"], v["first_offset"], v["last_offset"])
                for p, v in partitions.items()]  # fmt: skip
        table(f"{summary['records']} records produced", ("partition", "records", "first offset",
                                                          "last offset"), rows)  # fmt: skip
        for text in summary.get("errors", []):
            print(f"bookline: produce failed: {text}", file=sys.stderr)
        for text in summary.get("unknown_errors", []):
            print(f"bookline: produce outcome unknown (retries ran out; it may be stored): "
                  f"{text}", file=sys.stderr)  # fmt: skip
        if errors:
            print(f"{len(failed)} records failed, {len(unknown)} outcome unknown", file=sys.stderr)
    return write_status(len(failed), len(unknown))
