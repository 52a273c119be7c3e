"""The example pipeline: web access logs -> Bookline -> Spark (streaming and batch).

* :mod:`pipeline.examples.accesslogs` - a deterministic access-log generator that writes
  Common Log Format lines into a stream;
* :mod:`pipeline.examples.jobs` - the Structured Streaming job (per-minute status-code
  counts and top paths, written to another stream and to Parquet) and the batch job
  that replays the whole history;
* :mod:`pipeline.examples.demo` - ``bookline pipeline demo``: all of it end to end on a
  local cluster.
"""
