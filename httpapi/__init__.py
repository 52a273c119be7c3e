"""The proxies' HTTP contract, shared by both proxies and the thin client.

Wire formats and body codecs (``wire``), how core objects look in bodies (``views``),
the OpenAPI document (``openapi``), error codes -> HTTP statuses (``status``), the aiohttp
plumbing both proxies run on (``server``) and the settings they share
(``proxy_config``). Sans-I/O except ``server``.
"""
