"""``bookline consume TOPIC --group G``: a consumer group member printing records.

One line per record (its value as text; ``--json``: one object with topic, partition,
offset, key, value (null for a null value), headers (Kafka's: a list of ``[name,
value]`` pairs in order, a value null when null), the timestamp ``ts`` and its type
``ts_type`` (CreateTime or LogAppendTime)). Partitions without a committed offset start
at ``--from`` (earliest | latest). Offsets are auto-committed, and the final positions
at exit (``--limit`` records printed, ``--idle-exit-s`` without a record, Ctrl-C or
SIGTERM; Ctrl-C exits 130 as every command does): a record printed is a record
processed, so a restarted ``consume`` goes on after the last one printed. ``--via
core`` reads from the bookies with the core library instead of through a read proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Final

from foundation.errors import ConfigError
from foundation.names import validate_name
from httpapi.views import timestamp_type_name
from ops.cli.common import stop_on_signals
from ops.cli.exit import EXIT_INTERRUPTED
from ops.cli.parser import at_least

if TYPE_CHECKING:
    from groups.fetchers import ConsumerRecord

ENV_CLUSTER: Final = "BOOKLINE_CLUSTER"
# One poll waits this long for records (bounds how late Ctrl-C or --idle-exit-s act).
POLL_WAIT_S: Final = 0.5


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("consume", help="consume a topic as a member of a consumer group")
    p.add_argument("topic", help="topic name")
    p.add_argument("--group", required=True, help="consumer group")
    p.add_argument(
        "--cluster",
        default=os.environ.get(ENV_CLUSTER),
        help=f"cluster.json of a running cluster (default ${ENV_CLUSTER})",
    )
    p.add_argument(
        "--from",
        dest="start",
        choices=["earliest", "latest"],
        default="latest",
        help="where partitions without a committed offset start (default latest)",
    )
    p.add_argument("--limit", type=at_least(0), metavar="N", help="stop after N records")
    # `--max` was this flag's first name; `stream read` says --limit (issue 22).
    p.add_argument("--max", dest="limit", type=at_least(0), help=argparse.SUPPRESS)
    p.add_argument("--idle-exit-s", type=float, default=None,
                   help="stop after this many seconds without a record")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object per record")
    p.add_argument("--via", choices=["proxy", "core"], default="proxy",
                   help="read through a read proxy (default) or from the bookies")  # fmt: skip
    p.add_argument("--instance-id", default=None, help="static member id (group.instance.id)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if not args.cluster:
        raise ConfigError(f"say where the cluster is: --cluster DIR/cluster.json or ${ENV_CLUSTER}")
    validate_name(args.topic, "topic")
    validate_name(args.group, "group")
    return asyncio.run(_consume(args))


def record_line(rec: ConsumerRecord, as_json: bool) -> str:
    if not as_json:
        return "" if rec.value is None else rec.value.decode("utf-8", "replace")
    obj: dict[str, Any] = {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "ts": rec.timestamp_ms,
        "ts_type": timestamp_type_name(rec.timestamp_type),
        "key": _text(rec.key),
        "value": _text(rec.value),
    }
    if rec.headers:
        obj["headers"] = [[k, _text(v)] for k, v in rec.headers]
    return json.dumps(obj)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


async def _consume(args: argparse.Namespace) -> int:
    from groups.consumer import ConsumerConfig, GroupConsumer

    stop = asyncio.Event()
    stopped_by = stop_on_signals(stop)
    config = ConsumerConfig(auto_offset_reset=args.start, group_instance_id=args.instance_id)
    consumer = await GroupConsumer.from_cluster_file(
        args.cluster, args.group, [args.topic], via=args.via, config=config
    )
    remaining = args.limit
    last_record = time.monotonic()
    try:
        while not stop.is_set() and (remaining is None or remaining > 0):
            records = await consumer.poll(max_records=remaining, timeout_s=POLL_WAIT_S)
            if records:
                last_record = time.monotonic()
                sys.stdout.write("".join(record_line(r, args.json) + "\n" for r in records))
                sys.stdout.flush()
                if remaining is not None:
                    remaining -= len(records)
            elif args.idle_exit_s is not None and time.monotonic() - last_record > args.idle_exit_s:
                break
    finally:
        await consumer.close()  # commits what was printed, leaves the group
    return EXIT_INTERRUPTED if signal.SIGINT in stopped_by else 0
