"""The dashboard with auth on (real processes, headless Chromium): the page itself is
open, its data call needs an admin token. Opened as ``/dashboard#token=...`` it polls
``/v1/cluster`` with the token (and clears it from the address bar); opened without
one it says how to give it instead of showing data."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundation.auth import load_secrets, sign_token
from ops.cluster.local import LocalCluster
from tests.browser_support import chromium

pytestmark = pytest.mark.integration

PAGE_TIMEOUT_MS = 30_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster", bookies=3, write_proxies=1, read_proxies=1, auth=True)
    c.start()
    try:
        yield c
    finally:
        c.stop()


async def test_dashboard_takes_its_token_from_the_url_fragment(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    rurl = str(cluster.read_proxies[0].extra["url"])
    secret = load_secrets(str(cluster.dir / "auth" / "secret"))[0]
    admin = sign_token(secret, "admin", time.time() + 600)
    async with chromium(tmp_path) as browser:
        context = browser.contexts[0] if browser.contexts else await browser.new_context()
        page = await context.new_page()
        await page.goto(f"{rurl}/dashboard?refresh_ms=500", timeout=PAGE_TIMEOUT_MS)
        await page.wait_for_function(
            "document.getElementById('updated').textContent.includes('#token=')",
            timeout=PAGE_TIMEOUT_MS,
        )
        assert await page.evaluate("document.body.dataset.polls") is None  # no data shown
        # issue 22 (13): the proxy did answer (401); the page says what it needs
        said = await page.inner_text("#updated")
        assert "needs an admin token" in said and "not answering" not in said, said
        page = await context.new_page()
        await page.goto(f"{rurl}/dashboard?refresh_ms=500#token={admin}", timeout=PAGE_TIMEOUT_MS)
        await page.wait_for_function(
            "Number(document.body.dataset.polls) >= 2", timeout=PAGE_TIMEOUT_MS
        )
        for b in cluster.bookies:
            await page.wait_for_selector(
                f'tr[data-bookie="{b.name}"][data-state="ok"]', timeout=PAGE_TIMEOUT_MS
            )
        assert admin not in page.url  # the fragment was cleared from the address bar
