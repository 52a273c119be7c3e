"""The serving floor: the front-end-neutral write and read cores every protocol front
end of a proxy process sits on (``write/`` and ``read/``). A front end (the HTTP
services in ``writeproxy`` and ``readproxy`` today) decodes a request, calls a core
and encodes the answer; ownership, ordering, de-duplication, limits and the read
paths live here, once.
"""
