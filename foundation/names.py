"""Validation of every name that becomes a znode or a file name.

Accepted: 1..``NAME_CHARS_MAX`` characters drawn from letters and digits (Unicode
``isalnum``) and ``. _ - : @ + =``, with no reserved prefix. Rejected with a clear
:class:`~foundation.errors.InvalidNameError`: empty names, ``/`` and ``\\``, ``.`` and
``..``, NUL and other control or format characters, whitespace, the reserved prefixes
``.`` and ``<``, ZooKeeper's reserved ``zookeeper``, names longer than the limit, and
names that are not in Unicode normal form NFKC (fullwidth letters, ligatures: lookalikes
of other names).
"""

from __future__ import annotations

import unicodedata

from foundation.errors import InvalidNameError

# 200 characters keep a name (at up to 4 UTF-8 bytes each... in practice ASCII) well
# under the 255-byte file-name limit and ZooKeeper's path budget.
NAME_CHARS_MAX = 200
NAME_BYTES_MAX = 255
_EXTRA_CHARS = frozenset("._-:@+=")
_RESERVED_PREFIXES = (".", "<")
_RESERVED_NAMES = frozenset({"zookeeper"})


def validate_name(name: object, kind: str = "name") -> str:
    """Return ``name`` unchanged when valid; raise InvalidNameError saying why otherwise."""
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidNameError(f"{kind} must not be empty")
    if len(name) > NAME_CHARS_MAX or len(name.encode("utf-8", "surrogatepass")) > NAME_BYTES_MAX:
        raise InvalidNameError(
            f"{kind} is {len(name)} characters long; at most {NAME_CHARS_MAX} are allowed"
        )
    if name in (".", ".."):
        raise InvalidNameError(f"{kind} {name!r} is a path component, not a name")
    for ch in name:
        if ch in "/\\":
            raise InvalidNameError(f"{kind} {name!r} contains a path separator {ch!r}")
        if ch == "\x00":
            raise InvalidNameError(f"{kind} contains a NUL character")
        category = unicodedata.category(ch)
        if category[0] in ("C", "Z"):
            raise InvalidNameError(
                f"{kind} {name!r} contains a control, format or space character (U+{ord(ch):04X})"
            )
        if not (ch.isalnum() or ch in _EXTRA_CHARS):
            raise InvalidNameError(
                f"{kind} {name!r} contains {ch!r}; allowed are letters, digits and "
                f"{''.join(sorted(_EXTRA_CHARS))}"
            )
    if unicodedata.normalize("NFKC", name) != name:
        # Fullwidth letters, ligatures, superscripts...: shown like other names (or
        # equal to them once normalized), they would let one name pass for another.
        raise InvalidNameError(
            f"{kind} {name!r} is not in Unicode normal form NFKC "
            f"({unicodedata.normalize('NFKC', name)!r} is)"
        )
    if name.startswith(_RESERVED_PREFIXES):
        raise InvalidNameError(f"{kind} {name!r} starts with a reserved prefix ('.' or '<')")
    if name.lower() in _RESERVED_NAMES:
        raise InvalidNameError(f"{kind} {name!r} is reserved")
    return name


def is_valid_name(name: object) -> bool:
    try:
        validate_name(name)
    except InvalidNameError:
        return False
    return True


# -- internal stream names -----------------------------------------------------------
# Streams Bookline creates for topics and groups carry ``~``, which is outside the
# user-name alphabet, so no user stream can ever collide with one:
#   partition p of topic t     ->  "t~p"
#   the log of consumer group g ->  "g~group"
INTERNAL_SEPARATOR = "~"
GROUP_STREAM_SUFFIX = "group"
# Partitions per topic: each is a stream with its own writer, lock and segments.
PARTITIONS_MAX = 10_000


def partition_stream(topic: str, partition: int) -> str:
    validate_name(topic, "topic")
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise InvalidNameError(f"partition must be an int, got {partition!r}")
    if not 0 <= partition < PARTITIONS_MAX:
        raise InvalidNameError(f"partition {partition} is outside 0..{PARTITIONS_MAX - 1}")
    return f"{topic}{INTERNAL_SEPARATOR}{partition}"


def group_stream(group: str) -> str:
    return f"{validate_name(group, 'group')}{INTERNAL_SEPARATOR}{GROUP_STREAM_SUFFIX}"


def parse_internal(name: str) -> tuple[str, str, int | None] | None:
    """``("partition", topic, p)`` or ``("group", group, None)`` for an internal stream
    name, None for a user stream name (or anything else)."""
    base, sep, tail = name.rpartition(INTERNAL_SEPARATOR)
    if not sep or not is_valid_name(base):
        return None
    if tail == GROUP_STREAM_SUFFIX:
        return ("group", base, None)
    if tail.isascii() and tail.isdigit() and (tail == "0" or not tail.startswith("0")):
        p = int(tail)
        if p < PARTITIONS_MAX:
            return ("partition", base, p)
    return None


def validate_stream_name(name: object, kind: str = "stream") -> str:
    """A stream name as stored: a user name, or an internal one (a topic's partition,
    a group's log). User-facing APIs use :func:`validate_name` instead."""
    if isinstance(name, str) and INTERNAL_SEPARATOR in name:
        if parse_internal(name) is None:
            raise InvalidNameError(
                f"{kind} {name!r} contains {INTERNAL_SEPARATOR!r}, which only partition and "
                "group streams use"
            )
        return name
    return validate_name(name, kind)


def is_internal(name: str) -> bool:
    return parse_internal(name) is not None
