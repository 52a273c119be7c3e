"""Bookline: the public Python package -- the names users import, and nothing else.

``from bookline import Namespace, LogRecord, DLSN, ProxyClient`` and
``from bookline.errors import FencedError`` are the stable surface; the code lives in
the layers below (``foundation/``, ``streams/``, ``thinclient/``, ...), none of which
imports this package. Both clients -- the core library and the thin client -- answer
in the same result types (``StreamInfo``, ``TopicInfo``, ``PartitionInfo``, topic
records) and take the same ``TopicOptions`` (:mod:`streams.vocabulary`). See
docs/core-api.md (core library) and docs/proxies.md (thin client).
"""

from foundation.version import __version__
from groups.consumer import ConsumerConfig, ConsumerRecord, GroupConsumer
from groups.consumer_sync import SyncGroupConsumer
from groups.producer import ProducerConfig, SyncTopicProducer, TopicProducer
from groups.topics import TopicAdmin
from metadata.streams import StreamOptions
from streams.config import NamespaceConfig
from streams.dlsn import DLSN, StartPosition
from streams.namespace import Namespace
from streams.reader import LogReader
from streams.records import Compression, LogRecord, ReadRecord
from streams.sync import SyncNamespace
from streams.vocabulary import PartitionInfo, SegmentInfo, StreamInfo, TopicInfo, TopicOptions
from streams.writer import LogWriter
from thinclient.client import ClientConfig, ProxyClient, SyncProxyClient

__all__ = [
    "DLSN",
    "ClientConfig",
    "Compression",
    "ConsumerConfig",
    "ConsumerRecord",
    "GroupConsumer",
    "LogReader",
    "LogRecord",
    "LogWriter",
    "Namespace",
    "NamespaceConfig",
    "PartitionInfo",
    "ProducerConfig",
    "ProxyClient",
    "ReadRecord",
    "SegmentInfo",
    "StartPosition",
    "StreamInfo",
    "StreamOptions",
    "SyncGroupConsumer",
    "SyncNamespace",
    "SyncProxyClient",
    "SyncTopicProducer",
    "TopicAdmin",
    "TopicInfo",
    "TopicOptions",
    "TopicProducer",
    "__version__",
]
