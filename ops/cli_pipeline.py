"""``bookline pipeline …``: the Spark example pipeline (see pipeline/examples)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def _cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.examples import demo

    with tempfile.TemporaryDirectory(prefix="bl-pipeline-") as tmp:
        settings = demo.DemoSettings(
            dir=Path(args.dir) if args.dir else Path(tmp),
            records=args.records,
            minutes=args.minutes,
            max_records_per_trigger=args.max_records_per_trigger,
            cluster_file=Path(args.cluster) if args.cluster else None,
        )
        summary = demo.run(settings)
    print(json.dumps(summary, indent=2, sort_keys=True), flush=True)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pipeline = sub.add_parser("pipeline", help="the Spark data pipeline (PySpark data source)")
    cmds = pipeline.add_subparsers(dest="pipeline", metavar="COMMAND", required=True)
    p = cmds.add_parser(
        "demo",
        help="access logs -> stream -> Spark streaming + batch replay -> stream and Parquet",
    )
    p.add_argument("--dir", default=None,
                   help="state directory: cluster, checkpoints, Parquet (default: a temp dir)")
    p.add_argument("--cluster", default=None,
                   help="cluster.json of a running cluster (default: start our own)")
    p.add_argument("--records", type=int, default=20_000, help="access logs to generate")
    p.add_argument("--minutes", type=int, default=10, help="event-time span of the logs")
    p.add_argument("--max-records-per-trigger", type=int, default=5_000,
                   help="admission control of the streaming job")
    p.set_defaults(handler=_cmd_demo)
