"""Spark pipeline: the ``bookline`` PySpark data source and an example pipeline.

``pipeline.register(spark)`` registers the data source (Spark 4's Python data source
API, ``pyspark.sql.datasource``) so that ``spark.read.format("bookline")``,
``spark.readStream``, ``df.write`` and ``df.writeStream`` work on Bookline streams.

Layout (control flow in the callers, pure leaves):

* :mod:`pipeline.options`  - option parsing (pure): the read options, every name;
  ``options_common`` (connection, strictness), ``options_sink`` (write options);
* :mod:`pipeline.planning` - offsets -> sequence-id ranges -> segment slices (pure);
* :mod:`pipeline.schema`   - row schema, records -> tuples / Arrow batches;
* :mod:`pipeline.client`   - namespaces per process, snapshots, slice reads (I/O);
* :mod:`pipeline.source`   - the DataSource, batch and streaming readers;
* :mod:`pipeline.sink`     - batch and streaming writers, exactly once per batch id
  (the driver's commit); ``sink_task`` (one task's rows), ``sink_marks`` (the
  exactly-once protocol: tags, digests, markers);
* :mod:`pipeline.streaming` - ``start_query``: a streaming query's start, again if
  Spark's fixed wait for its source's Python worker expired;
* :mod:`pipeline.examples` - the access-log example pipeline (``bookline pipeline demo``).

The top-level module :mod:`pyspark_bookline` registers the format by itself in Spark
4 when Bookline is installed regularly (or shipped as the zip of ``bookline pipeline
package``); see the README's "Spark pipeline" section for running on a cluster.

This ``__init__`` imports no pyspark, so the CLI and the pure tests stay light.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = ["DATA_SOURCE_NAME", "PACKAGES", "data_source_class", "register"]

# The import packages a Spark worker needs to run the data source (their third-party
# dependencies are the executors' business: see the README).
PACKAGES = ("foundation", "metadata", "bookie", "ledger", "streams", "pipeline",
            "pyspark_bookline")  # fmt: skip

DATA_SOURCE_NAME = "bookline"


def data_source_class() -> type[Any]:
    from pipeline.source import BooklineDataSource

    return BooklineDataSource


def register(spark: Any) -> None:
    """Register the ``bookline`` format on ``spark`` (a SparkSession); idempotent."""
    ship_wheels(spark)
    spark.dataSource.register(data_source_class())


def ship_wheels(spark: Any) -> list[str]:
    """Make ``--py-files bookline-*.whl`` work: Spark puts only the ``.zip``, ``.egg``
    and ``.jar`` files of ``spark.submit.pyFiles`` on its Python workers' path, so a
    wheel (a zip) is shipped again under a ``.zip`` name. Returns what was added."""
    sc = spark.sparkContext
    shipped = getattr(sc, "_bookline_wheels", None)
    if shipped is None:
        shipped = []
        for raw in sc.getConf().get("spark.submit.pyFiles", "").split(","):
            path = Path(urlparse(raw).path if raw.startswith("file:") else raw)
            if path.suffix != ".whl" or not path.is_file():
                continue
            copy = Path(tempfile.mkdtemp(prefix="bookline-whl-")) / f"{path.stem}.zip"
            shutil.copyfile(path, copy)
            sc.addPyFile(str(copy))
            shipped.append(str(copy))
        sc._bookline_wheels = shipped
    return list(shipped)
