"""The ``bookline`` exit statuses (README, "Exit status"): one per class of outcome.

Kept apart from :mod:`ops.cli.common` (which maps errors to them) so that ``--help``,
whose epilog lists them, imports nothing else.
"""

from __future__ import annotations

from typing import Final

from ops.cli.parser import EXIT_USAGE

__all__ = [
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_FOUND",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNKNOWN_OUTCOME",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
]

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1  # the cluster refused or failed the operation
# EXIT_USAGE = 2: bad flags or arguments (argparse's own status; ops.cli.parser)
EXIT_FOUND: Final = 3  # a check found problems (status, scrub)
EXIT_CONFIG: Final = 4  # configuration: cluster file missing or stopped, bad settings
EXIT_UNREACHABLE: Final = 5  # nothing answered: ZooKeeper or the proxies are down
# A write's retries ran out on a retriable error: it may or may not be in the stream
# (the proxy may have written it and lost the answer). Never reported as "failed".
EXIT_UNKNOWN_OUTCOME: Final = 6
EXIT_INTERRUPTED: Final = 130
EXIT_CODES: Final = {
    EXIT_OK: "success",
    EXIT_ERROR: "the cluster refused or failed the operation (the message names the error)",
    EXIT_USAGE: "bad flags or arguments",
    EXIT_FOUND: "a check found problems (`status`: something is down or under-replicated)",
    EXIT_CONFIG: "configuration: cluster file missing, stopped or malformed; bad settings",
    EXIT_UNREACHABLE: "the cluster did not answer (ZooKeeper or proxies down, timeout)",
    EXIT_UNKNOWN_OUTCOME: "a write's outcome is unknown (retries ran out: it may be stored)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
