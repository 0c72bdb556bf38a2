"""The layers of one connection, stacked as NSQ upgrades them: TLS, then snappy or deflate.

A :class:`Stack` starts empty (plain TCP, where ``receive`` and ``send`` return their
argument untouched) and grows with :meth:`Stack.push` as IDENTIFY negotiates upgrades.
The same object serves nsqd (server side) and clients; it does no I/O.

How an upgrade is sequenced (NSQ's order; the server shown, a client mirrors it):

1. send the response that announces the upgrade through the *current* stack
   (``transport.write(stack.send(frame))``), then ``stack.push(layer, pending)``;
2. ``pending`` is whatever was already received (and decoded by the current stack) but
   not yet consumed by the protocol parser: those bytes belong to the new layer. ``push``
   returns what they decode to, i.e. application bytes for the parser;
3. after ``push`` and after every ``receive``, write ``stack.output()`` if it is not empty
   (TLS handshake records, a client's ClientHello, session tickets);
4. for TLS, wait until ``stack.tls.handshake_done`` before sending the ``OK`` that
   follows the handshake (bytes sent earlier are held and encrypted when it completes).
"""

from __future__ import annotations

from nsqpy.transport.deflate import DeflateLayer
from nsqpy.transport.layer import Layer
from nsqpy.transport.snappy import SnappyLayer
from nsqpy.transport.tls import TLSLayer


class Stack:
    """Ordered layers, bottom (network side) first."""

    __slots__ = ("layers",)

    def __init__(self) -> None:
        self.layers: list[Layer] = []

    def receive(self, data: bytes) -> bytes:
        """Network bytes in, application bytes out (b"" while a layer waits for more)."""
        layers = self.layers
        if not layers:
            return data
        for layer in layers:
            data = layer.decode(data)
            if not data:
                return b""
        return data

    def send(self, data: bytes) -> bytes:
        """Application bytes in, wire bytes out, preceded by any pending layer output."""
        layers = self.layers
        if not layers:
            return data
        for layer in reversed(layers):
            pending = layer.output()
            data = layer.encode(data)
            if pending:
                data = pending + data
        return data

    def output(self) -> bytes:
        """Wire bytes the layers produced on their own (TLS handshake, alerts, tickets)."""
        data = b""
        for layer in reversed(self.layers):
            pending = layer.output()
            data = pending + layer.encode(data) if data else pending
        return data

    def push(self, layer: Layer, pending: bytes = b"") -> bytes:
        """Add ``layer`` on top; returns the application bytes ``pending`` decodes to.

        ``pending``: bytes already received and decoded by the layers below but not yet
        consumed above (see the module docstring). NSQ's rules are enforced: TLS only as
        the first layer, and at most one compression layer.
        """
        if isinstance(layer, TLSLayer) and self.layers:
            raise ValueError("TLS must be the first upgrade")
        if isinstance(layer, (SnappyLayer, DeflateLayer)) and self.compression is not None:
            raise ValueError(f"compression is already {self.compression}")
        self.layers.append(layer)
        return layer.decode(pending) if pending else b""

    @property
    def tls(self) -> TLSLayer | None:
        """The TLS layer, if the connection was upgraded to TLS."""
        layers = self.layers
        if layers and isinstance(layers[0], TLSLayer):
            return layers[0]
        return None

    @property
    def compression(self) -> str | None:
        """``snappy``, ``deflate`` or None."""
        for layer in self.layers:
            if isinstance(layer, SnappyLayer):
                return "snappy"
            if isinstance(layer, DeflateLayer):
                return "deflate"
        return None

    @property
    def closed(self) -> bool:
        """True once the peer closed the TLS session (close_notify)."""
        tls = self.tls
        return tls is not None and tls.closed
