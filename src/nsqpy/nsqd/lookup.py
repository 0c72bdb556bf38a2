"""nsqd's side of discovery: one long-lived connection to every configured nsqlookupd.

Each peer connects (``  V1``), sends IDENTIFY with this node's broadcast address and ports,
REGISTERs every topic (or every topic/channel pair), then forwards REGISTER/UNREGISTER as
topics and channels come and go, and PINGs every 15 s. A lost connection is re-established
with backoff (1 s doubling to 15 s, back to 1 s once a connection was made) and everything
is registered again, so a restarted lookupd re-learns the node within one PING period.

The commands are built by the sans-I/O :mod:`nsqpy.protocol.lookup` (``register`` and
``unregister`` are re-exported here for :mod:`nsqpy.nsqd.nsqd`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
from typing import TYPE_CHECKING

from .. import NSQ_VERSION
from ..daemon import open_stream
from ..protocol.address import format_address
from ..protocol.lookup import MAGIC_V1, identify, ping, register, unregister

if TYPE_CHECKING:
    from .nsqd import NSQD

log = logging.getLogger("nsqd")

PING_INTERVAL = 15.0
MIN_BACKOFF = 1.0
MAX_BACKOFF = 15.0
DIAL_TIMEOUT = 1.0
RESPONSE_TIMEOUT = 5.0
CLOSE_TIMEOUT = 5.0
#: a V1 response is ``[int32 BE size][data]`` (``protocol.lookup.encode_response``)
_SIZE = struct.Struct(">i")

__all__ = ["LookupPeer", "LookupPeers", "register", "unregister"]


class LookupPeer:
    """The connection to one nsqlookupd, owned by its own task."""

    def __init__(self, nsqd: NSQD, address: str) -> None:
        self.nsqd = nsqd
        self.address = address
        self.connected = False
        #: the lookupd's IDENTIFY reply (its version, ports, …) once connected
        self.info: dict[str, object] = {}
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def send(self, cmd: bytes) -> None:
        """Queue a command; dropped while disconnected (reconnecting re-registers all)."""
        if self.connected:
            self._queue.put_nowait(cmd)

    async def close(self) -> None:
        task = self._task
        if task is not None:
            # cancel until it is done: Python 3.11's wait_for can swallow a cancellation
            # that lands as its inner await completes (gh-86296), and the session would
            # then wait for its next PING
            loop = asyncio.get_running_loop()
            deadline = loop.time() + CLOSE_TIMEOUT
            while not task.done() and loop.time() < deadline:
                task.cancel()
                await asyncio.wait({task}, timeout=0.1)
            if task.done() and not task.cancelled():
                with contextlib.suppress(BaseException):
                    task.result()
        if self._writer is not None:
            self._writer.close()

    async def _run(self) -> None:
        backoff = MIN_BACKOFF
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as e:
                if self.connected:
                    log.error("LOOKUPD(%s): lost connection - %s", self.address, e)
                else:
                    log.error("LOOKUPD(%s): failed to connect - %s", self.address, e)
            finally:
                # _session only ever ends by raising: a connection that was made resets
                # the backoff, so every lookupd restart is re-learned within MAX_BACKOFF
                if self.connected:
                    backoff = MIN_BACKOFF
                self.connected = False
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _command(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cmd: bytes) -> bytes:
        writer.write(cmd)
        await writer.drain()
        head = await asyncio.wait_for(reader.readexactly(4), RESPONSE_TIMEOUT)
        (size,) = _SIZE.unpack(head)
        if size < 0 or size > 1 << 20:
            raise ValueError(f"bad response size {size}")
        return await asyncio.wait_for(reader.readexactly(size), RESPONSE_TIMEOUT)

    async def _session(self) -> None:
        host, _, port = self.address.rpartition(":")
        log.info("LOOKUP connecting to %s", self.address)
        reader, writer = await asyncio.wait_for(open_stream(host.strip("[]"), int(port)), DIAL_TIMEOUT)
        self._writer = writer
        writer.write(MAGIC_V1)
        nsqd = self.nsqd
        ident = {
            "version": NSQ_VERSION,
            "tcp_port": nsqd.broadcast_tcp_port,
            "http_port": nsqd.broadcast_http_port,
            "hostname": socket.gethostname(),
            "broadcast_address": nsqd.options.broadcast_address,
        }
        resp = await self._command(reader, writer, identify(ident))
        if resp.startswith(b"E_"):
            raise ValueError(f"IDENTIFY rejected: {resp.decode('utf-8', 'replace')}")
        try:
            self.info = json.loads(resp)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            self.info = {}
        log.info("LOOKUPD(%s): peer info %s", self.address, self.info)
        # drop what was queued for the previous connection: we register everything now
        while not self._queue.empty():
            self._queue.get_nowait()
        self.connected = True
        for cmd in nsqd.registrations():
            await self._checked(reader, writer, cmd)
        loop = asyncio.get_running_loop()
        next_ping = loop.time() + PING_INTERVAL
        while True:
            queued = await self._next_command(reader, max(next_ping - loop.time(), 0))
            if queued is None:
                await self._checked(reader, writer, ping())
                next_ping = loop.time() + PING_INTERVAL
            else:
                await self._checked(reader, writer, queued)

    async def _next_command(self, reader: asyncio.StreamReader, timeout: float) -> bytes | None:
        """The next queued command, or None when it is time to PING. Meanwhile watch the
        socket: lookupd only ever answers, so anything it sends now (or EOF) means it went
        away, and we reconnect at once instead of at the next PING."""
        get = asyncio.ensure_future(self._queue.get())
        watch = asyncio.ensure_future(reader.read(1))
        try:
            done, _ = await asyncio.wait({get, watch}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            pending = [t for t in (get, watch) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                # asyncio.wait never raises the inner tasks' CancelledError, so a cancel of
                # this task that lands here still propagates (suppressing it hung stop())
                await asyncio.wait(pending)
        if watch in done:
            raise ConnectionError("connection closed by nsqlookupd")
        if get in done:
            return get.result()
        return None

    async def _checked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cmd: bytes) -> None:
        resp = await self._command(reader, writer, cmd)
        if resp != b"OK":
            log.error(
                "LOOKUPD(%s): %s - %s",
                self.address,
                cmd.strip().decode("utf-8", "replace"),
                resp.decode("utf-8", "replace"),
            )


class LookupPeers:
    """Every configured nsqlookupd; follows runtime changes of the address list."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.peers: dict[str, LookupPeer] = {}

    def set_addresses(self, addresses: list[str]) -> None:
        wanted = list(dict.fromkeys(addresses))
        for addr in list(self.peers):
            if addr not in wanted:
                peer = self.peers.pop(addr)
                log.info("LOOKUP(%s): removing peer", addr)
                asyncio.get_running_loop().create_task(peer.close())
        for addr in wanted:
            if addr not in self.peers:
                peer = self.peers[addr] = LookupPeer(self.nsqd, addr)
                peer.start()

    def http_addresses(self) -> list[str]:
        """``host:port`` of each nsqlookupd's HTTP API, from its IDENTIFY reply (Go's
        lookupdHTTPAddrs: peers that never answered are left out)."""
        out = []
        for peer in self.peers.values():
            host = peer.info.get("broadcast_address")
            port = peer.info.get("http_port")
            if isinstance(host, str) and host and isinstance(port, int):
                out.append(format_address(host, port))
        return out

    def notify(self, cmd: bytes) -> None:
        for peer in self.peers.values():
            peer.send(cmd)

    async def close(self) -> None:
        peers = list(self.peers.values())
        self.peers.clear()
        for peer in peers:
            await peer.close()
