"""A ledger's quorums: E bookies per ensemble, Qw of them store each entry, Qa of those
must acknowledge it.

* :func:`check_quorum` -- the one check of ``ensemble_size >= write_quorum >= ack_quorum
  >= 1``: configuration (``[ledger]``, ``[core]``) and stored ledger metadata validate
  with it, so the rule and its message are the same wherever it is broken.
* :func:`write_set` -- the ensemble positions holding an entry (striping): the ledger
  writer, readers, recovery and the metadata model all place entries with it.
"""

from __future__ import annotations

from foundation.errors import BooklineError, ConfigError
from foundation.invariants import invariant

__all__ = ["check_quorum", "write_set"]


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


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble positions holding ``entry_id``: ``(entry_id + k) mod E`` for ``k < Qw``."""
    invariant(entry_id >= 0, "write set of negative entry id %d", entry_id)
    invariant(
        ensemble_size >= write_quorum >= 1, "bad quorum E=%d Qw=%d", ensemble_size, write_quorum
    )
    return [(entry_id + k) % ensemble_size for k in range(write_quorum)]
