"""The serving floor: the front-end-neutral cores every protocol front end shares.

``write/`` (stream ownership, the owned-stream write path, de-duplication, admission
limits) and ``read/`` (shared feeds, the private reader pool, pages, tails). No HTTP
here: the proxies (and any later front end) decode a request, call a core and encode
its answer.
"""
