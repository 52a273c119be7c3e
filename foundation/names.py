"""Validation of every name that becomes a znode or a file name.

Accepted: 1..``NAME_CHARS_MAX`` characters drawn from letters and digits (Unicode
``isalnum``) and ``. _ - : @ + =``, with no reserved prefix. Rejected with a clear
:class:`~foundation.errors.InvalidNameError`: empty names, ``/`` and ``\\``, ``.`` and
``..``, NUL and other control or format characters, whitespace, the reserved prefixes
``.`` and ``<``, ZooKeeper's reserved ``zookeeper``, and names longer than the limit.
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
