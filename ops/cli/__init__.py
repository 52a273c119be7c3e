"""The cli room: the ``bookline`` command line. :mod:`~ops.cli.entry` holds the table of
commands, the parser and :func:`main`; each command group is a module here
(:mod:`~ops.cli.stream` for ``bookline stream ...``), built only when it runs;
:mod:`~ops.cli.common` holds their flags, errors, exit codes and tables.

The top room of :mod:`ops`: it may import benchmarks, chaos and the cluster, nothing
imports it (``pyproject.toml``, the import contract). ``bookline`` (the console script)
and ``python -m ops.cli`` both run :func:`main`; importing this package stays cheap
(argparse, no command's module), so ``bookline --version`` is.
"""

from ops.cli.entry import main

__all__ = ["main"]
