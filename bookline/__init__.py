"""Bookline: the public Python package -- the names users import, and nothing else.

``from bookline import Namespace, LogRecord, DLSN, ProxyClient`` and
``from bookline.errors import FencedError`` are the stable surface; the code lives in
the layers below (``foundation/``, ``streams/``, ``thinclient/``, ...), none of which
imports this package. See docs/core-api.md (core library) and docs/proxies.md (thin
client).
"""

from foundation.version import __version__
from groups.consumer import ConsumerConfig, ConsumerRecord, GroupConsumer
from groups.consumer_sync import SyncGroupConsumer
from groups.producer import ProducerConfig, SyncTopicProducer, TopicProducer
from groups.topics import PartitionInfo, TopicAdmin, TopicInfo
from metadata.streams import StreamOptions
from streams.config import NamespaceConfig
from streams.dlsn import DLSN, StartPosition
from streams.namespace import Namespace, SegmentInfo, StreamInfo
from streams.reader import LogReader
from streams.records import Compression, LogRecord, ReadRecord
from streams.sync import SyncNamespace
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
    "TopicProducer",
    "__version__",
]
