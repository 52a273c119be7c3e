"""``python -m ops.cli ...``: the ``bookline`` command (CI, tests and the local cluster
start their processes this way)."""

import sys

from ops.cli.entry import main

sys.exit(main())
