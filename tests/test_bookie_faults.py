"""The test-only storage fault shim (bookie/storage/faults.py) and its offline helpers.

In-process: a power cut is ``abort()`` (what kill -9 leaves) followed by
``FaultShim.cut_power()`` (drop what was never fsynced). Process bookies get the same
with ``fault_shim = "power-cut"`` and kill -9 (tests/test_power_cut.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookie.config import BookieConfig
from bookie.storage import faults
from bookie.storage.engine import BookieStorage
from foundation.errors import (
    ConfigError,
    IOFailureError,
    NoEntryError,
    NoLedgerError,
    ReadOnlyError,
)
from tests.test_bookie_storage import KEY, add_all, check_all, make_config, payload


def shim_of(s: BookieStorage) -> faults.FaultShim:
    assert isinstance(s.io, faults.FaultShim)
    return s.io


async def power_cut(s: BookieStorage) -> BookieStorage:
    """Crash ``s`` as a power cut would, and start a fresh storage on its directories."""
    await s.abort()
    shim_of(s).cut_power()
    new = BookieStorage(s.config)
    await new.start()
    return new


@contextlib.contextmanager
def _new_file(shim: faults.FaultShim, path: Path) -> Iterator[int]:
    """A file created through ``shim``, open for the block (closed through it after)."""
    fd = shim.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        yield fd
    finally:
        shim.close(fd)


def test_off_is_the_os_functions(tmp_path: Path) -> None:
    """Zero cost when off: the layer's functions are the os functions themselves."""
    s = BookieStorage(make_config(tmp_path))
    assert s.io is faults.REAL_IO
    assert s.io.pwrite is os.pwrite
    assert s.io.pread is os.pread
    assert s.io.pwritev is os.pwritev
    assert s.io.fallocate is os.posix_fallocate
    with pytest.raises(ConfigError):
        make_config(tmp_path, fault_shim="lightning")
    with pytest.raises(ConfigError):
        make_config(tmp_path, fault_disk_bytes_max=-1)


def test_overlay_is_read_back_and_applied_only_at_fsync(tmp_path: Path) -> None:
    shim = faults.FaultShim(faults.POWER_CUT, [tmp_path])
    fsync = shim.wrap_fsync(os.fdatasync)
    path = tmp_path / "f"
    with _new_file(shim, path) as fd:
        shim.pwrite(fd, b"hello world", 0)
        shim.pwritev(fd, [b"HE", b"LLO"], 0)
        assert path.read_bytes() == b""  # nothing reached the file
        assert shim.pread(fd, 100, 0) == b"HELLO world"
        assert shim.pread(fd, 3, 6) == b"wor"
        assert shim.unsynced_bytes() == 16
        fsync(fd)
        assert path.read_bytes() == b"HELLO world"
        shim.pwrite(fd, b"!!", 11)
        assert shim.cut_power() == 2
        assert shim.pread(fd, 100, 0) == b"HELLO world"


def test_fsync_error_drops_the_unsynced_writes(tmp_path: Path) -> None:
    shim = faults.FaultShim(faults.POWER_CUT, [tmp_path])
    fsync = shim.wrap_fsync(os.fdatasync)
    with _new_file(shim, tmp_path / "f") as fd:
        shim.pwrite(fd, b"lost", 0)
        shim.fail_fsync(errno.EIO)
        with pytest.raises(OSError, match=r"Errno 5\]") as info:
            fsync(fd)
        assert info.value.errno == errno.EIO
        shim.fail_fsync(None)
        fsync(fd)
        assert (tmp_path / "f").read_bytes() == b""


def test_simulated_disk_size_and_ballast(tmp_path: Path) -> None:
    shim = faults.FaultShim(faults.ON, [tmp_path], disk_bytes_max=1 << 20)
    assert shim.disk_space(tmp_path) == (1 << 20, 1 << 20)
    ballast = faults.fill_disk(tmp_path, 1000 << 10)
    assert shim.disk_space(tmp_path).free_bytes == (1 << 20) - (1000 << 10)
    with _new_file(shim, tmp_path / "f") as fd:
        shim.fallocate(fd, 0, 10 << 10)  # fits
        with pytest.raises(OSError, match=r"Errno 28\]") as info:
            shim.fallocate(fd, 0, 100 << 10)
        assert info.value.errno == errno.ENOSPC
        with pytest.raises(OSError, match=r"Errno 28\]"):
            shim.pwrite(fd, bytes(100 << 10), 0)
        ballast.unlink()
        shim.fallocate(fd, 0, 100 << 10)


