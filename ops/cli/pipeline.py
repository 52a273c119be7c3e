"""``bookline pipeline …``: the Spark example pipeline (see pipeline/examples)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import tempfile
import zipfile
from pathlib import Path


def _cmd_demo(args: argparse.Namespace) -> int:
    from ops.cluster.local import LocalCluster
    from pipeline.examples import demo

    with tempfile.TemporaryDirectory(prefix="bl-pipeline-") as tmp, contextlib.ExitStack() as stack:
        settings = demo.DemoSettings(
            dir=Path(args.dir) if args.dir else Path(tmp),
            records=args.records,
            minutes=args.minutes,
            max_records_per_trigger=args.max_records_per_trigger,
        )
        if args.cluster:
            cluster_file = Path(args.cluster)
        else:  # our own cluster, stopped by pid when the demo ends or fails
            cluster = LocalCluster(settings.dir.resolve() / "cluster", bookies=3)
            cluster.start()
            stack.callback(cluster.stop)
            cluster_file = cluster.dir / "cluster.json"
        summary = demo.run(settings, cluster_file)
    print(json.dumps(summary, indent=2, sort_keys=True), flush=True)
    return 0


def build_package(out_dir: Path) -> Path:
    """The zip to pass to ``spark-submit --py-files``: the import packages a Spark worker
    needs (:data:`pipeline.PACKAGES`, ``pyspark_bookline`` included so the format
    registers itself), sources only. Their third-party dependencies are not in it."""
    from foundation.version import __version__
    from pipeline import PACKAGES

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"bookline-spark-{__version__}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in PACKAGES:
            spec = importlib.util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise FileNotFoundError(f"package {package} is not importable here")
            root = Path(next(iter(spec.submodule_search_locations)))
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                    zf.write(path, Path(package) / path.relative_to(root))
    return target


def _cmd_package(args: argparse.Namespace) -> int:
    print(build_package(Path(args.out)), flush=True)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pipeline = sub.add_parser("pipeline", help="the Spark data pipeline (PySpark data source)")
    cmds = pipeline.add_subparsers(dest="pipeline", metavar="COMMAND", required=True)
    p = cmds.add_parser(
        "demo",
        help="access logs -> stream -> Spark streaming + batch replay -> stream and Parquet",
    )
    p.add_argument(
        "--dir",
        default=None,
        help="state directory: cluster, checkpoints, Parquet (default: a temp dir)",
    )
    p.add_argument(
        "--cluster", default=None, help="cluster.json of a running cluster (default: start our own)"
    )
    p.add_argument("--records", type=int, default=20_000, help="access logs to generate")
    p.add_argument("--minutes", type=int, default=10, help="event-time span of the logs")
    p.add_argument(
        "--max-records-per-trigger",
        type=int,
        default=5_000,
        help="admission control of the streaming job",
    )
    p.set_defaults(handler=_cmd_demo)
    p = cmds.add_parser(
        "package",
        help="the zip for spark-submit --py-files (Bookline's packages; see README)",
    )
    p.add_argument("--out", default=".", help="directory to write bookline-spark-VERSION.zip to")
    p.set_defaults(handler=_cmd_package)
