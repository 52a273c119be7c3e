"""Headless Chromium for tests: Debian's ``/usr/bin/chromium`` started by
:func:`ops.cluster.procs.spawn` (its own process group, stopped by pid, also on failure), and
Playwright attached to it over the DevTools protocol (``connect_over_cdp``). Playwright
never downloads or launches a browser of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from playwright.async_api import Browser, async_playwright

from ops.cluster import procs
from tests.waiting import wait_for

CHROMIUM: Final = Path("/usr/bin/chromium")
# The flags that work on this machine (no GPU, no sandbox as root, nothing fetched).
FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # Chromium picks one and writes DevToolsActivePort
)
# Chromium writes its DevTools port within a second or two; a loaded machine gets room.
START_TIMEOUT_S: Final = 30.0


async def _devtools_port(profile: Path, log: Path, proc: subprocess.Popen[bytes]) -> int:
    marker = profile / "DevToolsActivePort"

    def port() -> int:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited at start:\n{_tail(log)}")
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(marker.read_text().splitlines()[0])
        return 0

    def what() -> str:
        return f"chromium's DevTools port:\n{_tail(log)}"

    return await wait_for(port, what, timeout_s=START_TIMEOUT_S, interval_s=0.1)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


@contextlib.asynccontextmanager
async def chromium(workdir: Path) -> AsyncIterator[Browser]:
    """A headless Chromium with a fresh profile under ``workdir``, as a Playwright
    :class:`Browser`; stopped by pid on the way out, whatever happened."""
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: ops/setup.sh installs Debian's chromium")
    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    log = workdir / "chromium.log"
    proc = procs.spawn(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "about:blank"], log_path=log
    )
    try:
        port = await _devtools_port(profile, log, proc)
        async with async_playwright() as pw:
            browser = await pw.chromium.connect_over_cdp(f"http://127.0.0.1:{port}")
            try:
                yield browser
            finally:
                await browser.close()
    finally:
        await asyncio.to_thread(procs.stop, proc, 5.0)