def test_control_file_steers_a_running_shim(tmp_path: Path) -> None:
    shim = faults.FaultShim(faults.ON, [tmp_path], control_dir=tmp_path)
    fsync = shim.wrap_fsync(lambda fd: None)
    with _new_file(shim, tmp_path / "f") as fd:
        fsync(fd)
        (tmp_path / faults.CONTROL_FILE).write_text('fsync_error = "EIO"\ndisk_bytes_max = 4096\n')
        with pytest.raises(OSError, match=r"Errno 5\]"):
            fsync(fd)
        assert shim.disk_space(tmp_path).total_bytes == 4096
        (tmp_path / faults.CONTROL_FILE).write_text("fsync_delay_ms = 50\n")
        started = time.monotonic()
        fsync(fd)  # a slow disk: never faster than the delay (a lower bound only)
        assert time.monotonic() - started >= 0.05
        (tmp_path / faults.CONTROL_FILE).unlink()
        fsync(fd)
        assert shim.disk_space(tmp_path).total_bytes > 4096
        assert shim.fsync_delay_s == 0


def test_offline_damage_helpers(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(16)) * 512)
    faults.flip_bit(path, 3, 7)
    assert path.read_bytes()[3] == 3 ^ 0x80
    faults.zero_block(path, 4000, 200)
    data = path.read_bytes()
    assert data[4000:4200] == bytes(200)
    assert data[4200] == 4200 % 16
    faults.truncate(path, 100)
    assert path.stat().st_size == 100
    with pytest.raises(ValueError, match="has no byte at offset 100"):
        faults.flip_bit(path, 100)


# --- the shim under the storage engine ------------------------------------------------


async def test_power_cut_keeps_every_fsynced_entry(tmp_path: Path) -> None:
    config = make_config(tmp_path, fault_shim="power-cut", entry_log_bytes_max=64 << 10)
    s = BookieStorage(config)
    await s.start()
    try:
        await add_all(s, 1, range(200), size=500)
        await s.checkpoint()  # entry logs + index + mark
        await add_all(s, 1, range(200, 300), size=500)  # journal only
        await add_all(s, 2, range(50))
        s = await power_cut(s)
        await check_all(s, 1, range(300), size=500)
        await check_all(s, 2, range(50))
        s = await power_cut(s)  # again, after the replay's own checkpoint
        await check_all(s, 1, range(300), size=500)
    finally:
        await s.close()


async def test_power_cut_loses_what_was_acknowledged_without_fsync(tmp_path: Path) -> None:
    """The control: a bookie acknowledging without journal fsync loses acknowledged
    entries in a power cut (while kill -9 alone would keep them in the page cache)."""
    config = make_config(tmp_path, fault_shim="power-cut", journal_sync=False)
    s = BookieStorage(config)
    await s.start()
    try:
        await add_all(s, 1, range(20))
        await s.checkpoint()
        await add_all(s, 1, range(20, 100))  # acknowledged, never fsynced
        assert shim_of(s).unsynced_bytes() > 80 * 100
        s = await power_cut(s)
        await check_all(s, 1, range(20))
        with pytest.raises(NoEntryError):
            await s.read_entry(1, 20)
    finally:
        await s.close()
    # Without the shim, kill -9 alone keeps the page cache: nothing is lost.
    config = dataclasses.replace(
        config,
        fault_shim="",
        journal_dir=str(tmp_path / "j2"),
        ledgers_dir=str(tmp_path / "l2"),
        index_dir=str(tmp_path / "i2"),
    )
    s = BookieStorage(config)
    await s.start()
    await add_all(s, 2, range(50))
    await s.abort()
    s = BookieStorage(config)
    await s.start()
    try:
        await check_all(s, 2, range(50))
    finally:
        await s.close()


async def test_power_cut_before_a_ledgers_first_fsync(tmp_path: Path) -> None:
    config = make_config(tmp_path, fault_shim="power-cut", journal_sync=False)
    s = BookieStorage(config)
    await s.start()
    try:
        await add_all(s, 9, range(5))
        s = await power_cut(s)
        with pytest.raises(NoLedgerError):
            await s.read_entry(9, 0)
    finally:
        await s.close()


