"""Positions in HTTP: DLSNs as ``"seg:entry:slot"`` text and read start positions. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from foundation.errors import BadRequestError

__all__ = ["DlsnTuple", "Position", "format_dlsn", "parse_dlsn", "parse_position"]

DlsnTuple = tuple[int, int, int]


def parse_dlsn(text: str) -> DlsnTuple:
    parts = text.split(":")
    if len(parts) != 3:
        raise BadRequestError(f"{text!r} is not a DLSN 'segment:entry:slot'")
    try:
        seg, entry, slot = (int(p) for p in parts)
    except ValueError as exc:
        raise BadRequestError(f"{text!r} is not a DLSN 'segment:entry:slot'") from exc
    if seg < 0 or entry < 0 or slot < 0:
        raise BadRequestError(f"{text!r}: DLSN parts must be non-negative")
    return seg, entry, slot


def format_dlsn(dlsn: DlsnTuple) -> str:
    return f"{dlsn[0]}:{dlsn[1]}:{dlsn[2]}"


@dataclass(frozen=True, slots=True)
class Position:
    """A read start: ``earliest``, ``latest``, ``dlsn:s:e:s`` (or bare ``s:e:s``),
    ``seq:N``, ``txid:N`` or ``time:MS``."""

    kind: str  # earliest | latest | dlsn | seq | txid | time
    dlsn: DlsnTuple | None = None
    value: int | None = None

    def __str__(self) -> str:
        if self.kind in ("earliest", "latest"):
            return self.kind
        if self.kind == "dlsn":
            assert self.dlsn is not None
            return f"dlsn:{format_dlsn(self.dlsn)}"
        return f"{self.kind}:{self.value}"


def parse_position(text: str | None) -> Position:
    if text is None or text in {"", "earliest"}:
        return Position("earliest")
    if text == "latest":
        return Position("latest")
    kind, sep, rest = text.partition(":")
    if sep and kind in ("seq", "txid", "time"):
        try:
            value = int(rest)
        except ValueError as exc:
            raise BadRequestError(f"position {text!r}: {kind} needs an integer") from exc
        if value < 0:
            raise BadRequestError(f"position {text!r} must be non-negative")
        return Position(kind, value=value)
    if kind == "dlsn":
        return Position("dlsn", dlsn=parse_dlsn(rest))
    if text.count(":") == 2:
        return Position("dlsn", dlsn=parse_dlsn(text))
    raise BadRequestError(
        f"position {text!r}: expected earliest, latest, DLSN, seq:N, txid:N or time:MS"
    )
