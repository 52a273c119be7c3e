"""The cluster room: what starts, watches and stops processes -- child processes
(:mod:`~ops.cluster.procs`), Debian's ZooKeeper (:mod:`~ops.cluster.zookeeper`), the
local cluster (:mod:`~ops.cluster.local` with its children, files, auth and ZooKeeper
ACLs), ``bookline local``'s supervisor, the autorecovery's HTTP side and what a client
takes from a running cluster (:mod:`~ops.cluster.client_env`).

The bottom room of :mod:`ops`: benchmarks, chaos and the command line stand on it, it
imports none of them (``pyproject.toml``, the import contract).
"""
