"""Helpers for the nsqlookupd tests: a raw TCP V1 client, a small HTTP client, fixtures.

Fixtures live here and are imported by the test modules as ``*_fixture`` (no conftest.py
under tests/: a second ``conftest`` module would shadow the root one); they are named
``lookupd``, ``http`` and ``clients``.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Any

import aiohttp
import pytest_asyncio
import yarl

from nsqpy.nsqlookupd import NSQLookupd, Options

V1 = "nsq; version=1.0"
JSON_CT = "application/json; charset=utf-8"

#: A valid IDENTIFY body's fields (what Go's nsqd sends, minus topology).
PEER = {
    "broadcast_address": "nsqd-host",
    "hostname": "nsqd-hostname",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "1.3.0",
}


def lookupd_options(**kw: Any) -> Options:
    base: dict[str, Any] = dict(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")
    base.update(kw)
    return Options(**base)


class V1Client:
    """A bare nsqlookupd TCP client: send bytes, read ``[size][data]`` responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, magic: bool = True) -> V1Client:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        c = cls(r, w)
        if magic:
            w.write(b"  V1")
        return c

    @property
    def local_address(self) -> str:
        host, port = self.writer.get_extra_info("sockname")[:2]
        return f"{host}:{port}"

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def response(self, timeout: float = 5.0) -> bytes:
        head = await asyncio.wait_for(self.reader.readexactly(4), timeout)
        (n,) = struct.unpack(">i", head)
        return await asyncio.wait_for(self.reader.readexactly(n), timeout)

    async def command(self, line: bytes) -> bytes:
        self.send(line)
        return await self.response()

    async def identify(self, **fields: Any) -> dict[str, Any]:
        body = json.dumps({**PEER, **fields}).encode()
        resp = await self.command(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        return json.loads(resp)

    async def register(self, topic: str, channel: str = "") -> bytes:
        return await self.command(f"REGISTER {topic} {channel}".rstrip().encode() + b"\n")

    async def unregister(self, topic: str, channel: str = "") -> bytes:
        return await self.command(f"UNREGISTER {topic} {channel}".rstrip().encode() + b"\n")

    async def expect_closed(self, timeout: float = 5.0) -> None:
        """Assert the server closes the connection (after any pending responses)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("connection still open")
            try:
                data = await asyncio.wait_for(self.reader.read(65536), left)
            except ConnectionError:
                return
            if not data:
                return
            raise AssertionError(f"unexpected data before close: {data!r}")

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


class HTTP:
    """``await http.get("/lookup?topic=t")`` → (status, headers, body); no redirects."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}"

    async def request(self, method: str, path: str, data: Any = None, **kw: Any):
        url = yarl.URL(self.base + path, encoded=True)  # send the query bytes as written
        async with self.session.request(method, url, data=data, allow_redirects=False, **kw) as r:
            return r.status, r.headers, await r.read()

    async def get(self, path: str, **kw: Any):
        return await self.request("GET", path, **kw)

    async def post(self, path: str, data: bytes = b"", **kw: Any):
        return await self.request("POST", path, data=data, **kw)

    async def json(self, path: str) -> Any:
        status, _, body = await self.get(path)
        assert status == 200, body
        return json.loads(body)


def err(status: int, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"message": message}, separators=(",", ":")).encode()


@pytest_asyncio.fixture(name="lookupd")
async def lookupd_fixture():
    async with NSQLookupd(lookupd_options()) as lk:
        yield lk


@pytest_asyncio.fixture(name="http")
async def http_fixture(lookupd):
    async with aiohttp.ClientSession() as s:
        yield HTTP(s, lookupd.http_port)


@pytest_asyncio.fixture(name="clients")
async def clients_fixture(lookupd):
    """``await connect()`` → an IDENTIFY-ready V1Client; all closed at teardown."""
    made: list[V1Client] = []

    async def connect(magic: bool = True) -> V1Client:
        c = await V1Client.connect(lookupd.tcp_port, magic)
        made.append(c)
        return c

    yield connect
    for c in made:
        await c.close()
