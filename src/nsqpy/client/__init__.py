"""nsqpy.client: the asyncio NSQ client (Producer, Consumer), its HTTP clients and a sync facade."""

from .config import ConnectionConfig
from .conn import Connection
from .consumer import Consumer, ConsumerStats
from .errors import (
    AuthError,
    BadMessageError,
    BadTopicError,
    ConnectionClosedError,
    ErrorFrame,
    GiveUp,
    HandshakeError,
    NoConnectionsError,
    NSQError,
    NSQHTTPError,
    ProtocolError,
    PublishError,
    RequeueMessage,
    TLSError,
    UnsupportedFeatureError,
)
from .http import LookupdHTTPClient, NsqdHTTPClient
from .message import Message
from .producer import Producer
from .rdy import BackoffPolicy, ExponentialBackoff, FullJitterBackoff
from .sync import SyncConsumer, SyncMessage, SyncProducer

__all__ = [
    "AuthError",
    "BackoffPolicy",
    "BadMessageError",
    "BadTopicError",
    "Connection",
    "ConnectionClosedError",
    "ConnectionConfig",
    "Consumer",
    "ConsumerStats",
    "ErrorFrame",
    "ExponentialBackoff",
    "FullJitterBackoff",
    "GiveUp",
    "HandshakeError",
    "LookupdHTTPClient",
    "Message",
    "NSQError",
    "NSQHTTPError",
    "NoConnectionsError",
    "NsqdHTTPClient",
    "Producer",
    "ProtocolError",
    "PublishError",
    "RequeueMessage",
    "SyncConsumer",
    "SyncMessage",
    "SyncProducer",
    "TLSError",
    "UnsupportedFeatureError",
]
