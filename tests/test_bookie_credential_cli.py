"""``bookline auth bookie-credential``: the operator's way to issue a bookie its
credential (bookie/identity.py) for a deployment; the deploy kit's make-credentials.sh
uses it (issue 21, 2)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bookie.identity import BookieIdentity, hello_proof, load_credential, registration_proof
from ledger.keys import read_secret
from ops.cli import main
from ops.cli.common import EXIT_CONFIG, EXIT_ERROR

OLD = b"0123456789abcdef0123456789abcdef"
NEW = b"fedcba9876543210fedcba9876543210"
ADDRESS = "10.0.0.1:3181"


def _secret_file(tmp_path: Path, *lines: bytes) -> Path:
    path = tmp_path / "ledger.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(b"\n".join(lines) + b"\n")
    return path


def _issue(secret: Path, out: Path, bookie_id: str, *extra: str) -> int:
    argv = ["auth", "bookie-credential", bookie_id, "--ledger-secret-file", str(secret)]
    return main([*argv, "--out", str(out), *extra])


def _proves(identity: BookieIdentity, credential_file: Path, bookie_id: str) -> bool:
    """What a client checks: the bookie's HELLO answer and its registration."""
    cred = load_credential(str(credential_file))
    nonce = identity.nonce()
    hello = identity.hello_ok(
        nonce, bookie_id, ADDRESS, hello_proof(cred, nonce, bookie_id, ADDRESS)
    )
    registered = identity.registration_ok(
        bookie_id, ADDRESS, registration_proof(cred, bookie_id, ADDRESS)
    )
    return hello and registered


def test_an_issued_credential_proves_its_bookie_to_clients_holding_the_secret(
    tmp_path: Path,
) -> None:
    secret = _secret_file(tmp_path, OLD)
    out = tmp_path / "bookie-1.identity"
    assert _issue(secret, out, "bookie-1") == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    identity = BookieIdentity.from_secret(read_secret(str(secret)))
    assert identity is not None
    assert _proves(identity, out, "bookie-1")
    # It is bookie-1's alone: presented under another id, it proves nothing.
    assert not _proves(identity, out, "bookie-2")
    # And it is not the secret: the file says nothing of it.
    assert OLD not in out.read_bytes()


def test_it_refuses_to_replace_a_credential_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = _secret_file(tmp_path, OLD)
    out = tmp_path / "bookie-1.identity"
    assert _issue(secret, out, "bookie-1") == 0
    before = out.read_bytes()
    assert _issue(secret, out, "bookie-2") == EXIT_ERROR
    assert "ALREADY_EXISTS" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert _issue(secret, out, "bookie-2", "--force") == 0
    assert out.read_bytes() != before
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_the_first_line_of_a_rotated_secret_signs(tmp_path: Path) -> None:
    """Rotation (docs/security.md): with the new secret first, re-issued credentials
    are the new secret's; clients holding both lines accept old and new ones."""
    old_out, new_out = tmp_path / "old.identity", tmp_path / "new.identity"
    assert _issue(_secret_file(tmp_path, OLD), old_out, "bookie-1") == 0
    os.unlink(tmp_path / "ledger.secret")
    rotated = _secret_file(tmp_path, NEW, OLD)
    assert _issue(rotated, new_out, "bookie-1") == 0
    assert old_out.read_bytes() != new_out.read_bytes()
    both = BookieIdentity.from_secret(read_secret(str(rotated)))
    only_new = BookieIdentity.from_secret(NEW)
    assert both is not None and only_new is not None
    assert _proves(both, old_out, "bookie-1") and _proves(both, new_out, "bookie-1")
    assert _proves(only_new, new_out, "bookie-1")
    assert not _proves(only_new, old_out, "bookie-1")


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = _secret_file(tmp_path, OLD)
    assert _issue(secret, tmp_path / "x", "a/b") != 0  # not a bookie id
    assert "INVALID_NAME" in capsys.readouterr().err
    os.chmod(secret, 0o644)
    assert _issue(secret, tmp_path / "y", "bookie-1") == EXIT_CONFIG  # others may read it
    assert "chmod 600" in capsys.readouterr().err
    os.chmod(secret, 0o600)
    assert _issue(secret, tmp_path / "no" / "such" / "dir", "bookie-1") == EXIT_CONFIG
    assert "cannot write" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
