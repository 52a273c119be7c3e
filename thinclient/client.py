"""The thin client's public names, importable from here (``bookline`` and
``bookline.client`` re-export them); the code is in the modules beside this one:

* ``config``       -- :class:`ClientConfig` (timeouts, retries, batching, buffer bounds);
* ``records``      -- what a record may be (``RecordLike``: bytes, str, WireRecord);
* ``routing``      -- discovery (URLs or ZooKeeper) and routing (owner, rendezvous hash);
* ``transport``    -- HTTP: one logical request, retried and redirected;
* ``producer``     -- per-stream batching senders, idempotent sequences and epochs;
* ``reads``        -- pages and WebSocket tails (:class:`ReadPage`);
* ``proxy_client`` -- :class:`ProxyClient`, the asyncio face;
* ``sync``         -- :class:`SyncProxyClient`, the blocking face on a loop thread.
"""

from __future__ import annotations

from thinclient.config import ClientConfig
from thinclient.proxy_client import ProxyClient
from thinclient.reads import ReadPage
from thinclient.records import RecordLike
from thinclient.sync import SyncProxyClient

__all__ = ["ClientConfig", "ProxyClient", "ReadPage", "RecordLike", "SyncProxyClient"]
