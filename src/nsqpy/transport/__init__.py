"""The stream layers under NSQ's framing, sans-I/O: TLS, snappy framing and raw deflate,
stacked TLS -> compression -> frames on both the server and the client side.

Bytes in, bytes out; no sockets, no event loop. See :mod:`nsqpy.transport.stack` for how
an upgrade is sequenced.
"""

from nsqpy.transport.deflate import DeflateLayer
from nsqpy.transport.layer import Layer, TransportError
from nsqpy.transport.snappy import SnappyLayer, snappy_available
from nsqpy.transport.stack import Stack
from nsqpy.transport.tls import (
    TLSContext,
    TLSLayer,
    client_tls_context,
    server_tls_context,
)

__all__ = [
    "DeflateLayer",
    "Layer",
    "SnappyLayer",
    "Stack",
    "TLSContext",
    "TLSLayer",
    "TransportError",
    "client_tls_context",
    "server_tls_context",
    "snappy_available",
]
