"""Read proxy (to come): a stateless aiohttp service serving reads by position, long-poll
and WebSocket tailing, with a shared bounded cache of recent entries over the core
library's speculative reads.
"""
