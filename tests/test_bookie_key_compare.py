"""Ledger master keys are compared in constant time (issue 21, defect 8).

``docs/security.md`` promises it; storage compared keys with ``!=`` (an early exit on the
first differing byte), in ``bookie/storage/writes.py`` (ADD, fence) and
``bookie/storage/lac.py`` (WRITE_LAC). Every refusal of a wrong key must come from
``hmac.compare_digest``.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bookie.storage.engine import BookieStorage
from foundation.errors import UnauthorizedError
from tests.test_bookie_storage import KEY, make_config, payload

_real_compare = hmac.compare_digest


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[BookieStorage]:
    s = BookieStorage(make_config(tmp_path))
    await s.start()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, bytes]]:
    """Every pair of byte strings hmac.compare_digest is asked about."""
    calls: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((bytes(a), bytes(b)))
        return _real_compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    return calls


async def test_a_wrong_master_key_is_refused_by_a_constant_time_comparison(
    storage: BookieStorage, compared: list[tuple[bytes, bytes]]
) -> None:
    await storage.add_entry(1, 0, -1, KEY, payload(1, 0))
    wrong = b"other-key!"
    refusals: dict[str, Callable[[], object]] = {
        "ADD": lambda: storage.add_entry(1, 1, 0, wrong, payload(1, 1)),
        "fence": lambda: storage.fence(1, wrong),
    }
    for what, attempt in refusals.items():
        compared.clear()
        with pytest.raises(UnauthorizedError):
            await attempt()  # type: ignore[misc]
        assert {KEY, wrong} <= {x for pair in compared for x in pair}, what
    compared.clear()
    with pytest.raises(UnauthorizedError):
        storage.write_lac(1, 0, wrong)
    assert {KEY, wrong} <= {x for pair in compared for x in pair}, "WRITE_LAC"
