"""Write proxy (to come): a stateless aiohttp service that owns streams (ZooKeeper owner
record + the stream's writer lock), batches concurrent client writes into record sets,
de-duplicates retried writes by producer id and sequence number, and answers 429 when
its per-stream or per-proxy limits are reached.
"""
