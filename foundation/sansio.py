"""What the sans-I/O decoders (the bookie protocol's, the Kafka protocol's) share. Pure.

A decoder is fed bytes and asked for the next whole frame; until one is whole it
answers :data:`NEED_DATA`, one object compared by identity (h11's sentinel style).
"""

from __future__ import annotations

from typing import Final

__all__ = ["NEED_DATA", "NeedData"]


class NeedData:
    """Sentinel type: the decoder needs more bytes before it can return a frame."""

    _instance: NeedData | None = None

    def __new__(cls) -> NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()
