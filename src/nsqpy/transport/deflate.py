"""Raw deflate (RFC 1951, no zlib header), as Go's compress/flate Reader and Writer speak it.

Each ``encode`` ends with a sync flush (the empty stored block ``00 00 ff ff``), exactly
what Go's ``flate.Writer.Flush`` emits, so the peer can decode everything sent so far.
"""

from __future__ import annotations

import zlib

from nsqpy.transport.layer import TransportError

_RAW_DEFLATE = -15  # wbits: a 32 KiB window and no zlib header or trailer, like Go's flate


class DeflateLayer:
    """Raw deflate both ways at a compression ``level`` in [0, 9] (NSQ allows 1..9)."""

    __slots__ = ("_compressor", "_decompressor", "level")

    def __init__(self, level: int = 6) -> None:
        if not 0 <= level <= 9:
            raise ValueError(f"deflate level must be in [0, 9], not {level}")
        self.level = level
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, _RAW_DEFLATE)
        self._decompressor = zlib.decompressobj(_RAW_DEFLATE)

    def encode(self, data: bytes) -> bytes:
        if not data:
            return b""
        compressor = self._compressor
        return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data: bytes) -> bytes:
        decompressor = self._decompressor
        try:
            out = decompressor.decompress(data)
        except zlib.error as e:
            # "Error -3 while decompressing data: invalid block type" -> the part after ": "
            raise TransportError(f"flate: corrupt input ({str(e).rpartition(': ')[2]})") from None
        if decompressor.unused_data:
            raise TransportError("flate: data after the end of the stream")
        return out

    def output(self) -> bytes:
        return b""
