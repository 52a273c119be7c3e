"""Pure tests of the ledger client's leaves: digest packaging, write sets, placement, config."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import ChecksumError, ConfigError, InvariantViolation, NotEnoughBookiesError
from ledger.config import LedgerConfig
from ledger.digest import HEADER_BYTES, DigestManager, DigestType, mac_key, master_key
from ledger.placement import (
    BookieCandidate,
    BookieHealth,
    choose_ensemble,
    choose_replacement,
    write_set,
    write_sets_containing,
)

digest_types = st.sampled_from(list(DigestType))
ledger_ids = st.integers(min_value=0, max_value=(1 << 64) - 1)


@st.composite
def entries(draw: st.DrawFn) -> tuple[int, int, int, bytes]:
    entry_id = draw(st.integers(min_value=0, max_value=(1 << 62)))
    lac = draw(st.integers(min_value=-1, max_value=entry_id - 1))
    payload = draw(st.binary(max_size=512))
    length = draw(st.integers(min_value=len(payload), max_value=1 << 62))
    return entry_id, lac, length, payload


@given(ledger_ids, digest_types, st.binary(max_size=32), entries())
def test_package_verify_roundtrip(
    ledger_id: int, dtype: DigestType, password: bytes, entry: tuple[int, int, int, bytes]
) -> None:
    entry_id, lac, length, payload = entry
    dm = DigestManager(ledger_id, dtype, password)
    blob = dm.package(entry_id, lac, length, payload)
    assert len(blob) == HEADER_BYTES + dtype.digest_bytes + len(payload)
    out = dm.verify(blob, expected_entry_id=entry_id)
    assert (out.entry_id, out.lac, out.length, out.payload) == (entry_id, lac, length, payload)


@given(ledger_ids, digest_types, entries(), st.data())
def test_any_bit_flip_is_detected(
    ledger_id: int, dtype: DigestType, entry: tuple[int, int, int, bytes], data: st.DataObject
) -> None:
    entry_id, lac, length, payload = entry
    dm = DigestManager(ledger_id, dtype, b"pw")
    blob = bytearray(dm.package(entry_id, lac, length, payload))
    bit = data.draw(st.integers(min_value=0, max_value=len(blob) * 8 - 1))
    blob[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ChecksumError):
        dm.verify(bytes(blob))


@given(ledger_ids, digest_types, entries(), st.data())
def test_truncation_is_detected(
    ledger_id: int, dtype: DigestType, entry: tuple[int, int, int, bytes], data: st.DataObject
) -> None:
    entry_id, lac, length, payload = entry
    dm = DigestManager(ledger_id, dtype, b"pw")
    blob = dm.package(entry_id, lac, length, payload)
    cut = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    with pytest.raises(ChecksumError):
        dm.verify(blob[:cut])


def test_wrong_entry_wrong_ledger_and_wrong_password() -> None:
    dm = DigestManager(7, DigestType.CRC32C, b"pw")
    blob = dm.package(3, 2, 10, b"hello")
    with pytest.raises(ChecksumError, match="asked for entry 4"):
        dm.verify(blob, expected_entry_id=4)
    with pytest.raises(ChecksumError, match="ledger"):
        DigestManager(8, DigestType.CRC32C, b"pw").verify(blob)
    with pytest.raises(ChecksumError, match="digest type"):
        DigestManager(7, DigestType.HMAC_SHA256, b"pw").verify(blob)
    hm = DigestManager(7, DigestType.HMAC_SHA256, b"secret")
    signed = hm.package(0, -1, 1, b"x")
    with pytest.raises(ChecksumError, match="digest mismatch"):
        DigestManager(7, DigestType.HMAC_SHA256, b"guess").verify(signed)


def test_keys_are_separated_and_deterministic() -> None:
    assert master_key(b"pw") == master_key(b"pw")
    assert master_key(b"pw") != master_key(b"pw2")
    assert master_key(b"pw") != mac_key(b"pw")
    assert len(master_key(b"")) == 32


def test_package_checks_its_invariants() -> None:
    dm = DigestManager(1, DigestType.CRC32C, b"")
    with pytest.raises(InvariantViolation):
        dm.package(5, 5, 10, b"")  # LAC must be below the entry id
    with pytest.raises(InvariantViolation):
        dm.package(5, 1, 1, b"ab")  # cumulative length covers this payload


def test_digest_type_parse() -> None:
    assert DigestType.parse("crc32c") is DigestType.CRC32C
    assert DigestType.parse("HMAC-SHA256") is DigestType.HMAC_SHA256
    assert DigestType.parse(1) is DigestType.HMAC_SHA256
    with pytest.raises(ConfigError):
        DigestType.parse("md5")


@given(st.integers(min_value=1, max_value=9), st.data())
def test_write_set_math(ensemble: int, data: st.DataObject) -> None:
    qw = data.draw(st.integers(min_value=1, max_value=ensemble))
    entry_id = data.draw(st.integers(min_value=0, max_value=10**9))
    ws = write_set(entry_id, ensemble, qw)
    assert ws == [(entry_id + k) % ensemble for k in range(qw)]
    assert len(set(ws)) == qw
    assert write_set(entry_id + ensemble, ensemble, qw) == ws
    # Every position belongs to exactly Qw distinct write sets (or all of them when Qw = E).
    for pos in range(ensemble):
        sets = write_sets_containing(pos, ensemble, qw)
        assert all(pos in s for s in sets)
        assert len(sets) == (1 if qw == ensemble else qw)


def test_write_set_examples() -> None:
    assert write_set(0, 3, 2) == [0, 1]
    assert write_set(2, 3, 2) == [2, 0]
    assert write_set(4, 5, 3) == [4, 0, 1]


def _cands(n: int, racks: int = 0) -> list[BookieCandidate]:
    return [BookieCandidate(f"b{i}", f"r{i % racks}" if racks else "") for i in range(n)]


@settings(max_examples=50)
@given(st.integers(min_value=0, max_value=2**32))
def test_choose_ensemble_spreads_racks_and_avoids_failing(seed: int) -> None:
    rng = random.Random(seed)
    cands = _cands(9, racks=3)
    ens = choose_ensemble(cands, 3, avoid=set(), rng=rng)
    assert len(set(ens)) == 3
    racks = {c.bookie_id: c.rack for c in cands}
    assert len({racks[b] for b in ens}) == 3, f"seed={seed}"
    avoid = {"b0", "b1", "b2", "b3", "b4", "b5"}
    ens = choose_ensemble(cands, 3, avoid=avoid, rng=rng)
    assert not set(ens) & avoid, f"seed={seed}"
    # Not enough healthy ones: fall back to avoided ones rather than fail.
    ens = choose_ensemble(cands[:4], 4, avoid={"b0"}, rng=rng)
    assert sorted(ens) == ["b0", "b1", "b2", "b3"]
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(cands[:2], 3, avoid=set(), rng=rng)


@settings(max_examples=50)
@given(st.integers(min_value=0, max_value=2**32))
def test_choose_replacement(seed: int) -> None:
    rng = random.Random(seed)
    cands = _cands(6, racks=3)  # b0 r0, b1 r1, b2 r2, b3 r0, b4 r1, b5 r2
    racks = {c.bookie_id: c.rack for c in cands}
    ens = ["b0", "b1", "b2"]
    new = choose_replacement(cands, ens, 1, 2, avoid=set(), racks=racks, rng=rng)
    assert new not in ens
    # Position 1 shares write sets with b0 (r0) and b2 (r2): r1 is the rack to pick.
    assert racks[new] == "r1", f"seed={seed}"
    new = choose_replacement(cands, ens, 1, 2, avoid={"b4"}, racks=racks, rng=rng)
    assert new != "b4", f"seed={seed}"
    with pytest.raises(NotEnoughBookiesError):
        choose_replacement(cands[:3], ens, 0, 2, avoid=set(), racks=racks, rng=rng)


def test_health_orders_replicas() -> None:
    now = [100.0]
    h = BookieHealth(avoid_ms=1_000, clock=lambda: now[0])
    h.record_success("a", 0.010)
    h.record_success("b", 0.001)
    h.record_failure("c")
    assert h.order(["a", "b", "c"]) == [1, 0, 2]
    assert h.avoided() == {"c"}
    now[0] += 2.0
    assert h.avoided() == set()
    assert h.order(["c", "a"]) == [0, 1]  # unknown latency counts as fast once forgiven


def test_config_validation() -> None:
    LedgerConfig()
    with pytest.raises(ConfigError):
        LedgerConfig(ensemble_size=2, write_quorum=3)
    with pytest.raises(ConfigError):
        LedgerConfig(ack_quorum=0)
    with pytest.raises(ConfigError):
        LedgerConfig(add_timeout_ms=0)
    with pytest.raises(ConfigError):
        LedgerConfig(speculative_read_first_timeout_ms=100, speculative_read_max_timeout_ms=10)
    with pytest.raises(ConfigError):
        LedgerConfig(digest_type="md5")


def test_one_digest_vocabulary_for_every_config_and_the_metadata() -> None:
    from metadata.ledger_metadata import DigestType
    from streams.config import NamespaceConfig

    for name in ("crc32c", "CRC32C"):
        assert DigestType.parse(name) is DigestType.CRC32C
    for name in ("hmac", "hmac_sha256", "HMAC"):
        assert DigestType.parse(name) is DigestType.HMAC_SHA256
        assert LedgerConfig(digest_type=name).digest_type == name
        assert NamespaceConfig(digest_type=name).ledger_digest is DigestType.HMAC_SHA256
    with pytest.raises(ConfigError, match=r"core\.digest_type"):
        NamespaceConfig(digest_type="md5")
    with pytest.raises(ConfigError, match=r"ledger\.digest_type"):
        LedgerConfig(digest_type="md5")
