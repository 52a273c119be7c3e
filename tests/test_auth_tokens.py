"""Tokens and grants (foundation.auth), pure: signing, expiry, tampering, rotation,
prefix grants, admin implying produce/consume, unknown principals, file loading."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.auth import (
    SERVICE_PRINCIPAL,
    AuthConfig,
    Authenticator,
    Authority,
    Grants,
    generate_secret,
    hash_static_token,
    load_authority,
    load_grants,
    load_secrets,
    sign_token,
    verify_token,
    write_secret_file,
)
from foundation.errors import ConfigError, ForbiddenError, UnauthenticatedError

SECRET = b"s" * 32
OTHER = b"o" * 32
NOW = 1_800_000_000.0


def test_valid_token_names_its_principal() -> None:
    token = sign_token(SECRET, "alice", NOW + 60)
    assert token.startswith("bl1.")
    assert verify_token([SECRET], token, NOW) == "alice"


def test_expired_token_is_refused_without_repeating_it() -> None:
    token = sign_token(SECRET, "alice", NOW - 1)
    with pytest.raises(UnauthenticatedError) as info:
        verify_token([SECRET], token, NOW)
    assert "expired" in info.value.message
    assert token not in str(info.value)
    assert token.split(".")[3] not in str(info.value)


@pytest.mark.parametrize("part", [1, 2, 3])
def test_tampered_token_is_refused(part: int) -> None:
    token = sign_token(SECRET, "alice", NOW + 60)
    parts = token.split(".")
    forged = {1: sign_token(SECRET, "mallory", NOW + 60).split(".")[1], 2: str(int(NOW) + 999999)}
    parts[part] = forged.get(part, parts[part][:-2] + ("AA" if parts[part][-2:] != "AA" else "BB"))
    with pytest.raises(UnauthenticatedError):
        verify_token([SECRET], ".".join(parts), NOW)


def test_wrong_secret_is_refused() -> None:
    with pytest.raises(UnauthenticatedError, match="signature"):
        verify_token([OTHER], sign_token(SECRET, "alice", NOW + 60), NOW)


@pytest.mark.parametrize(
    "garbage", ["", "bl1", "bl1.a.b.c", "bl2.YQ.1.AA", "x" * 5000, "bl1.!!.9.AA"]
)
def test_malformed_tokens_are_refused(garbage: str) -> None:
    with pytest.raises(UnauthenticatedError):
        verify_token([SECRET], garbage, NOW)


def _with_expiry(expiry: str) -> str:
    """A token signed over ``expiry`` as written (sign_token writes ASCII digits)."""
    import base64
    import hashlib
    import hmac

    principal = base64.urlsafe_b64encode(b"admin").rstrip(b"=").decode()
    payload = f"bl1.{principal}.{expiry}"
    mac = hmac.new(SECRET, payload.encode("utf-8"), hashlib.sha256).digest()
    return f"{payload}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


# Digits str.isdigit() accepts beside ASCII's: Arabic-Indic, fullwidth, superscript,
# Devanagari (issue 21 (5): these answered 500 and dropped bookie connections).
@pytest.mark.parametrize(
    "expiry", ["\u0661\u0668\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660",
               "\uff11\uff19\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10",
               "\u00b9\u00b2", "\u0967\u096f\u0966\u0966\u0966\u0966\u0966\u0966\u0966\u0966",
               "1" * 40],
)  # fmt: skip
def test_expiry_of_non_ascii_digits_is_a_malformed_token(expiry: str) -> None:
    authority = Authority(Authenticator((SECRET,)), Grants())
    with pytest.raises(UnauthenticatedError, match="malformed"):
        authority.authenticate(_with_expiry(expiry), NOW)
    assert authority.authenticate(_with_expiry(str(int(NOW) + 60)), NOW) == "admin"


# Every Unicode decimal digit (str.isdigit() says yes to all of them).
DIGITS = st.characters(categories=["Nd"])
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.builds(
            lambda *parts: ".".join(parts),
            st.sampled_from(["bl1", "bl2", ""]),
            st.one_of(st.text(max_size=30), st.text(B64, max_size=30)),
            st.one_of(st.text(max_size=30), st.text(DIGITS, min_size=1, max_size=12)),
            st.one_of(st.text(max_size=60), st.text(B64, max_size=60)),
        ),
    )
)
def test_any_token_string_is_a_principal_or_unauthenticated(token: str) -> None:
    """Issue 21 (5): whatever string arrives as a token (header, query, bookie AUTH),
    authentication names a principal or raises UnauthenticatedError, nothing else."""
    static = {"bob": hash_static_token("bobs-token")}
    for authenticator in (Authenticator((SECRET,)), Authenticator((), static)):
        authority = Authority(authenticator, Grants())
        try:
            principal = authority.authenticate(token, NOW)
        except UnauthenticatedError:
            continue
        assert principal in ("bob",) or verify_token([SECRET], token, NOW) == principal


def test_rotation_verifies_with_every_secret_and_signs_with_the_first(tmp_path: Path) -> None:
    old = sign_token(OTHER, "alice", NOW + 60)
    new = sign_token(SECRET, "bob", NOW + 60)
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n# the previous one, until every token is re-issued\n" + OTHER)
    path.chmod(0o600)
    secrets = load_secrets(str(path))
    assert secrets == (SECRET, OTHER)
    assert verify_token(secrets, old, NOW) == "alice"
    assert verify_token(secrets, new, NOW) == "bob"
    authority = Authority(Authenticator(secrets), Grants())
    assert verify_token([SECRET], authority.service_token(NOW), NOW) == SERVICE_PRINCIPAL


GRANTS_TOML = """
superusers = ["ops"]
[[grants]]
principal = "alice"
permission = "produce"
kind = "stream"
prefix = "app-"
[[grants]]
principal = "carol"
permission = "admin"
kind = "topic"
prefix = "orders"
[[grants]]
principal = "dave"
permission = "consume"
kind = "group"
prefix = ""
"""


@pytest.fixture
def grants(tmp_path: Path) -> Grants:
    path = tmp_path / "grants.toml"
    path.write_text(GRANTS_TOML)
    return load_grants(str(path))


def test_prefix_grants(grants: Grants) -> None:
    grants.authorize("alice", "produce", "stream", "app-x")
    with pytest.raises(ForbiddenError, match="'alice' may not produce on stream 'other-x'"):
        grants.authorize("alice", "produce", "stream", "other-x")
    with pytest.raises(ForbiddenError):
        grants.authorize("alice", "consume", "stream", "app-x")
    with pytest.raises(ForbiddenError):
        grants.authorize("alice", "produce", "topic", "app-x")  # kinds are separate
    grants.authorize("dave", "consume", "group", "anything")


def test_admin_implies_produce_and_consume(grants: Grants) -> None:
    for permission in ("produce", "consume", "admin"):
        grants.authorize("carol", permission, "topic", "orders-eu")
    with pytest.raises(ForbiddenError):
        grants.authorize("alice", "admin", "stream", "app-x")  # produce does not imply admin


def test_unknown_principal_may_do_nothing_but_superusers_everything(grants: Grants) -> None:
    with pytest.raises(ForbiddenError):
        grants.authorize("eve", "consume", "stream", "app-x")
    grants.authorize("ops", "admin", "cluster", "")


def test_service_principal_administers_the_cluster_and_nothing_of_a_tenant() -> None:
    """Issue 21 (2): least privilege; the services' identity is no superuser, even when
    a grants file names it one."""
    for grants in (Grants(), Grants(superusers=frozenset({SERVICE_PRINCIPAL}))):
        grants.authorize(SERVICE_PRINCIPAL, "admin", "cluster", "")  # bookie inventory
        for kind in ("stream", "topic", "group"):
            for permission in ("produce", "consume", "admin"):
                with pytest.raises(ForbiddenError):
                    grants.authorize(SERVICE_PRINCIPAL, permission, kind, "x")


def test_bad_grants_files_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "grants.toml"
    path.write_text('[[grants]]\nprincipal = "a"\npermission = "write"\nkind = "stream"\n')
    with pytest.raises(ConfigError, match="grant #1: permission must be one of"):
        load_grants(str(path))
    path.write_text(
        '[[grants]]\nprincipal = "a"\npermission = "admin"\nkind = "stream"\nprefx = ""\n'
    )
    with pytest.raises(ConfigError, match="unknown key"):
        load_grants(str(path))


def test_secret_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_secret_file(path, generate_secret())
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert len(load_secrets(str(path))[0]) >= 32
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=f"secret file {path} is readable by others"):
        load_secrets(str(path))


def test_static_tokens_and_load_authority(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    digest = hash_static_token("opaque-bob-token")
    tokens.write_text(f'{{"tokens": {{"bob": "{digest}"}}}}')
    secret = tmp_path / "secret"
    write_secret_file(secret, SECRET)
    assert load_authority(AuthConfig()) is None
    authority = load_authority(
        AuthConfig(enabled=True, secret_file=str(secret), tokens_file=str(tokens))
    )
    assert authority is not None
    assert authority.authenticate("opaque-bob-token", NOW) == "bob"
    assert authority.authenticate(sign_token(SECRET, "alice", NOW + 5), NOW) == "alice"
    for bad in (None, "", "opaque-bob-tokeN"):
        with pytest.raises(UnauthenticatedError):
            authority.authenticate(bad, NOW)
    with pytest.raises(ConfigError, match="needs a secret file or a tokens file"):
        AuthConfig(enabled=True)


def test_cli_mints_tokens_and_hashes_static_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from ops.cli import main

    secret = tmp_path / "auth" / "secret"
    secret.parent.mkdir()
    write_secret_file(secret, SECRET)
    assert main(["auth", "token", "--principal", "alice", "--dir", str(tmp_path)]) == 0
    token = capsys.readouterr().out.strip()
    assert verify_token([SECRET], token, time.time()) == "alice"
    assert main(["auth", "token", "--principal", "a b", "--secret-file", str(secret)]) == 4
    assert "whitespace" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("opaque\n"))
    assert main(["auth", "hash"]) == 0
    assert capsys.readouterr().out.strip() == hash_static_token("opaque")


@pytest.mark.parametrize("kind", ["writeproxy", "readproxy"])
def test_proxy_with_a_secret_others_may_read_refuses_to_start(kind: str, tmp_path: Path) -> None:
    """Before touching ZooKeeper (none listens at port 1): CONFIG, exit status 4."""
    import subprocess
    import sys

    secret = tmp_path / "secret"
    write_secret_file(secret, SECRET)
    secret.chmod(0o640)
    argv = [sys.executable, "-m", "ops.cli", kind, "--auth-enabled", "true",
            "--auth-secret-file", str(secret), "--zk", "127.0.0.1:1", "--port", "0"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 4, done.stderr
    assert f"secret file {secret} is readable by others (mode 0640)" in done.stderr
