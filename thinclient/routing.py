"""Where the thin client sends a request: discovery of the proxies and routing.

* **Discovery**: a list of URLs, or ZooKeeper's proxy registry (``proxies/<id>`` for
  write proxies, ``proxies/read@<id>`` for read proxies), listed again at most every
  ``discovery_refresh_ms`` and at once when a proxy fails.
* **Routing**: a stream's writes go to the proxy that owns it (learned from answers and
  OWNER_MOVED redirects); an unowned stream to the proxy chosen by rendezvous hashing of
  the stream name over the live write proxies (even spread, minimal moves when proxies
  come and go), which then acquires it. Reads go to a random live read proxy.
* **Avoidance**: a proxy that refused a connection or answered UNAVAILABLE is left out
  for ``proxy_down_ms`` (unless every proxy is).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from foundation.config import MetadataConfig
from foundation.errors import ConnectionLostError
from httpapi.proxy_config import READ_PROXY_PREFIX
from thinclient.config import ClientConfig

if TYPE_CHECKING:
    from metadata.client import MetadataClient

__all__ = ["ProxyDirectory", "rendezvous"]


def rendezvous(stream: str, urls: Sequence[str]) -> str:
    """The URL with the highest hash of (url, stream): highest random weight hashing."""

    def score(url: str) -> bytes:
        return hashlib.blake2b(f"{url}\x00{stream}".encode(), digest_size=8).digest()

    return max(urls, key=score)


class ProxyDirectory:
    """The proxies known, the ones avoided for now, and the owners learned."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        write_urls: Sequence[str],
        read_urls: Sequence[str],
        zk: str | None,
        root: str,
        rng: random.Random,
        zk_digest_file: str = "",
    ) -> None:
        self.config = config
        self.write_urls = [u.rstrip("/") for u in write_urls]
        self.read_urls = [u.rstrip("/") for u in read_urls]
        self._zk = zk
        self._root = root
        self._zk_digest_file = zk_digest_file  # "": $BOOKLINE_METADATA_DIGEST_FILE's
        self._rng = rng
        self._md: MetadataClient | None = None
        self._last_discovery = 0.0
        self._owners: dict[str, str] = {}
        self._down: dict[str, float] = {}

    async def connect(self) -> None:
        """With a ZooKeeper connect string: open the session and list the proxies."""
        if self._zk is None or self._md is not None:
            return
        from metadata.client import MetadataClient

        config = MetadataConfig(zk=self._zk, root=self._root, digest_file=self._zk_digest_file)
        self._md = MetadataClient(config)
        await self._md.connect()
        await self.discover(force=True)

    async def close(self) -> None:
        if self._md is not None:
            await self._md.close()

    async def discover(self, force: bool = False) -> None:
        """List the proxies again (ZooKeeper discovery only), at most every
        ``discovery_refresh_ms`` unless ``force``."""
        if self._md is None:
            return
        now = time.monotonic()
        if not force and now - self._last_discovery < self.config.discovery_refresh_ms / 1000:
            return
        self._last_discovery = now
        proxies = await self._md.proxies.list()
        self.write_urls = sorted(
            p.address.rstrip("/") for i, p in proxies.items() if not i.startswith(READ_PROXY_PREFIX)
        )
        self.read_urls = sorted(
            p.address.rstrip("/") for i, p in proxies.items() if i.startswith(READ_PROXY_PREFIX)
        )

    # -- avoidance ---------------------------------------------------------------------

    def _live(self, urls: list[str]) -> list[str]:
        now = time.monotonic()
        live = [u for u in urls if self._down.get(u, 0.0) <= now]
        return live or urls

    def mark_down(self, url: str) -> None:
        self._down[url] = time.monotonic() + self.config.proxy_down_ms / 1000

    def is_down(self, url: str) -> bool:
        return self._down.get(url, 0.0) > time.monotonic()

    # -- owners --------------------------------------------------------------------------

    def learn_owner(self, stream: str, url: str) -> None:
        self._owners[stream] = url

    def forget_owner(self, stream: str) -> None:
        self._owners.pop(stream, None)

    # -- choosing --------------------------------------------------------------------------

    def route(self, stream: str) -> str:
        """The write proxy a request for ``stream`` goes to now."""
        owner = self._owners.get(stream)
        if owner is not None and not self.is_down(owner):
            return owner
        urls = self._live(self.write_urls)
        if not urls:
            raise ConnectionLostError("no write proxy known")
        return rendezvous(stream, urls)

    def read_url(self) -> str:
        """A read proxy for the next read."""
        urls = self._live(self.read_urls)
        if not urls:
            raise ConnectionLostError("no read proxy known")
        return self._rng.choice(urls)