async def test_injected_fsync_eio_is_fatal_and_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, fault_shim="power-cut")
    fatal: list[BaseException] = []
    s = BookieStorage(config, on_fatal=fatal.append)
    await s.start()
    try:
        await add_all(s, 1, range(30))
        shim_of(s).fail_fsync(errno.EIO)
        results = await asyncio.gather(
            *(s.add_entry(1, e, e - 1, KEY, payload(1, e)) for e in range(30, 40)),
            return_exceptions=True,
        )
        assert all(isinstance(r, IOFailureError) for r in results), results
        assert len(fatal) == 1
        shim_of(s).fail_fsync(None)
        s = await power_cut(s)
        await check_all(s, 1, range(30))
    finally:
        await s.close()


def test_shim_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from foundation.config import load_config

    monkeypatch.setenv("BOOKLINE_BOOKIE_FAULT_SHIM", "power-cut")
    monkeypatch.setenv("BOOKLINE_BOOKIE_FAULT_DISK_BYTES_MAX", "123456")
    cfg = load_config(BookieConfig, path=None, section="bookie", env_prefix="BOOKLINE_BOOKIE_",
                      overrides={})  # fmt: skip
    assert (cfg.fault_shim, cfg.fault_disk_bytes_max) == ("power-cut", 123456)


# --- a small journal disk (defect 10) ---------------------------------------------------

DISK_BYTES = 16 << 20
ENTRY_BYTES = 10_000


def _small_journal_disk(tmp_path: Path) -> BookieConfig:
    return make_config(tmp_path, fault_shim="on", fault_disk_bytes_max=DISK_BYTES,
                       journal_prealloc_bytes=1 << 20, memtable_flush_bytes=64 << 20,
                       memtable_bytes_max=64 << 20)  # fmt: skip


async def _add_until_refused(s: BookieStorage, ledger_id: int, first: int) -> tuple[int, Exception]:
    """Add entries in groups of 10 until one is refused; (next entry id, the error)."""
    e = first
    while e < first + 5000:
        results = await asyncio.gather(
            *(s.add_entry(ledger_id, i, i - 1, KEY, payload(ledger_id, i, ENTRY_BYTES))
              for i in range(e, e + 10)), return_exceptions=True)  # fmt: skip
        for i, r in enumerate(results):
            if isinstance(r, Exception):
                return e + i, r
        e += 10
    raise AssertionError("the disk never filled")


async def test_small_journal_disk_turns_read_only_before_it_fills(tmp_path: Path) -> None:
    """Defect 10: the journal preallocated 16 MiB at a time and disk usage was looked at
    every 5 s, so a small journal disk ran out of space (a fatal journal error) at 85 %
    used. Read-only must come first, while the next preallocation still fits."""
    s = BookieStorage(_small_journal_disk(tmp_path))
    await s.start()
    try:
        refused_at, error = await _add_until_refused(s, 1, 0)
        assert isinstance(error, ReadOnlyError), error
        assert s.failed is None
        assert s.read_only
        space = s.io.disk_space(Path(s.config.journal_dir))
        assert space.free_bytes > (1 << 20)  # a whole preallocation still fits
        assert s.disk_usage().used_fraction >= s.config.disk_usage_threshold
        # Recovery adds still go through (ledger recovery must finish).
        await s.add_entry(2, 0, -1, KEY, payload(2, 0), recovery=True)
        await check_all(s, 1, range(refused_at), size=ENTRY_BYTES)
        s = await _restart_same(s)
        await check_all(s, 1, range(refused_at), size=ENTRY_BYTES)
        await check_all(s, 2, range(1))
    finally:
        await s.close()


