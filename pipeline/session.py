"""A local SparkSession set up for Bookline (tests, the example pipeline, the benchmark).

Python workers are started with *this* interpreter (``PYSPARK_PYTHON`` /
``PYSPARK_DRIVER_PYTHON`` = ``sys.executable``), so executors import ``pipeline`` and
``bookline`` from the same (editable) installation as the driver, whatever the working
directory. The UI is off and shuffle partitions are few: these sessions run on a laptop.
On a real cluster build the session as usual and call :func:`pipeline.register`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["local_session", "stop_session"]

# Shuffle partitions of a local session: Spark's default (200) is for clusters.
SHUFFLE_PARTITIONS_LOCAL = 4


def local_session(
    app_name: str = "bookline",
    cores: int = 2,
    *,
    shuffle_partitions: int = SHUFFLE_PARTITIONS_LOCAL,
    conf: dict[str, str] | None = None,
) -> Any:
    """Start (or reuse) a ``local[cores]`` SparkSession with ``bookline`` registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import pipeline

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    pipeline.register(spark)
    return spark


def stop_session(spark: Any) -> None:
    """Stop the session and its JVM (the gateway process is a child of this one)."""
    spark.stop()
    from pyspark import SparkContext

    gateway = getattr(SparkContext, "_gateway", None)
    if gateway is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
