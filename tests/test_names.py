"""A corpus of names that must be rejected or accepted by foundation.names."""

from __future__ import annotations

import pytest

from foundation.errors import InvalidNameError
from foundation.names import NAME_CHARS_MAX, is_valid_name, validate_name

BAD_NAMES = [
    "",
    ".",
    "..",
    "../etc",
    "a/../b",
    "a/b",
    "/abs",
    "a\\b",
    "..\\x",
    "a\x00b",
    "\x00",
    "tab\there",
    "new\nline",
    "cr\rhere",
    "esc\x1b[0m",
    "del\x7f",
    "c1\x85ctrl",
    "zero\u200bwidth",  # format character
    "rtl\u202eoverride",
    "space here",
    "nbsp\u00a0x",
    ".hidden",
    ".snapshot",
    "<reserved",
    "<",
    "zookeeper",
    "ZooKeeper",
    "a" * 1000,
    "a" * (NAME_CHARS_MAX + 1),
    "quote'",
    'dq"',
    "star*",
    "q?",
    "semi;colon",
    "pipe|x",
    "dollar$x",
]

GOOD_NAMES = [
    "a",
    "stream-1",
    "my_stream.v2",
    "bookie-127.0.0.1:3181",
    "user@host",
    "k=v+w",
    "a..b",  # dots inside a name are not traversal
    "x.",
    "Ünïcödé",
    "流",
    "a" * NAME_CHARS_MAX,
    "0",
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_names_rejected(name: str) -> None:
    with pytest.raises(InvalidNameError) as err:
        validate_name(name, "stream")
    assert "stream" in err.value.message
    assert not is_valid_name(name)


@pytest.mark.parametrize("name", GOOD_NAMES, ids=repr)
def test_good_names_accepted(name: str) -> None:
    assert validate_name(name) == name
    assert is_valid_name(name)


@pytest.mark.parametrize("value", [None, 5, b"bytes", ["a"]])
def test_non_strings_rejected(value: object) -> None:
    with pytest.raises(InvalidNameError, match="must be a string"):
        validate_name(value)


def test_error_messages_say_why() -> None:
    with pytest.raises(InvalidNameError, match="reserved prefix"):
        validate_name(".x")
    with pytest.raises(InvalidNameError, match="at most"):
        validate_name("a" * 1000)
    with pytest.raises(InvalidNameError, match="NUL"):
        validate_name("a\x00")
    with pytest.raises(InvalidNameError, match="separator"):
        validate_name("a/b")


def test_internal_stream_names_for_topics_and_groups() -> None:
    from foundation.names import (
        group_stream,
        is_internal,
        parse_internal,
        partition_stream,
        validate_stream_name,
    )

    assert partition_stream("orders", 3) == "orders~3"
    assert group_stream("billing") == "billing~group"
    assert parse_internal("orders~3") == ("partition", "orders", 3)
    assert parse_internal("a~b~12") is None  # the topic part must be a valid name
    assert parse_internal("billing~group") == ("group", "billing", None)
    for bad in ("orders~03", "orders~", "~3", "orders~x", "orders~99999", "orders"):
        assert parse_internal(bad) is None, bad
    assert validate_stream_name("orders~3") == "orders~3"
    assert validate_stream_name("plain") == "plain"
    assert is_internal("orders~0")
    assert not is_internal("orders")
    for bad in ("orders~03", "x~y", "~group"):
        with pytest.raises(InvalidNameError):
            validate_stream_name(bad)
    # users can never name a stream like an internal one
    with pytest.raises(InvalidNameError):
        validate_name("orders~3")
    with pytest.raises(InvalidNameError):
        partition_stream("orders", -1)
    with pytest.raises(InvalidNameError):
        partition_stream("bad/topic", 0)
