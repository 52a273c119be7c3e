"""Auto-registration of the ``bookline`` Spark data source.

Spark 4 looks for Python data sources in top-level modules named ``pyspark_*`` that
expose ``DefaultSource`` (``pyspark.sql.worker.lookup_data_sources`` walks
``pkgutil.iter_modules()``), and registers each under its ``name()``. Installed
regularly (a wheel, or the ``--py-files`` zip of ``bookline pipeline package``), this
module makes ``spark.read.format("bookline")`` work without ``pipeline.register``.
An editable install's import finder is invisible to ``iter_modules``: call
``pipeline.register(spark)`` there.
"""

from __future__ import annotations

from pipeline.source import BooklineDataSource as DefaultSource

__all__ = ["DefaultSource"]
