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
}


def test_codes_are_pinned_and_unique() -> None:
    registry = errors.registered_codes()
    by_name = {cls.name: code for code, cls in registry.items()}
    for name, code in PINNED.items():
        assert by_name[name] == code
    assert len(set(by_name.values())) == len(by_name)


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
    with pytest.raises(errors.InvariantViolation, match="entry 3 after 5"):
        newer, older = 3, 5
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
    with pytest.raises(ConfigError, match="not valid TOML"):
        (tmp_path / "bad.toml").write_text("[bookie\n")
        load_config(BookieConfig, path=tmp_path / "bad.toml")
