"""The one check of a ledger's quorums: ``ensemble_size >= write_quorum >= ack_quorum >= 1``.

Configuration (``[ledger]``, ``[core]``) and stored ledger metadata all validate with it,
so the rule and its message are the same wherever it is broken: E bookies per ensemble,
Qw of them store each entry, Qa of those must acknowledge it.
"""

from __future__ import annotations

from foundation.errors import BooklineError, ConfigError

__all__ = ["check_quorum"]


def check_quorum(
    ensemble: int,
    write: int,
    ack: int,
    where: str,
    *,
    error: type[BooklineError] = ConfigError,
) -> None:
    """Raise ``error`` (a configuration error by default) naming ``where`` the quorums
    came from, unless ``ensemble >= write >= ack >= 1``."""
    if not ensemble >= write >= ack >= 1:
        raise error(
            f"{where}: quorums must satisfy ensemble_size >= write_quorum >= ack_quorum >= 1, "
            f"got E={ensemble} Qw={write} Qa={ack}"
        )
