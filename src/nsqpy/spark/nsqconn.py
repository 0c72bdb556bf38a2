"""Blocking protocol-V2 connections and small HTTP helpers for the Spark source and sink.

The Spark source runs inside Spark's Python runner process and the sink inside Python
workers: both are plain blocking code with no event loop. :class:`BlockingConnection` is a
thin shell around the sans-I/O :class:`~nsqpy.protocol.client.ClientProtocol` over a blocking
socket: the protocol does the handshake (IDENTIFY, TLS, snappy/deflate, AUTH), answers
heartbeats and matches responses to requests; the shell only moves bytes.

The source's hot path walks message frames itself (:mod:`.burst`): after the handshake it
takes the protocol's frame reader (with any partial frame), reads application bytes with
:meth:`BlockingConnection.recv` (the plain socket's bytes when there is no TLS or
compression) and hands back the other frames it finds to
:meth:`BlockingConnection.frames_received`, which treats them exactly as the protocol does.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Mapping
from typing import Any

from nsqpy.protocol.address import split_address
from nsqpy.protocol.client import Answer, ClientProtocol, Ready, ServerError
from nsqpy.protocol.frames import FrameReader
from nsqpy.transport import TLSContext, TransportError

__all__ = [
    "Answer",
    "BlockingConnection",
    "Ready",
    "ServerError",
    "http_get_json",
    "stats_url",
]

#: The most one recv takes from the socket.
RECV_SIZE = 1 << 20
#: How long a write may block (nsqd not reading); go-nsq's write_timeout is 1 s.
WRITE_TIMEOUT_S = 10.0


def http_get_json(
    url: str, timeout: float = 5.0, headers: Mapping[str, str] | None = None
) -> tuple[int, Any]:
    """``(status, decoded JSON or None)`` of one GET; HTTP error statuses are returned."""
    req = urllib.request.Request(url, headers=dict(headers or {"Accept": "application/vnd.nsq; version=1.0"}))
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
    """One connection to an nsqd: a blocking socket under a :class:`ClientProtocol`.

    Requests (commands nsqd answers) are matched to their :class:`Answer` by the protocol's
    FIFO; heartbeats are answered with NOP as they are received. Error frames raise or come
    back typed, as the protocol makes them.
    """

    def __init__(
        self,
        address: str,
        identify: Mapping[str, Any],
        *,
        tls_context: TLSContext | None = None,
        auth_secret: str | bytes | None = None,
        deflate_level: int = 6,
        connect_timeout: float = 5.0,
        sock: socket.socket | None = None,
    ) -> None:
        """Connect to ``address`` (or use ``sock``, already connected); nothing is sent
        before :meth:`handshake`."""
        self.address = address
        host, port = split_address(address)
        self.proto: ClientProtocol[Any] = ClientProtocol(
            identify,
            tls_context=tls_context,
            server_hostname=host if tls_context is not None else None,
            auth_secret=auth_secret,
            deflate_level=deflate_level,
        )
        if sock is None:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.closed = False
        self._events: deque[Any] = deque()
        #: the server's IDENTIFY answer, once the handshake is done
        self.settings: dict[str, Any] = {}

    # --- sending --------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what the protocol has to send (commands, NOPs, TLS records)."""
        out = self.proto.data_to_send()
        if out:
            # the socket's timeout is the last read's, which can be a few milliseconds
            self.sock.settimeout(WRITE_TIMEOUT_S)
            self.sock.sendall(out)

    def send(self, data: bytes) -> None:
        """Commands nsqd does not answer (RDY, FIN, REQ, TOUCH, NOP)."""
        self.proto.send(data)
        self.flush()

    def request(self, data: bytes, token: Any = None) -> None:
        """A command nsqd answers (PUB, MPUB, SUB, CLS); its :class:`Answer` carries
        ``token``."""
        self.proto.send_request(data, token)
        self.flush()

    # --- receiving ------------------------------------------------------------------------

    def _recv_raw(self, timeout: float | None) -> bytes | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(RECV_SIZE)
        except TimeoutError:
            return None
        if not data:
            raise ConnectionError(f"nsqd {self.address} closed the connection")
        return data

    def _receive_events(self, timeout: float | None) -> list[Any] | None:
        """Events of one recv through the protocol (None on timeout). During the handshake
        the protocol's errors are raised as they are; after it, what the layers or the frame
        decoder cannot read is a ConnectionError."""
        data = self._recv_raw(timeout)
        if data is None:
            return None
        try:
            events = self.proto.receive(data)
        except TransportError as exc:
            if not self.proto.ready:
                raise
            raise ConnectionError(f"nsqd {self.address}: {exc}") from None
        except ValueError as exc:  # a corrupt frame stream
            raise ConnectionError(f"nsqd {self.address}: {exc}") from None
        self.flush()
        return events

    def handshake(self, timeout: float = 5.0) -> Ready:
        """Magic, IDENTIFY, the upgrades and AUTH; the server's IDENTIFY answer is then in
        :attr:`settings`. Raises the server's error (:class:`ProtocolError`, e.g.
        ``E_AUTH_FAILED``), :class:`~nsqpy.protocol.client.HandshakeError`,
        :class:`TransportError` (TLS), ConnectionError or TimeoutError."""
        self.proto.start()
        self.flush()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"nsqd {self.address}: no handshake within {timeout}s")
            events = self._receive_events(left)
            for i, event in enumerate(events or ()):
                if isinstance(event, Ready):
                    self.settings = event.settings
                    self._events.extend(events[i + 1 :])  # type: ignore[index]
                    return event

    def answer(self, timeout: float) -> Answer:
        """The next :class:`Answer` (to the oldest request still waiting). A fatal error
        frame no request owns is raised; non-fatal ones are skipped; a message here is a
        protocol violation (ConnectionError). TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        events = self._events
        while True:
            while events:
                event = events.popleft()
                if isinstance(event, Answer):
                    return event
                if isinstance(event, ServerError):
                    if event.error.fatal:
                        raise event.error
                    continue
                raise ConnectionError(f"nsqd {self.address}: unexpected message frames")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"nsqd {self.address}: no answer within {timeout}s")
            received = self._receive_events(left)
            if received:
                events.extend(received)

    # --- the burst reader's path ----------------------------------------------------------

    def frame_reader(self) -> FrameReader:
        """The protocol's frame reader, holding what was received after the last complete
        frame, for a caller that walks frames itself over :meth:`recv`'s bytes."""
        if self._events:
            raise RuntimeError(f"nsqd {self.address}: events are still queued on this connection")
        return self.proto.frames

    def recv(self, timeout: float | None) -> bytes | None:
        """Application bytes of one recv (decrypted and decompressed; b"" while a layer
        waits for more); None on timeout. ConnectionError when nsqd closed the
        connection or sent what the layers cannot decode."""
        data = self._recv_raw(timeout)
        if data is None:
            return None
        stack = self.proto.stack
        if stack.layers:
            try:
                data = stack.receive(data)
            except TransportError as exc:
                raise ConnectionError(f"nsqd {self.address}: {exc}") from None
            self.flush()  # TLS may have something to say (key update, alert)
        return data

    def frames_received(self, frames: list[tuple[int, bytes]]) -> list[Answer | ServerError]:
        """The non-message frames a caller of :meth:`frame_reader` found, handled as the
        protocol handles them: heartbeats answered (the NOP is sent now), responses and
        errors matched to the requests waiting, in order."""
        # the burst reader walks the protocol's reader's bytes in its place
        events: list[Answer | ServerError] = self.proto.frames_received(frames)
        self.flush()
        return events

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass
