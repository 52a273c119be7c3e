"""Topics and consumer groups on top of streams (what Kafka users expect).

A topic is N partition streams; a consumer group shares a topic's partitions among its
members under one coordinator. This package holds the pure parts (partitioner,
assignors, group state) and the services built from them.
"""
