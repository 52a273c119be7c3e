"""What a client process takes from a running cluster: the variable that names its
``cluster.json`` (:data:`ENV_CLUSTER`) and the credentials the file names
(:func:`use_cluster_credentials`).

Here, below the command line, because benchmarks and the local cluster's children
(:mod:`ops.cluster.children`, which must not inherit it) need them too.
"""

from __future__ import annotations

import argparse
import os
from typing import Final

__all__ = ["ENV_CLUSTER", "use_cluster_credentials"]

ENV_CLUSTER: Final = "BOOKLINE_CLUSTER"


def use_cluster_credentials(args: argparse.Namespace) -> None:
    """With ``--cluster``: its token for the bookies (unless ``--token`` /
    ``$BOOKLINE_TOKEN`` gave one), its ledger secret for the keys (unless
    ``$BOOKLINE_LEDGER_SECRET_FILE`` names one) and its ZooKeeper digest credentials
    (unless ``$BOOKLINE_METADATA_DIGEST_FILE`` names some), for this one command's
    process."""
    from bookie.client import use_token
    from foundation.auth import env_token
    from foundation.cluster_file import read_cluster_file
    from ledger.keys import SECRET_FILE_ENV
    from metadata.client import DIGEST_FILE_ENV

    if getattr(args, "zk", None) or not getattr(args, "cluster", None):
        return
    cluster = read_cluster_file(args.cluster)
    if not env_token() and cluster.token_file:
        use_token(cluster.token())
    if cluster.ledger_secret_file:
        os.environ.setdefault(SECRET_FILE_ENV, cluster.ledger_secret_file)
    if cluster.zk_digest_file:
        os.environ.setdefault(DIGEST_FILE_ENV, cluster.zk_digest_file)
