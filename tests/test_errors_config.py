"""The error hierarchy keeps stable codes; configuration loads in precedence order."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bookie.config import BookieConfig
from bookline import errors
from foundation.config import MetadataConfig, load_config
from foundation.errors import BooklineError, ConfigError, for_code
from foundation.invariants import invariant
from httpapi.status import HTTP_STATUS, http_status

# Codes are a public contract: they go over the wire and into HTTP bodies. Changing one
# is a breaking change, so the table is pinned here.
PINNED = {
    "BAD_REQUEST": 2,
    "IO": 3,
    "NO_LEDGER": 4,
    "NO_ENTRY": 5,
    "UNAUTHORIZED": 6,
    "FENCED": 7,
    "READ_ONLY": 8,
    "TOO_MANY_REQUESTS": 9,
    "TIMEOUT": 10,
    "BAD_VERSION": 15,
    "LOCK_OWNED": 18,
    "INVARIANT_VIOLATION": 33,
    "OUT_OF_RANGE": 40,
    "UNAVAILABLE": 41,
    "OUTCOME_UNKNOWN": 42,
    "PRODUCER_FENCED": 43,
    "UNKNOWN_PARTITION": 47,
    "UNAUTHENTICATED": 48,
    "FORBIDDEN": 49,
    "METHOD_NOT_ALLOWED": 50,
    "UNSUPPORTED_MEDIA_TYPE": 51,
    "INVALID_CONFIG": 52,
    "UNKNOWN_CONFIG": 53,
}


def test_codes_are_pinned_and_unique() -> None:
    registry = errors.registered_codes()
    by_name = {cls.name: code for code, cls in registry.items()}
    for name, code in PINNED.items():
        assert by_name[name] == code
    assert len(set(by_name.values())) == len(by_name)


# Every code's HTTP status is part of the HTTP API (docs/openapi.json, docs/proxies.md):
# pinned too.
PINNED_HTTP_STATUS = {
    "UNKNOWN": 500,
    "BAD_REQUEST": 400,
    "IO": 500,
    "NO_LEDGER": 404,
    "NO_ENTRY": 404,
    "UNAUTHORIZED": 403,
    "FENCED": 409,
    "READ_ONLY": 503,
    "TOO_MANY_REQUESTS": 429,
    "TIMEOUT": 504,
    "CONNECTION_LOST": 503,
    "CLOSED": 503,
    "INVALID_NAME": 400,
    "CONFIG": 500,
    "BAD_VERSION": 409,
    "ALREADY_EXISTS": 409,
    "NOT_FOUND": 404,
    "LOCK_OWNED": 409,
    "OWNERSHIP_LOST": 503,
    "SESSION_SUSPENDED": 503,
    "CHECKSUM": 500,
    "TOO_LARGE": 413,
    "NOT_ENOUGH_BOOKIES": 503,
    "LEDGER_CLOSED": 409,
    "PROTOCOL_VERSION": 400,
    "COOKIE_MISMATCH": 500,
    "DISK_FULL": 507,
    "TRUNCATED": 410,
    "END_OF_STREAM": 410,
    "OWNER_MOVED": 307,
    "INVARIANT_VIOLATION": 500,
    "METADATA": 503,
    "WRITER_FAILED": 500,
    "OUT_OF_ORDER_SEQUENCE": 409,
    "OUT_OF_RANGE": 400,
    "UNAVAILABLE": 503,
    "OUTCOME_UNKNOWN": 503,
    "PRODUCER_FENCED": 409,
    "STALE_GENERATION": 409,
    "NOT_ASSIGNED": 409,
    "GROUP_NOT_EMPTY": 409,
    "UNKNOWN_PARTITION": 404,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403,
    "METHOD_NOT_ALLOWED": 405,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "INVALID_CONFIG": 400,
    "UNKNOWN_CONFIG": 400,
}


def test_every_code_has_its_pinned_http_status() -> None:
    registry = errors.registered_codes()
    assert {cls.code for cls in HTTP_STATUS} == set(registry), "one status per code"
    assert {cls.name: http_status(cls()) for cls in registry.values()} == PINNED_HTTP_STATUS


def test_http_status_of_subclasses_and_rebuilt_errors() -> None:
    class FrameBodyError(errors.BadRequestError):  # like bookie.protocol's: no code of its own
        pass

    assert http_status(FrameBodyError("short frame")) == 400  # BAD_REQUEST's code
    assert http_status(for_code(32, "moved")) == 307
    assert http_status(for_code(9999, "from a newer peer")) == 500


def test_for_code_round_trip_and_unknown() -> None:
    for code, cls in errors.registered_codes().items():
        err = for_code(code, "m")
        assert type(err) is cls
        assert err.to_dict()["code"] == code
    unknown = for_code(9999, "from a newer peer")
    assert isinstance(unknown, errors.UnknownError)
    assert unknown.to_dict() == {"code": 9999, "name": "UNKNOWN", "message": "from a newer peer"}


def test_reusing_a_code_is_refused() -> None:
    with pytest.raises(RuntimeError, match="reused"):

        class Dup(BooklineError):  # pragma: no cover - defining it is the test
            code = 7
            name = "DUP"


def test_invariant_survives_optimisation_flag() -> None:
    newer, older = 3, 5
    with pytest.raises(errors.InvariantViolation, match="entry 3 after 5"):
        invariant(newer > older, "entry %d after %d", newer, older)
    invariant(True, "never formatted %d")


def test_load_config_precedence(tmp_path: Path) -> None:
    path = tmp_path / "bookline.toml"
    path.write_text('[metadata]\nzk = "10.0.0.1:2181"\nsession_timeout_ms = 5000\n')
    cfg = load_config(
        MetadataConfig,
        path=path,
        section="metadata",
        env_prefix="BOOKLINE_METADATA_",
        environ={"BOOKLINE_METADATA_SESSION_TIMEOUT_MS": "7000", "BOOKLINE_METADATA_ROOT": "/x"},
        overrides={"root": "/y", "zk": None},
    )
    assert cfg.zk == "10.0.0.1:2181"  # file; the None override means "flag not given"
    assert cfg.session_timeout_ms == 7000  # env beats file
    assert cfg.root == "/y"  # flags beat env
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.zk = "other"  # type: ignore[misc]


def test_load_config_rejects_unknown_and_bad_values(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text("[bookie]\nprot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'prot'"):
        load_config(BookieConfig, path=path, section="bookie")
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(BookieConfig, overrides={"port": "eighty"})
    with pytest.raises(ConfigError, match="disk thresholds"):
        load_config(BookieConfig, overrides={"disk_usage_lwm": 0.99, "disk_usage_threshold": 0.9})
    (tmp_path / "bad.toml").write_text("[bookie\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(BookieConfig, path=tmp_path / "bad.toml")
