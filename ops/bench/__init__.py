"""The bench room: ``bookline bench ...`` (:mod:`~ops.bench.command` registers every
benchmark; each lives in a module of its own, what they share in
:mod:`~ops.bench.common`), the open-loop pacer, CPU accounting and profiling they use,
and ``bench compare`` against the peers (:mod:`ops.bench.compare`). ``all.sh`` runs
every configuration of ``docs/benchmarks.md``.

Stands on :mod:`ops.cluster` (it starts fresh local clusters); imports neither the
command line nor chaos (``pyproject.toml``, the import contract).
"""
