"""Invariant checks that ``python -O`` cannot strip.

Use :func:`invariant` for what must hold if the code is correct (entry ids increase,
LAC <= last added, fenced never unfences). Operating errors (timeouts, full disks) are
ordinary exceptions, not invariants.
"""

from __future__ import annotations

from foundation.errors import InvariantViolation


def invariant(condition: bool, message: str, *args: object) -> None:
    """Raise :class:`InvariantViolation` when ``condition`` is false.

    ``message`` is %-formatted with ``args`` only on failure, so calls stay cheap.
    """
    if not condition:
        raise InvariantViolation(message % args if args else message)
