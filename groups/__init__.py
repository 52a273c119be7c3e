"""Topics and consumer groups on top of streams (what Kafka users expect).

A topic is N partition streams; a consumer group shares a topic's partitions among its
members under one coordinator. This package holds the pure parts and the services
built from them:

* pure: ``partitioner`` (Kafka's murmur2, sticky batches), ``assignors`` (range,
  roundrobin, cooperative-sticky), ``state`` (a group's rules), ``log`` (the group
  log's records), ``wire`` (the coordinator protocol's bodies);
* topics and producing: ``topics`` (TopicAdmin), ``producer`` (TopicProducer);
* the coordinator: ``coordinator`` (hosted by a write proxy), ``coordinator_store``,
  ``partition_offsets`` and ``coordinator_client`` (its HTTP client);
* consumers: ``consumer`` (GroupConsumer), ``consumer_sync`` (SyncGroupConsumer),
  ``consumer_config``, ``held`` (held partitions and their states), ``membership``
  (the member side of the protocol), ``fetchers`` (core-library and read-proxy
  partition reads, ConsumerRecord).
"""
