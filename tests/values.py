"""Record payloads for tests that wrote no null value (issue 24: a payload may be None)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def values(records: Iterable[Any]) -> list[bytes]:
    """The records' payloads; a null one fails the test (it wrote none)."""
    out = [r.payload for r in records]
    assert None not in out, "a null value where the test wrote none"
    return out


def value(record: Any) -> bytes:
    payload = record.payload
    assert payload is not None, "a null value where the test wrote none"
    return bytes(payload)
