"""The thin client: ``ProxyClient`` (asyncio) and ``SyncProxyClient`` talk HTTP to the
write and read proxies (discovery, routing by owner, idempotent pipelined writes,
reads and tails). Users import them from :mod:`bookline`; :mod:`thinclient.client` lists
the modules by job."""
