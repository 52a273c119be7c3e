"""Positions in HTTP: DLSNs as ``"seg:entry:slot"`` text and read start positions,
parsed straight into the core's types (:class:`streams.dlsn.DLSN`,
:class:`streams.dlsn.StartPosition`). Pure."""

from __future__ import annotations

from streams.dlsn import StartPosition, parse_dlsn

__all__ = ["format_dlsn", "parse_dlsn", "parse_position"]

# A read's ``from``: earliest, latest, dlsn:S:E:S (or bare S:E:S), seq:N, txid:N, time:MS.
parse_position = StartPosition.parse


def format_dlsn(dlsn: tuple[int, int, int]) -> str:
    return f"{dlsn[0]}:{dlsn[1]}:{dlsn[2]}"
