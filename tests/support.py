"""Shared test helpers: a raw protocol-V2 client over asyncio streams, and polling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from nsqpy.protocol import commands
from nsqpy.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FrameReader, decode_message


class RawClient:
    """A bare TCP V2 client for tests: send bytes, read frames, answer heartbeats if asked."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames = FrameReader()
        self.pending: list[tuple[int, bytes]] = []

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1", magic: bool = True) -> RawClient:
        r, w = await asyncio.open_connection(host, port)
        c = cls(r, w)
        if magic:
            w.write(b"  V2")
        return c

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def identify(self, **fields: Any) -> Any:
        self.send(commands.identify(fields))
        ftype, data = await self.read_frame()
        assert ftype == 0, data
        return json.loads(data) if fields.get("feature_negotiation") else data

    async def sub(self, topic: str, channel: str, rdy: int | None = None) -> None:
        self.send(commands.sub(topic, channel))
        assert await self.read_frame() == (0, b"OK")
        if rdy is not None:
            self.send(commands.rdy(rdy))

    async def pub(self, topic: str, body: bytes) -> tuple[int, bytes]:
        self.send(commands.pub(topic, body))
        return await self.read_frame()

    async def read_frame(self, timeout: float = 5.0, skip_heartbeats: bool = True) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            while self.pending:
                f = self.pending.pop(0)
                if skip_heartbeats and f == (0, b"_heartbeat_"):
                    self.send(commands.NOP)
                    continue
                return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame")
            data = await asyncio.wait_for(self.reader.read(65536), left)
            if not data:
                raise ConnectionError("connection closed")
            self.pending += self.frames.feed(data)

    async def read_message(self, timeout: float = 5.0):
        ftype, data = await self.read_frame(timeout)
        assert ftype == FRAME_TYPE_MESSAGE, (ftype, data)
        return decode_message(data)

    async def read_messages(self, n: int, timeout: float = 10.0) -> list:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            out.append(await self.read_message(max(deadline - time.monotonic(), 0.01)))
        return out

    async def read_error(self, timeout: float = 5.0) -> str:
        ftype, data = await self.read_frame(timeout)
        assert ftype == FRAME_TYPE_ERROR, (ftype, data)
        return data.decode()

    async def expect_closed(self, timeout: float = 5.0) -> None:
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

    async def expect_silence(self, seconds: float) -> None:
        """Assert no frame (other than heartbeats) arrives for ``seconds``."""
        try:
            f = await self.read_frame(timeout=seconds)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame {f!r}")

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


def wait_until(
    cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition", interval: float = 0.02
) -> Any:
    """Blocking twin of :func:`wait_for` (for tests driving subprocesses): poll ``cond``
    until it returns something truthy (returned); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {v!r})")
        time.sleep(interval)


async def wait_for(
    cond: Callable[[], Any | Awaitable[Any]], timeout: float = 5.0, interval: float = 0.01
) -> Any:
    """Poll ``cond`` until truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def read_bodies(
    tcp_address: str,
    topic: str,
    channel: str,
    n: int,
    timeout: float = 30.0,
    max_in_flight: int = 500,
    quiet: float = 0.0,
) -> list[bytes]:
    """The first ``n`` message bodies of ``topic``/``channel`` on one nsqd (each FIN'd), in
    arrival order; with ``quiet``, also fail if another message arrives within that time."""
    from nsqpy.client import SyncConsumer

    bodies: list[bytes] = []
    deadline = time.monotonic() + timeout
    with SyncConsumer(topic, channel, nsqd_tcp_addresses=[tcp_address], max_in_flight=max_in_flight) as c:
        while len(bodies) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"read {len(bodies)} of {n} messages from {topic}/{channel}")
            try:
                msg = c.next(timeout=left)
            except TimeoutError:
                continue
            bodies.append(msg.body)
            msg.fin()
        if quiet > 0:
            try:
                extra = c.next(timeout=quiet)
            except TimeoutError:
                pass
            else:
                raise AssertionError(f"more than {n} messages in {topic}/{channel}: {extra.body!r}")
    return bodies


# --- a disk that fails for real -------------------------------------------------------------------


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount`` syntax: ``16m``) mounted at ``path`` for the block, so
    a test can fill it (ENOSPC) or make it read-only (EROFS) for real. Skips the test, with
    the reason, where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("making the disk fail for real needs root (mount -t tmpfs)")
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0755" + (",ro" if read_only else "")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(directory: Path, leave: int = 0) -> Path:
    """Fill the file system of ``directory`` with a file until at most ``leave`` bytes are
    free (or writes fail); delete the returned file to give the space back."""
    filler = directory / "filler.bin"
    chunk = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        while True:
            st = os.statvfs(directory)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                break
            try:
                f.write(chunk[: max(min(len(chunk), free - leave), 1)])
            except OSError:
                break
    return filler


# --- an auth server for AUTH tests --------------------------------------------------------------

GRANT = {
    "ttl": 3600,
    "identity": "ann",
    "identity_url": "http://people.example/ann",
    "authorizations": [
        {"topic": "^orders$", "channels": [".*"], "permissions": ["publish", "subscribe"]},
        {"topic": "^audit", "channels": ["^archive$"], "permissions": ["subscribe"]},
    ],
}


class AuthServer:
    """Answers /auth from ``self.answers[secret]``: a dict (JSON), an (status, body) pair,
    or a float (seconds to stall first, then GRANT). Records every request's query."""

    def __init__(self) -> None:
        self.answers: dict[str, object] = {"good": GRANT}
        self.requests: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        params = dict(request.query) if request.method == "GET" else dict(await request.post())
        params["_method"] = request.method
        params["_path"] = request.path
        self.requests.append(params)
        answer = self.answers.get(params.get("secret", ""), (403, b"forbidden"))
        if isinstance(answer, float):
            await asyncio.sleep(answer)
            answer = GRANT
        if isinstance(answer, tuple):
            return web.Response(status=answer[0], body=answer[1])
        return web.json_response(answer)

    async def start(self) -> AuthServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


