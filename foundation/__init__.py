"""The ground floor: what every layer shares, importing nothing of ours.

Errors and their stable codes, the typed config loader, name validation, invariants,
limits, the cluster file, GC tuning, the loop-thread helper, the service scaffold and
the version. Every other package may import these; they import only the standard
library and third-party packages.
"""
