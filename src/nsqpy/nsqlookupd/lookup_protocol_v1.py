"""nsqlookupd's TCP side: one :class:`LookupProtocolV1` per nsqd connection (as Go's
``nsqlookupd/tcp.go`` and ``lookup_protocol_v1.go``).

The first 4 bytes must be ``"  V1"`` (else ``E_BAD_PROTOCOL`` and close). Then:

- ``PING`` → ``OK``; refreshes the peer's last-update time once it has IDENTIFYed;
- ``IDENTIFY`` + ``[size][JSON]`` (``broadcast_address``, ``tcp_port``, ``http_port`` and
  ``version`` required) → JSON ``{broadcast_address, hostname, http_port, tcp_port, version}``
  about this nsqlookupd; the peer becomes a ``client`` producer;
- ``REGISTER``/``UNREGISTER <topic> [<channel>]`` (after IDENTIFY) → ``OK``.

Every error is fatal: its text is sent as a response and the connection is closed. When a
connection ends, its peer leaves every registration.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, cast

from .. import NSQ_VERSION
from ..goflags import format_duration_ns
from ..httpapi import go_json
from ..protocol.errors import ProtocolError
from ..protocol.lookup import (
    MAGIC_V1,
    LookupParser,
    decode_identify,
    encode_response,
    encode_text,
)
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .registration_db import PeerInfo

if TYPE_CHECKING:
    from .nsqlookupd import NSQLookupd

log = logging.getLogger("nsqlookupd")

_OK = b"OK"


def _fatal(code: str, desc: str) -> ProtocolError:
    return ProtocolError(code, desc, fatal=True)


def _topic_channel(command: str, params: list[str]) -> tuple[str, str]:
    """Go's ``getTopicChan``."""
    if not params:
        raise _fatal("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    if not is_valid_topic_name(topic):
        raise _fatal("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
    if channel and not is_valid_channel_name(channel):
        raise _fatal("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
    return topic, channel


class LookupProtocolV1(asyncio.Protocol):
    """One nsqd (or any V1 client) connected to nsqlookupd."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.peer_info: PeerInfo | None = None
        self._magic = bytearray()
        self._parser: LookupParser | None = None
        self._awaiting_body = False
        self._closed = False

    def __str__(self) -> str:
        return self.remote

    # --- connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host, port = peer[0], peer[1]
            self.remote = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        else:
            # a unix socket has no peer address; keep ids unique per connection
            self.remote = f"{peer or '@'}#{self.lookupd.next_client_number()}"
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover
                pass
        log.info("TCP: new client(%s)", self.remote)
        self.lookupd.add_client(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.lookupd.remove_client(self)
        if self._parser is not None:
            log.info("PROTOCOL(V1): [%s] exiting ioloop", self.remote)
        elif len(self._magic) < len(MAGIC_V1):
            log.error("failed to read protocol version - %s", exc or "EOF")
        if self.peer_info is not None:
            for r in self.db.remove_peer(self.peer_info.id):
                log.info(
                    "DB: client(%s) UNREGISTER category:%s key:%s subkey:%s",
                    self.remote,
                    r.category,
                    r.key,
                    r.subkey,
                )

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self._closed = True
            self.transport.close()

    # --- input --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if self._parser is None:
            need = len(MAGIC_V1) - len(self._magic)
            self._magic += data[:need]
            data = data[need:]
            if len(self._magic) < len(MAGIC_V1):
                return
            magic = bytes(self._magic)
            log.info("CLIENT(%s): desired protocol magic '%s'", self.remote, magic.decode("latin-1"))
            if magic != MAGIC_V1:
                log.error("client(%s) bad protocol magic '%s'", self.remote, magic.decode("latin-1"))
                self._send_and_close(b"E_BAD_PROTOCOL")
                return
            self._parser = LookupParser()
        parser = self._parser
        parser.feed(data)
        out: list[bytes] = []
        try:
            while True:
                if self._awaiting_body:
                    body = parser.next_body()
                    if body is None:
                        break
                    self._awaiting_body = False
                    out.append(self._identify(body))
                    continue
                params = parser.next_line()
                if params is None:
                    break
                resp = self._exec(params)
                if resp is not None:
                    out.append(resp)
        except ProtocolError as e:
            log.error("[%s] - %s", self.remote, e)
            out.append(encode_text(e.text()))
            assert self.transport is not None
            self.transport.write(b"".join(encode_response(r) for r in out))
            self.close()
            return
        if out:
            assert self.transport is not None
            self.transport.write(b"".join(encode_response(r) for r in out))

    def _send_and_close(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(encode_response(data))
        self.close()

    # --- commands -----------------------------------------------------------------------

    def _exec(self, params: list[str]) -> bytes | None:
        name = params[0]
        if name == "PING":
            return self._ping()
        if name == "IDENTIFY":
            if self.peer_info is not None:
                raise _fatal("E_INVALID", "cannot IDENTIFY again")
            self._awaiting_body = True
            return None
        if name == "REGISTER":
            return self._register(params[1:])
        if name == "UNREGISTER":
            return self._unregister(params[1:])
        raise _fatal("E_INVALID", f"invalid command {name}")

    def _ping(self) -> bytes:
        peer = self.peer_info
        if peer is not None:
            now = self.lookupd.now_ns()
            log.info("CLIENT(%s): pinged (last ping %s)", peer.id, format_duration_ns(now - peer.last_update))
            peer.last_update = now
        return _OK

    def _identify(self, body: bytes) -> bytes:
        try:
            fields = decode_identify(body)
        except ValueError:
            raise _fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        fields["remote_address"] = self.remote
        if (
            not fields["broadcast_address"]
            or not fields["tcp_port"]
            or not fields["http_port"]
            or not fields["version"]
        ):
            raise _fatal("E_BAD_BODY", "IDENTIFY missing fields")
        peer = PeerInfo(id=self.remote, last_update=self.lookupd.now_ns(), **fields)
        log.info(
            "CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s",
            self.remote,
            peer.broadcast_address,
            peer.tcp_port,
            peer.http_port,
            peer.version,
        )
        self.peer_info = peer
        if self.db.identify(peer):
            log.info("DB: client(%s) REGISTER category:client key: subkey:", self.remote)
        lookupd = self.lookupd
        return go_json(
            {
                "broadcast_address": lookupd.options.broadcast_address,
                "hostname": socket.gethostname(),
                # Go answers 0 for a listener that is not TCP (a unix socket)
                "http_port": max(lookupd.http_port, 0),
                "tcp_port": max(lookupd.tcp_port, 0),
                "version": NSQ_VERSION,
            }
        )

    def _register(self, params: list[str]) -> bytes:
        peer = self.peer_info
        if peer is None:
            raise _fatal("E_INVALID", "client must IDENTIFY")
        topic, channel = _topic_channel("REGISTER", params)
        for r in self.db.register(peer, topic, channel):
            log.info(
                "DB: client(%s) REGISTER category:%s key:%s subkey:%s",
                self.remote,
                r.category,
                r.key,
                r.subkey,
            )
        return _OK

    def _unregister(self, params: list[str]) -> bytes:
        peer = self.peer_info
        if peer is None:
            raise _fatal("E_INVALID", "client must IDENTIFY")
        topic, channel = _topic_channel("UNREGISTER", params)
        removed, unexpected = self.db.unregister(peer, topic, channel)
        for r in removed:
            if r in unexpected:
                log.warning(
                    "client(%s) unexpected UNREGISTER category:%s key:%s subkey:%s",
                    self.remote,
                    r.category,
                    r.key,
                    r.subkey,
                )
            else:
                log.info(
                    "DB: client(%s) UNREGISTER category:%s key:%s subkey:%s",
                    self.remote,
                    r.category,
                    r.key,
                    r.subkey,
                )
        return _OK
