"""Snappy compression in the *framing format*, as nsqd (Go's golang/snappy Reader and
Writer) and pynsq (python-snappy's stream classes) speak it.

A stream is a sequence of chunks ``[type:1][length:3, little-endian][payload]``:

- ``0xff`` stream identifier, payload ``sNaPpY``; it must come first and may repeat;
- ``0x00`` compressed and ``0x01`` uncompressed data, payload ``[masked CRC-32C:4][data]``
  with at most 64 KiB of uncompressed data per chunk;
- ``0xfe`` padding and ``0x80``-``0xfd`` skippable chunks, ignored;
- ``0x02``-``0x7f`` reserved, an error (Go's ``ErrUnsupported``).

The block compression and the CRC are cramjam's; this module only cuts the incoming byte
stream at chunk boundaries, so it can be fed in pieces of any size.
"""

from __future__ import annotations

import importlib.util

from nsqpy.transport.layer import TransportError

#: The stream identifier chunk that starts every snappy stream.
STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"

_IDENT_LEN = len(STREAM_IDENTIFIER)
_MAGIC = STREAM_IDENTIFIER[4:]
_MAX_BLOCK = 65536
_CHECKSUM = 4
#: Go's limit for any chunk: the worst-case compressed size of a 64 KiB block plus its CRC
#: (``maxEncodedLenOfMaxBlockSize + checksumSize``); it also bounds what we buffer.
MAX_CHUNK_LEN = 32 + _MAX_BLOCK + _MAX_BLOCK // 6 + _CHECKSUM

#: Go's error strings (``snappy.ErrCorrupt`` and ``snappy.ErrUnsupported``).
ERR_CORRUPT = "snappy: corrupt input"
ERR_UNSUPPORTED = "snappy: unsupported input"


def snappy_available() -> bool:
    """Whether cramjam (the snappy implementation) is installed, i.e. snappy can be offered."""
    return importlib.util.find_spec("cramjam") is not None


class SnappyLayer:
    """Snappy framing both ways: every ``encode`` is a flush point, ``decode`` is incremental."""

    __slots__ = ("_buf", "_compressor", "_decompress", "_decompress_error", "_started")

    def __init__(self) -> None:
        # imported here: cramjam is needed only by connections that negotiate snappy
        import cramjam

        #: cramjam's stream compressor: emits the stream identifier once, then only chunks.
        self._compressor = cramjam.snappy.Compressor()
        self._decompress = cramjam.snappy.decompress
        self._decompress_error = cramjam.DecompressionError
        # Received bytes not yet decoded, behind a constant stream identifier so that any
        # prefix of whole chunks is a valid framed stream for cramjam to decompress.
        self._buf = bytearray(STREAM_IDENTIFIER)
        self._started = False

    def encode(self, data: bytes) -> bytes:
        if not data:
            return b""
        compressor = self._compressor
        compressor.compress(data)
        return bytes(compressor.flush())

    def decode(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        end = len(buf)
        pos = _IDENT_LEN
        while pos + 4 <= end:
            kind = buf[pos]
            length = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
            if kind == 0xFF:
                if length != len(_MAGIC):
                    raise TransportError(ERR_CORRUPT)
            elif not self._started:
                raise TransportError(ERR_CORRUPT)  # Go: the first chunk must be the identifier
            elif kind <= 0x01:
                if length < _CHECKSUM or (kind == 0x01 and length - _CHECKSUM > _MAX_BLOCK):
                    raise TransportError(ERR_CORRUPT)
            elif kind < 0x80:
                raise TransportError(ERR_UNSUPPORTED)
            if length > MAX_CHUNK_LEN:
                raise TransportError(ERR_UNSUPPORTED)
            nxt = pos + 4 + length
            if nxt > end:
                break
            if kind == 0xFF:
                if buf[pos + 4 : nxt] != _MAGIC:
                    raise TransportError(ERR_CORRUPT)
                self._started = True
            pos = nxt
        if pos == _IDENT_LEN:
            return b""
        try:
            if pos == end:
                out = self._decompress(buf)
            else:
                with memoryview(buf) as view, view[:pos] as whole_chunks:
                    out = self._decompress(whole_chunks)
        except self._decompress_error as e:
            raise TransportError(_error_message(str(e))) from None
        del buf[_IDENT_LEN:pos]
        return bytes(out)

    def output(self) -> bytes:
        return b""


def _error_message(detail: str) -> str:
    """cramjam's message (``snappy: corrupt input (bad checksum; ...)``) or a generic one."""
    if detail.startswith("snappy:"):
        return detail
    return f"{ERR_CORRUPT} ({detail})" if detail else ERR_CORRUPT
