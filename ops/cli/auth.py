"""``bookline auth``: credentials for the proxies and the bookies (docs/security.md).

* ``auth token --principal NAME (--secret-file F | --dir DIR) [--expires-in S]`` -- a
  signed token (printed on stdout only, nowhere else), valid ``S`` seconds;
* ``auth hash`` -- the SHA-256 a tokens file stores for a static token (read from
  stdin, so the token stays out of the shell history and the process list);
* ``auth bookie-credential ID --ledger-secret-file F --out PATH [--force]`` -- bookie
  ``ID``'s credential (bookie/identity.py), signed by the first line of the ledger
  secret file, written to ``PATH`` (mode 0600; an existing file only with ``--force``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Final

from foundation.auth import hash_static_token, load_secrets, sign_token
from foundation.errors import AlreadyExistsError, ConfigError

__all__ = ["register"]

# A day: long enough for a session's work, short enough that a leaked token ages out.
EXPIRES_IN_S_DEFAULT: Final = 24 * 3600
# Ten years: a bound on typos (`--expires-in 1e12`), not a policy.
EXPIRES_IN_S_MAX: Final = 10 * 365 * 24 * 3600


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("auth", help="make tokens and bookie credentials (docs/security.md)")
    ops = p.add_subparsers(dest="auth_op", metavar="OP", required=True)
    t = ops.add_parser("token", help="print a signed token for a principal")
    t.add_argument("--principal", required=True, help="who the token names (see grants)")
    where = t.add_mutually_exclusive_group(required=True)
    where.add_argument("--secret-file", help="the cluster secret file (its first line signs)")
    where.add_argument("--dir", help="a `bookline local` directory (its auth/secret)")
    t.add_argument(
        "--expires-in",
        type=float,
        default=EXPIRES_IN_S_DEFAULT,
        metavar="S",
        help=f"seconds the token is valid (default {EXPIRES_IN_S_DEFAULT})",
    )
    t.set_defaults(handler=_token)
    h = ops.add_parser("hash", help="the SHA-256 of a static token read from stdin")
    h.set_defaults(handler=_hash)
    b = ops.add_parser(
        "bookie-credential",
        help="issue a bookie its credential (its [bookie] identity_file) from the ledger secret",
    )
    b.add_argument("bookie_id", metavar="BOOKIE_ID", help="the bookie's id ([bookie] bookie_id)")
    b.add_argument(
        "--ledger-secret-file",
        required=True,
        help="the cluster ledger secret file (its first line signs)",
    )
    b.add_argument("--out", required=True, help="the credential file to write (mode 0600)")
    b.add_argument("--force", action="store_true", help="replace an existing file")
    b.set_defaults(handler=_bookie_credential)


def _token(args: argparse.Namespace) -> int:
    if not 0 < args.expires_in <= EXPIRES_IN_S_MAX:
        raise ConfigError(f"--expires-in must be within 0..{EXPIRES_IN_S_MAX} seconds")
    path = args.secret_file or str(Path(args.dir) / "auth" / "secret")
    secret = load_secrets(path)[0]
    try:
        token = sign_token(secret, args.principal, time.time() + args.expires_in)
    except ValueError as exc:
        raise ConfigError(f"--principal: {exc}") from exc
    print(token)
    return 0


def _hash(args: argparse.Namespace) -> int:
    token = sys.stdin.readline().strip()
    if not token:
        raise ConfigError("give the static token on stdin")
    print(hash_static_token(token))
    return 0


def _bookie_credential(args: argparse.Namespace) -> int:
    # Loaded only when the command runs (the CLI imports no command's stack up front).
    from bookie.identity import write_credential
    from foundation.names import validate_name
    from ledger.keys import read_secret

    bookie_id = validate_name(args.bookie_id, "bookie id")
    if not args.force and os.path.lexists(args.out):
        raise AlreadyExistsError(f"{args.out} exists; --force replaces it")
    # The first line signs: the one clients derive new credentials from (rotation).
    secret = read_secret(args.ledger_secret_file).split(b"\n")[0]
    try:
        write_credential(args.out, secret, bookie_id)
    except OSError as exc:
        raise ConfigError(f"cannot write {args.out}: {exc.strerror}") from exc
    print(f"bookie {bookie_id}: credential in {args.out} (give it to that bookie only)")
    return 0
