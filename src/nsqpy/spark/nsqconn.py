"""Blocking protocol-V2 connections and small HTTP helpers for the Spark source and sink.

The Spark source runs inside Spark's Python runner process and the sink inside Python
workers: both are plain blocking code with no event loop, so they speak the wire protocol
over a blocking socket with the sans-I/O codecs from :mod:`nsqpy.protocol`.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from nsqpy import __version__
from nsqpy.protocol import commands
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    FrameReader,
)

USER_AGENT = f"nsqpy-spark/{__version__}"

__all__ = [
    "USER_AGENT",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "HEARTBEAT",
    "BlockingConnection",
    "parse_address",
    "parse_address_list",
    "http_get_json",
    "identify_fields",
    "stats_url",
]


def parse_address(addr: str, option: str) -> tuple[str, int]:
    """``host:port`` → ``(host, port)``; a ValueError naming ``option`` otherwise."""
    host, sep, port = addr.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"option {option!r}: {addr.strip()!r} is not a host:port address")
    return host, int(port)


def parse_address_list(value: str | None, option: str) -> list[str]:
    """A comma-separated ``host:port`` list, validated and de-duplicated (order kept)."""
    if value is None:
        return []
    out: list[str] = []
    for part in value.split(","):
        if not part.strip():
            continue
        host, port = parse_address(part, option)
        addr = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        if addr not in out:
            out.append(addr)
    return out


def http_get_json(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    """``(status, decoded JSON or None)`` of one GET; HTTP error statuses are returned."""
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, None


def stats_url(http_addr: str, topic: str, channel: str) -> str:
    """nsqd's /stats (JSON, no client list) for one topic and channel."""
    query = urllib.parse.urlencode(
        {"format": "json", "topic": topic, "channel": channel, "include_clients": "false"}
    )
    return f"http://{http_addr}/stats?{query}"


class BlockingConnection:
    """One TCP connection to an nsqd speaking protocol V2 (magic sent on connect).

    ``read_frames`` answers heartbeats with NOP by itself; error frames are returned to the
    caller, which decides whether they are fatal.
    """

    def __init__(self, address: str, connect_timeout: float = 5.0) -> None:
        self.address = address
        host, port = parse_address(address, "address")
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(30.0)
        self._frames = FrameReader()
        self.closed = False
        self._backlog: list[tuple[int, bytes]] = []
        self.sock.sendall(MAGIC_V2)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def read_frames(self, timeout: float | None) -> list[tuple[int, bytes]] | None:
        """Frames from one ``recv`` (heartbeats answered and dropped); None on timeout.

        Raises ConnectionError when the peer closed the connection.
        """
        if self._backlog:
            queued, self._backlog = self._backlog, []
            return queued
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return None
        if not data:
            raise ConnectionError(f"nsqd {self.address} closed the connection")
        try:
            received = self._frames.feed(data)
        except ValueError as exc:
            raise ConnectionError(f"nsqd {self.address}: {exc}") from None
        frames = [f for f in received if f[0] != FRAME_TYPE_RESPONSE or f[1] != HEARTBEAT]
        if len(frames) < len(received):
            self.sock.sendall(commands.NOP)
        return frames

    def detach_reader(self) -> FrameReader:
        """The frame decoder, holding whatever was received but not yet parsed, for a
        caller that takes over the socket (see :meth:`FrameReader.take`)."""
        if self._backlog:
            raise RuntimeError("frames are still queued on this connection")
        return self._frames

    def next_frame(self, timeout: float) -> tuple[int, bytes]:
        """The next frame other than a heartbeat; TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self._backlog:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"nsqd {self.address}: no answer within {timeout}s")
            frames = self.read_frames(left)
            if frames:
                self._backlog = frames
        return self._backlog.pop(0)

    def read_response(self, timeout: float) -> bytes:
        """The next frame's payload, which must be a response (not a message).

        Raises :class:`ProtocolError` on an error frame, TimeoutError after ``timeout``.
        """
        ftype, data = self.next_frame(timeout)
        if ftype == FRAME_TYPE_ERROR:
            raise ProtocolError.from_frame(data)
        if ftype != FRAME_TYPE_RESPONSE:
            raise ProtocolError("E_INVALID", f"unexpected frame type {ftype} from {self.address}")
        return data

    def identify(self, fields: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """IDENTIFY with feature negotiation; the server's JSON answer."""
        self.send(commands.identify({**fields, "feature_negotiation": True}))
        data = self.read_response(timeout)
        if data == b"OK":
            return {}
        try:
            out = json.loads(data)
        except ValueError:
            return {}
        return out if isinstance(out, dict) else {}

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def identify_fields(**extra: Any) -> dict[str, Any]:
    """IDENTIFY fields naming this host and nsqpy-spark, plus ``extra``."""
    hostname = socket.gethostname()
    return {
        "client_id": hostname.split(".")[0],
        "hostname": hostname,
        "user_agent": USER_AGENT,
        **extra,
    }
