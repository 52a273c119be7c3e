"""Spark pipeline: the ``bookline`` PySpark data source and an example pipeline.

``pipeline.register(spark)`` registers the data source (Spark 4's Python data source
API, ``pyspark.sql.datasource``) so that ``spark.read.format("bookline")``,
``spark.readStream``, ``df.write`` and ``df.writeStream`` work on Bookline streams.

Layout (control flow in the callers, pure leaves):

* :mod:`pipeline.options`  - option parsing (pure);
* :mod:`pipeline.planning` - offsets -> sequence-id ranges -> segment slices (pure);
* :mod:`pipeline.schema`   - row schema, records -> tuples / Arrow batches;
* :mod:`pipeline.client`   - namespaces per process, snapshots, slice reads (I/O);
* :mod:`pipeline.source`   - the DataSource, batch and streaming readers;
* :mod:`pipeline.sink`     - batch and streaming writers, exactly once per batch id;
* :mod:`pipeline.examples` - the access-log example pipeline (``bookline pipeline demo``).

This ``__init__`` imports no pyspark, so the CLI and the pure tests stay light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DATA_SOURCE_NAME", "data_source_class", "register"]

DATA_SOURCE_NAME = "bookline"


def data_source_class() -> type[Any]:
    from pipeline.source import BooklineDataSource

    return BooklineDataSource


def register(spark: Any) -> None:
    """Register the ``bookline`` format on ``spark`` (a SparkSession); idempotent."""
    spark.dataSource.register(data_source_class())
