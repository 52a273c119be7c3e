"""Spark pipeline (to come): a PySpark Python data source named ``bookline`` for batch
and streaming reads and writes of Bookline streams, plus an example pipeline.
"""
