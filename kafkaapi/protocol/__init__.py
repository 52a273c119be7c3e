"""Kafka's wire protocol, sans-I/O: bytes in, dicts and record batches out, and back.

``frames`` splits a byte stream into size-prefixed frames (bounded), ``messages``
decodes and encodes requests and responses through the API table (``apis_*``, one row
per API key, transcribed from Kafka's message schemas by ``gen_tables``), ``records``
handles record batch v2 with ``compression``, and ``errors`` holds Kafka's error codes.
Every refusal is a :class:`~kafkaapi.protocol.errors.KafkaProtocolError` carrying one.
Nothing here imports asyncio or sockets (an import contract holds it).
"""