async def test_enospc_on_preallocation_turns_read_only_instead_of_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone else fills the disk right after the journal looked: the preallocation
    itself fails. What is queued still fits (it is written without the big
    preallocation) and the bookie turns read-only; with no room even for that, the adds
    are refused with READ_ONLY -- never a fatal error: nothing acknowledged is at stake."""
    s = BookieStorage(_small_journal_disk(tmp_path))
    await s.start()
    try:
        await add_all(s, 1, range(10))
        journal_dir = Path(s.config.journal_dir)
        free = s.io.disk_space(journal_dir).free_bytes
        ballast = faults.fill_disk(journal_dir, free - (200 << 10))
        shim = shim_of(s)
        monkeypatch.setattr(shim, "disk_space", lambda _p: faults.DiskSpace(1 << 40, 1 << 40))
        refused_at, error = await _add_until_refused(s, 1, 10)
        assert isinstance(error, ReadOnlyError)
        assert s.failed is None
        assert s.read_only
        await check_all(s, 1, range(10))
        await check_all(s, 1, range(10, refused_at), size=ENTRY_BYTES)
        monkeypatch.undo()
        ballast.unlink()
        ballast = faults.fill_disk(journal_dir, s.io.disk_space(journal_dir).free_bytes)
        with pytest.raises(ReadOnlyError):
            await s.add_entry(1, 5000, 4999, KEY, payload(1, 5000), recovery=True)
        assert s.failed is None
        ballast.unlink()
        assert not s.check_disk_usage().read_only  # room again: writable
        await s.add_entry(1, 5001, 5000, KEY, payload(1, 5001))
    finally:
        await s.close()


async def _restart_same(s: BookieStorage) -> BookieStorage:
    await s.close()
    new = BookieStorage(s.config)
    await new.start()
    return new


# --- a disk that fills up (issue 21: the chaos nemesis's disk-full) ---------------------


def test_disk_full_reports_no_room_keeps_a_reserve_and_counts_its_hits(tmp_path: Path) -> None:
    shim = faults.FaultShim(faults.ON, [tmp_path], control_dir=tmp_path)
    with _new_file(shim, tmp_path / "f") as fd:
        shim.pwrite(fd, b"x" * 1000, 0)
        (tmp_path / faults.CONTROL_FILE).write_text("disk_full = true\n")
        space = shim.disk_space(tmp_path)
        assert space.free_bytes == 0 and space.total_bytes > 0
        shim.pwrite(fd, b"y" * 4096, 1000)  # within the reserve: a flush under way fits
        with pytest.raises(OSError, match="No space left") as exc:
            shim.pwrite(fd, b"z", faults.DISK_FULL_RESERVE_BYTES + 10_000)
        assert exc.value.errno == errno.ENOSPC
        assert shim.hits()["enospc_errors"] == 1
        hits = (tmp_path / faults.HITS_FILE).read_text()
        assert "enospc_errors = 1" in hits and "fsync_errors = 0" in hits
        (tmp_path / faults.CONTROL_FILE).unlink()
        assert shim.disk_space(tmp_path).free_bytes > 0  # room again
        shim.pwrite(fd, b"z", faults.DISK_FULL_RESERVE_BYTES + 10_000)


def test_an_injected_fsync_error_is_counted_in_the_hits_file(tmp_path: Path) -> None:
    shim = faults.FaultShim(faults.POWER_CUT, [tmp_path], control_dir=tmp_path)
    fsync = shim.wrap_fsync(lambda fd: None)
    with _new_file(shim, tmp_path / "f") as fd:
        fsync(fd)
        assert not (tmp_path / faults.HITS_FILE).exists()
        (tmp_path / faults.CONTROL_FILE).write_text('fsync_error = "EIO"\n')
        with pytest.raises(OSError, match="fault shim"):
            fsync(fd)
        assert "fsync_errors = 1" in (tmp_path / faults.HITS_FILE).read_text()


async def test_a_full_disk_turns_the_bookie_read_only_not_fatal(tmp_path: Path) -> None:
    """The chaos suite's "disk full" stopped the bookie fatally (a 1-byte simulated disk:
    the next entry-log flush failed with ENOSPC) while docs/reliability.md said it turns
    read-only. A disk that fills up leaves what ext4 reserves for root: the disk check
    turns the bookie read-only, a checkpoint still flushes, nothing fails."""
    config = make_config(tmp_path, fault_shim="power-cut")
    s = BookieStorage(config)
    await s.start()
    try:
        await add_all(s, 1, range(50))
        (Path(config.journal_dir) / faults.CONTROL_FILE).write_text("disk_full = true\n")
        assert s.check_disk_usage().read_only
        with pytest.raises(ReadOnlyError):
            await s.add_entry(1, 50, 49, KEY, payload(1, 50))
        await s.checkpoint()  # the memtable reaches the entry logs within the reserve
        assert s.failed is None
        await check_all(s, 1, range(50))
        (Path(config.journal_dir) / faults.CONTROL_FILE).unlink()
        assert not s.check_disk_usage().read_only
        await s.add_entry(1, 50, 49, KEY, payload(1, 50))
    finally:
        await s.close()