# --- credentials files ------------------------------------------------------------------------


def htpasswd_entry(user: str, password: str, prefix: str = "$2y$") -> str:
    """One ``user:hash`` line as ``htpasswd -B`` writes it (bcrypt, ``$2y$``; the cheapest
    cost, 4, to keep tests fast); ``prefix`` ``$2b$`` or ``$2a$`` for the other variants."""
    import bcrypt

    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    return f"{user}:{prefix}{hashed[4:]}"


def write_htpasswd(path: Path, users: dict[str, str]) -> str:
    """An htpasswd file of ``users`` (name → password); its path."""
    path.write_text("".join(htpasswd_entry(u, p) + "\n" for u, p in users.items()))
    return str(path)


def write_token_file(path: Path, *tokens: str) -> str:
    """An admin token file (mode 600) holding ``tokens``; its path."""
    path.write_text("".join(t + "\n" for t in tokens))
    os.chmod(path, 0o600)
    return str(path)


# --- ports and /stats -----------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nothing listens on (bound once, then released)."""

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nsqd_stats(http_address: str, topic: str | None = None, channel: str | None = None) -> Any:
    """nsqd's ``/stats?format=json`` (filtered to ``topic``/``channel`` when given), blocking;
    a non-200 answer fails the test."""
    import urllib.parse
    import urllib.request

    query = {"format": "json"}
    if topic:
        query["topic"] = topic
    if channel:
        query["channel"] = channel
    url = f"http://{http_address}/stats?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def find_stats(doc: Any, topic: str, channel: str | None = None) -> Any:
    """The topic's (or channel's) entry in a ``/stats`` document, None if absent."""
    for t in doc.get("topics") or []:
        if t["topic_name"] != topic:
            continue
        if channel is None:
            return t
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return None


#: a port nothing listens on, for a node that is down
closed_port = free_port


class FakeNsqd:
    """A TCP peer of nsqlookupd that registers topics for an nsqd that does not exist (its
    ports are closed): whoever reads it through the lookupd (nsqadmin) fails to."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def register(cls, lookupd_tcp_port: int, http_port: int, *topics: str) -> FakeNsqd:
        r, w = await asyncio.open_connection("127.0.0.1", lookupd_tcp_port)
        peer = cls(r, w)
        w.write(b"  V1")
        body = json.dumps(
            {
                "broadcast_address": "127.0.0.1",
                "hostname": "ghost",
                "tcp_port": closed_port(),
                "http_port": http_port,
                "version": "1.3.0",
            }
        ).encode()
        await peer.command(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        for topic in topics:
            assert await peer.command(f"REGISTER {topic}\n".encode()) == b"OK"
        return peer

    async def command(self, data: bytes) -> bytes:
        self.writer.write(data)
        (n,) = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), 5))
        return await asyncio.wait_for(self.reader.readexactly(n), 5)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def load_hot(message_type: type | None = None) -> Any:
    """The compiled hot paths (``nsqpy._speedups._hot``), whatever NSQPY_PURE_PYTHON says,
    wired as :mod:`nsqpy._speedups` wires them (the layout of protocol/frames.py; nsqd's
    Message class when given). Fails the test when the module is not built or is stale:
    the dev setup always builds it (scripts/setup.sh)."""
    import importlib

    import pytest

    from nsqpy import _speedups
    from nsqpy.protocol.frames import (
        MESSAGE_BODY_OFFSET,
        MESSAGE_HEADER_SIZE,
        MESSAGE_ID_OFFSET,
        MSG_ID_LENGTH,
    )

    try:
        hot = importlib.import_module("nsqpy._speedups._hot")
    except ImportError as e:  # pragma: no cover - a broken dev setup
        pytest.fail(f"nsqpy._speedups._hot is not built ({e}): run pip install -e . with a C compiler")
    assert hot.API_VERSION == _speedups.API_VERSION, "a stale build of _hot: reinstall"
    hot.set_layout(
        MSG_ID_LENGTH, MESSAGE_HEADER_SIZE, FRAME_TYPE_MESSAGE, MESSAGE_ID_OFFSET, MESSAGE_BODY_OFFSET
    )
    if message_type is not None:
        hot.set_message_type(message_type)
    return hot


def read_go_queue(path: Path, name: str) -> list[bytes]:
    """What the Go reader would hand out: from the metadata read position to the write
    position, finished segments ending at their file size."""
    depth, (rf, rp), (wf, wp) = _meta(path, name)
    out = []
    f, pos = rf, rp
    while (f, pos) != (wf, wp):
        data = (path / f"{name}.diskqueue.{f:06d}.dat").read_bytes()
        end = wp if f == wf else len(data)
        while pos < end:
            (n,) = struct.unpack_from(">i", data, pos)
            out.append(data[pos + 4 : pos + 4 + n])
            pos += 4 + n
        if f == wf:
            break
        f, pos = f + 1, 0
    assert len(out) == depth
    return out


def _meta(path: Path, name: str) -> tuple[int, tuple[int, int], tuple[int, int]]:
    """The metadata as Go's Fscanf("%d\\n%d,%d\\n%d,%d\\n") reads it (what follows is ignored)."""
    lines = (path / f"{name}.diskqueue.meta.dat").read_text().split("\n")
    depth = int(lines[0])
    rf, rp = (int(x) for x in lines[1].split(","))
    wf, wp = (int(x) for x in lines[2].split(","))
    return depth, (rf, rp), (wf, wp)
