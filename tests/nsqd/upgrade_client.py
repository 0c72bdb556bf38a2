"""A test client for nsqd's connection upgrades: IDENTIFY with feature negotiation, then TLS,
snappy or deflate in go-nsq's order, over :mod:`nsqpy.transport` (client side).

Deliberately small and explicit (every step awaited), so error tests can stop anywhere.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
import time
from typing import Any

from nsqpy.protocol import commands
from nsqpy.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, decode_message
from nsqpy.transport import DeflateLayer, SnappyLayer, Stack, TLSLayer

_HEAD = struct.Struct(">ii")


class UpgradeError(Exception):
    """nsqd answered an error frame (``.text``) or closed during the upgrade."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class UpgradedClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.stack = Stack()
        self.buf = bytearray()
        self.negotiated: dict[str, Any] = {}

    @classmethod
    async def connect(
        cls,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        snappy: bool = False,
        deflate: bool = False,
        deflate_level: int = 0,
        **identify: Any,
    ) -> UpgradedClient:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        c = cls(r, w)
        await c.upgrade(tls=tls, snappy=snappy, deflate=deflate, deflate_level=deflate_level, **identify)
        return c

    async def upgrade(
        self,
        *,
        tls: ssl.SSLContext | None,
        snappy: bool,
        deflate: bool,
        deflate_level: int,
        **identify: Any,
    ) -> None:
        fields = {
            "feature_negotiation": True,
            "tls_v1": tls is not None,
            "snappy": snappy,
            "deflate": deflate,
            "deflate_level": deflate_level,
            **identify,
        }
        self.writer.write(b"  V2" + commands.identify(fields))
        self.negotiated = json.loads(await self.expect_response())
        if self.negotiated.get("tls_v1"):
            assert tls is not None
            await self._push(TLSLayer(tls, server_hostname="127.0.0.1"))
            while self.stack.tls is not None and not self.stack.tls.handshake_done:
                await self._fill()
            assert await self.expect_response() == b"OK"
        if self.negotiated.get("snappy"):
            await self._push(SnappyLayer())
            assert await self.expect_response() == b"OK"
        if self.negotiated.get("deflate"):
            await self._push(DeflateLayer(self.negotiated["deflate_level"]))
            assert await self.expect_response() == b"OK"

    async def _push(self, layer: Any) -> None:
        pending = bytes(self.buf)
        self.buf.clear()
        self.buf += self.stack.push(layer, pending)
        out = self.stack.output()
        if out:
            self.writer.write(out)

    # --- I/O ------------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.writer.write(self.stack.send(data))

    def send_raw(self, data: bytes) -> None:
        """Bytes straight to the socket, under every layer (garbage tests)."""
        self.writer.write(data)

    async def _fill(self, timeout: float = 5.0) -> None:
        data = await asyncio.wait_for(self.reader.read(65536), timeout)
        if not data:
            raise UpgradeError("connection closed")
        self.buf += self.stack.receive(data)
        out = self.stack.output()
        if out:
            self.writer.write(out)

    async def read_frame(self, timeout: float = 5.0) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 8:
                size, ftype = _HEAD.unpack_from(self.buf, 0)
                if len(self.buf) >= 4 + size:
                    data = bytes(self.buf[8 : 4 + size])
                    del self.buf[: 4 + size]
                    if (ftype, data) == (0, b"_heartbeat_"):
                        self.send(commands.NOP)
                        continue
                    return ftype, data
            await self._fill(max(deadline - time.monotonic(), 0.01))

    async def expect_response(self) -> bytes:
        ftype, data = await self.read_frame()
        if ftype == FRAME_TYPE_ERROR:
            raise UpgradeError(data.decode())
        assert ftype == 0, (ftype, data)
        return data

    async def read_message(self, timeout: float = 5.0) -> Any:
        ftype, data = await self.read_frame(timeout)
        assert ftype == FRAME_TYPE_MESSAGE, (ftype, data)
        return decode_message(data)

    async def expect_closed(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), max(deadline - time.monotonic(), 0.01))
            except ConnectionError:
                return
            if not data:
                return

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
