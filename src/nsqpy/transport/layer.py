"""The interface every stream layer implements, and the one error they raise."""

from __future__ import annotations

from typing import Protocol


class TransportError(Exception):
    """A layer could not decode its input or finish its handshake; the connection is unusable.

    The message is short and made for a log line, e.g. ``snappy: corrupt input``.
    """


class Layer(Protocol):
    """One stream transformation under NSQ's framing: TLS, snappy framing or raw deflate.

    Bytes only, no I/O: ``decode`` takes what arrived from below (the network side) and
    returns what it yields for the layer above; ``encode`` goes the other way. ``output``
    returns bytes the layer must send on its own (TLS handshake records, alerts, session
    tickets); compressors never have any.
    """

    def decode(self, data: bytes) -> bytes:
        """Network-side bytes in, bytes for the layer above out (b"" while incomplete)."""
        ...

    def encode(self, data: bytes) -> bytes:
        """Bytes from above in, bytes for the layer below out; a complete flush point."""
        ...

    def output(self) -> bytes:
        """Bytes the layer produced by itself and that must go to the layer below."""
        ...
