"""The thin client's public names (defined in :mod:`thinclient.client`)."""

from thinclient.client import ClientConfig, ProxyClient, ReadPage, SyncProxyClient

__all__ = ["ClientConfig", "ProxyClient", "ReadPage", "SyncProxyClient"]
