"""Operations, in four rooms that import one way (``pyproject.toml``'s contract):
:mod:`ops.cli` (the ``bookline`` command line) over :mod:`ops.bench` (benchmarks) and
:mod:`ops.chaos` (the Jepsen-style test) over :mod:`ops.cluster` (child processes,
ZooKeeper, the local cluster and its supervisor). :mod:`ops.progress` is a leaf they
all use; :mod:`ops.gen_config_docs` writes ``docs/configuration.md``.
"""
