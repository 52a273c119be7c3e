"""Read positions as text parse straight into the core's StartPosition (issue 23: one
read-position type; the HTTP layer's Position and the read proxy's to_start are gone)."""

from __future__ import annotations

import pytest

from foundation.errors import BadRequestError
from groups.offsets import parse_at
from httpapi.positions import parse_position
from streams.dlsn import DLSN, StartPosition


@pytest.mark.parametrize(
    ("text", "start"),
    [
        (None, StartPosition.earliest()),
        ("latest", StartPosition.latest()),
        ("dlsn:1:2:3", StartPosition.dlsn(DLSN(1, 2, 3))),
        ("1:2:3", StartPosition.dlsn(DLSN(1, 2, 3))),
        ("seq:7", StartPosition.sequence(7)),
        ("txid:8", StartPosition.txid(8)),
        ("time:9", StartPosition.timestamp(9)),
    ],
)
def test_text_parses_into_the_core_type_and_back(text: str | None, start: StartPosition) -> None:
    assert parse_position(text) == start
    assert StartPosition.parse(str(start)) == start


def test_groups_lookups_take_the_same_text() -> None:
    assert parse_at("time:5") == StartPosition.timestamp(5)
    assert parse_at("earliest") == StartPosition.earliest()
    for bad in ("seq:1", "", "time:x", "1:2:3"):
        with pytest.raises(BadRequestError, match="expected earliest, latest or time:MS"):
            parse_at(bad)
