"""Numbered files of a storage directory (journal files, entry logs): ``<id:016x><suffix>``."""

from __future__ import annotations

import contextlib
from pathlib import Path


def numbered_name(file_id: int, suffix: str) -> str:
    return f"{file_id:016x}{suffix}"


def list_numbered(directory: Path, suffix: str) -> list[int]:
    """Ids of the ``suffix`` files in ``directory``, sorted; other names are ignored."""
    ids = []
    for p in directory.iterdir():
        if p.name.endswith(suffix):
            with contextlib.suppress(ValueError):  # not one of ours: leave it alone
                ids.append(int(p.name[: -len(suffix)], 16))
    return sorted(ids)
