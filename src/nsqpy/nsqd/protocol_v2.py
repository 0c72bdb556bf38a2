"""TCP protocol V2's command loop and commands (Go's ``protocol_v2.go``).

:class:`ProtocolV2` is the connection object nsqd creates per TCP client: it turns the bytes
of :class:`~nsqpy.nsqd.client_v2.ClientV2` into commands with :class:`CommandParser` and runs
each against the daemon's topics and channels. The connection state it acts on (output
buffer, heartbeats, flow control, in-flight tracking, the transport upgrades) lives in
:mod:`~nsqpy.nsqd.client_v2`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, ClassVar

from .. import NSQ_VERSION
from ..goflags import go_quote
from ..protocol.commands import Body, CommandParser, LineTooLong, decode_mpub, receive_scratch
from ..protocol.errors import ProtocolError
from ..protocol.frames import (
    CLOSE_WAIT_FRAME,
    MAGIC_V2,
    OK_FRAME,
    encode_error,
    encode_response,
)
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .auth import AuthError, AuthState
from .client_v2 import (
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    ClientV2,
    fatal,
    parse_base10,
)
from .diskqueue import DiskQueueError
from .policy import PolicyRejectedError
from .topic import TopicExitingError

if TYPE_CHECKING:
    from ..transport import DeflateLayer, SnappyLayer
    from .nsqd import NSQD

log = logging.getLogger("nsqd")

#: Seconds a client has to finish the TLS handshake after IDENTIFY (Go's deadline).
TLS_HANDSHAKE_TIMEOUT = 5.0


class ProtocolV2(ClientV2):
    """TCP protocol V2 on one client connection: the command loop and the commands."""

    def __init__(self, nsqd: NSQD) -> None:
        super().__init__(nsqd)
        self._magic = b""
        self._parser = CommandParser()
        #: commands fail until the TLS upgrade (--tls-required, except for IDENTIFY)
        self._tls_block = nsqd.options.tls_required != "false"
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._pending_compression: tuple[str, int] | None = None

    #: command name -> method (one table for every connection: bound methods per connection
    #: cost ~1 KiB each of thousands of idle consumers); filled below the class
    _handlers: ClassVar[dict[bytes, Callable[[ProtocolV2, list[bytes], Body], None]]] = {}

    def get_buffer(self, sizehint: int) -> memoryview:
        """asyncio.BufferedProtocol: the parser's buffer once the magic is in and while no
        upgrade wraps the bytes (a large body is received in place), else the scratch for
        :meth:`data_received` (nothing runs between this call and :meth:`buffer_updated`,
        which makes the same choice)."""
        if self._stack is None and len(self._magic) == 4:
            return self._parser.get_buffer()
        return receive_scratch()

    def buffer_updated(self, nbytes: int) -> None:
        if self._stack is not None or len(self._magic) < 4:
            self.data_received(bytes(receive_scratch()[:nbytes]))
            return
        if self.closed:
            return
        self._last_read = self.nsqd.loop.time()
        self._parser.received(nbytes)
        self._process()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._last_read = self.nsqd.loop.time()
        if self._stack is not None:
            data = self._unwrap(data)
            if not data:
                return
        if len(self._magic) < 4:
            need = 4 - len(self._magic)
            self._magic += data[:need]
            data = data[need:]
            if len(self._magic) < 4:
                return
            if self._magic != MAGIC_V2:
                log.error("client(%s) bad protocol magic %r", self.remote_address, self._magic)
                self._append(encode_error(b"E_BAD_PROTOCOL"))
                self.close_after_flush()
                return
            if not data:
                return
        self._parser.feed(data)
        self._process()

    def _process(self) -> None:
        """Run every complete command buffered, then write the answers once."""
        parser = self._parser
        handlers = self._handlers
        validate = self._validate
        while not self.closed and not self._suspended:
            ch = self.channel
            if ch is not None and ch.e2e is None and ch.ledger is None and not self._tls_block:
                # the consumer's hot path: a run of FINs straight off the in-flight index
                # (what _fin does for each; one that fails is left to it, for its error)
                n = parser.apply_fins(ch.in_flight, self)
                if n:
                    self.finish_count += n
                    self.in_flight_count -= n
                    if not self.in_flight_count:
                        ch.all_finished(self)
                    ch.finished_many()
            try:
                cmd = parser.next(validate)
                if cmd is None:
                    break
                name, params, body = cmd
                if self._tls_block and name != b"IDENTIFY":
                    raise self._tls_required_error(name)
                handler = handlers.get(name)
                if handler is None:
                    raise fatal("E_INVALID", "invalid command " + name.decode("utf-8", "replace"))
                handler(self, params, body)
            except LineTooLong:
                log.error("[%s] failed to read command - line too long", self.remote_address)
                self.abort()
                return
            except ProtocolError as err:
                log.error("[%s] - %s", self.remote_address, err.text())
                self._append(encode_error(err.text().encode()))
                if err.fatal:
                    self.close_after_flush()
                    return
        self.flush()

    def _error(self, err: ProtocolError) -> None:
        log.error("[%s] - %s", self.remote_address, err.text())
        self._append(encode_error(err.text().encode()))
        if err.fatal:
            self.close_after_flush()

    # --- transport upgrades (TLS, snappy, deflate) ---------------------------------------------

    def _unwrap(self, data: bytes) -> bytes:
        """Wire bytes through the transport stack (TLS, then decompression)."""
        # the transport layers are imported with the first upgrade: a daemon whose clients
        # never ask for one does without them
        from ..transport import TransportError

        stack = self._stack
        assert stack is not None
        try:
            data = stack.receive(data)
        except TransportError as e:
            alert = stack.output()  # a TLS alert for the peer, as Go's handshake sends
            if alert and self.transport is not None:
                self.transport.write(alert)
            if self._handshake_timer is not None:
                self._tls_failed(str(e))
            else:
                log.error("[%s] failed to read command - %s", self.remote_address, e)
                self.abort()
            return b""
        out = stack.output()
        if out and self.transport is not None:
            self.transport.write(out)
        if self._handshake_timer is not None:
            tls = stack.tls
            if tls is None or not tls.handshake_done:
                return data
            self._tls_established()
            if self.closed:
                return b""
        return data

    def _start_tls(self, compression: tuple[str, int] | None) -> None:
        """After the plain IDENTIFY response: the TLS handshake (the OK goes over TLS once it
        completes, then the compression upgrade); commands wait meanwhile."""
        from ..transport import Stack, TLSLayer

        ctx = self.nsqd.tls_context
        assert ctx is not None
        log.info("PROTOCOL(V2): [%s] upgrading connection to TLS", self.remote_address)
        self._stack = Stack()
        self._stack.push(TLSLayer(ctx, server_side=True))
        self._pending_compression = compression
        self._suspended = True
        self._handshake_timer = self.nsqd.loop.call_later(
            TLS_HANDSHAKE_TIMEOUT, self._tls_failed, "TLS handshake timeout"
        )
        leftover = self._parser.take_buffered()
        if leftover:
            rest = self._unwrap(leftover)
            if rest:
                self._parser.feed(rest)

    def _tls_established(self) -> None:
        assert self._handshake_timer is not None
        self._handshake_timer.cancel()
        self._handshake_timer = None
        self.tls = True
        self._tls_block = False
        self._append(OK_FRAME)
        self.flush()
        if self._pending_compression is not None:
            kind, level = self._pending_compression
            self._pending_compression = None
            self._compress(kind, level)
        self._suspended = False
        self._resume_reading()

    def _tls_failed(self, reason: str) -> None:
        """A failed handshake: Go's E_IDENTIFY_FAILED, written in plain text, then close."""
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if self.closed:
            return
        text = f"E_IDENTIFY_FAILED IDENTIFY failed {reason}"
        log.error("[%s] - %s", self.remote_address, text)
        self._stack = None
        self._out.clear()
        self._append(encode_error(text.encode()))
        self.close_after_flush()

    def _compress(self, kind: str, level: int) -> None:
        """snappy or deflate on top of the stack; Go's OK goes through it."""
        from ..transport import DeflateLayer, SnappyLayer, Stack, TransportError

        if kind == "snappy":
            log.info("PROTOCOL(V2): [%s] upgrading connection to snappy", self.remote_address)
            layer: SnappyLayer | DeflateLayer = SnappyLayer()
            self.snappy = True
        else:
            log.info(
                "PROTOCOL(V2): [%s] upgrading connection to deflate (level %d)",
                self.remote_address,
                level,
            )
            layer = DeflateLayer(level)
            self.deflate = True
        leftover = self._parser.take_buffered()
        if self._stack is None:
            self._stack = Stack()
        try:
            pending = self._stack.push(layer, leftover)
        except TransportError as e:
            # the commands pipelined after IDENTIFY are not in the negotiated compression:
            # the OK goes out (compressed, as Go's), then the read fails as in _unwrap
            self._append(OK_FRAME)
            self.flush()
            log.error("[%s] failed to read command - %s", self.remote_address, e)
            self.abort()
            return
        self._append(OK_FRAME)
        self.flush()
        if pending:
            self._parser.feed(pending)

    def _tls_required_error(self, name: bytes) -> ProtocolError:
        cmd = name.decode("utf-8", "replace")
        return fatal("E_INVALID", f"cannot {cmd} in current state (TLS required)")

    # --- AUTH ------------------------------------------------------------------------------------

    def _suspend(self, work: Coroutine[Any, Any, Any], then: Callable[[Any], None]) -> None:
        """Stop running commands (and reading) until ``work`` is done; then ``then(result)``
        runs (it may raise ProtocolError) and the buffered commands continue."""
        self._suspended = True
        if self.transport is not None:
            self.transport.pause_reading()
        task = self.nsqd.loop.create_task(work)
        task.add_done_callback(lambda t: self._resume_after(t, then))

    def _resume_after(self, task: asyncio.Task[Any], then: Callable[[Any], None]) -> None:
        self._suspended = False
        if self.closed or task.cancelled():
            return
        try:
            then(task.result())
        except ProtocolError as err:
            self._error(err)
            if err.fatal:
                return
        self._resume_reading()
        self._process()

    async def _query_auth(self) -> AuthState | AuthError:
        """Go's QueryAuthd for this client (errors are returned, to be logged once)."""
        client = self.nsqd.auth_client
        assert client is not None
        remote_ip = ""
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        if isinstance(peer, tuple):
            remote_ip = str(peer[0])
        common_name = ""
        tls = self._stack.tls if self.tls and self._stack is not None else None
        if tls is not None:
            common_name = tls.peer_common_name()
        try:
            return await client.query_any(remote_ip, self.tls, common_name, self.auth_secret)
        except AuthError as e:
            return e

    def _check_auth(self, cmd: str, topic: str, channel: str, retry: Callable[[], None] | None) -> bool:
        """Go's CheckAuth. True: allowed now. False: the authorizations expired and are being
        fetched again; ``retry`` runs the command once they are back. Raises the fatal
        E_AUTH_FIRST / E_AUTH_FAILED / E_UNAUTHORIZED."""
        if self.nsqd.auth_client is None:
            return True
        st = self.auth_state
        if st is None or not st.authorizations:
            raise fatal("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if st.is_expired():
            if retry is None:
                return True  # checked again once the body is read

            def refreshed(result: AuthState | AuthError) -> None:
                if isinstance(result, AuthError):
                    log.warning("PROTOCOL(V2): [%s] AUTH failed %s", self.remote_address, result)
                    raise fatal("E_AUTH_FAILED", "AUTH failed")
                self.auth_state = result
                if not result.is_allowed(topic, channel):
                    raise fatal(
                        "E_UNAUTHORIZED",
                        f"AUTH failed for {cmd} on {go_quote(topic)} {go_quote(channel)}",
                    )
                retry()

            self._suspend(self._query_auth(), refreshed)
            return False
        if not st.is_allowed(topic, channel):
            raise fatal(
                "E_UNAUTHORIZED",
                f"AUTH failed for {cmd} on {go_quote(topic)} {go_quote(channel)}",
            )
        return True

    # --- validation before a body is buffered ----------------------------------------------------

    def _validate(self, name: bytes, params: list[bytes], size: int | None) -> None:
        if self._tls_block and name != b"IDENTIFY" and size is None:
            raise self._tls_required_error(name)
        opts = self.nsqd.options
        if name == b"PUB" or name == b"DPUB":
            cmd = name.decode()
            if size is None:
                if len(params) < (2 if name == b"PUB" else 3):
                    raise fatal("E_INVALID", f"{cmd} insufficient number of parameters")
                self._check_topic(cmd, params[1])
                if name == b"DPUB":
                    ms = parse_base10(params[2])
                    if ms is None:
                        raw = params[2].decode("utf-8", "replace")
                        raise fatal("E_INVALID", f"DPUB could not parse timeout {raw}")
                    max_ms = int(opts.max_req_timeout * 1000)
                    if ms > max_ms:
                        raise fatal("E_INVALID", f"DPUB timeout {ms} out of range 0-{max_ms}")
                return
            if size <= 0:
                raise fatal("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
            if size > opts.max_msg_size:
                raise fatal("E_BAD_MESSAGE", f"{cmd} message too big {size} > {opts.max_msg_size}")
        elif name == b"MPUB":
            if size is None:
                if len(params) < 2:
                    raise fatal("E_INVALID", "MPUB insufficient number of parameters")
                topic = self._check_topic("MPUB", params[1], prefix="E_BAD_TOPIC ")
                # Go checks MPUB's authorization before reading its body
                self._check_auth("MPUB", topic, "", None)
                return
            if size <= 0:
                raise fatal("E_BAD_BODY", f"MPUB invalid body size {size}")
            if size > opts.max_body_size:
                raise fatal("E_BAD_BODY", f"MPUB body too big {size} > {opts.max_body_size}")
        elif name == b"IDENTIFY" or name == b"AUTH":
            cmd = name.decode()
            if size is None:
                if self.state != STATE_INIT:
                    raise fatal("E_INVALID", f"cannot {cmd} in current state")
                if name == b"AUTH" and len(params) != 1:
                    raise fatal("E_INVALID", "AUTH invalid number of parameters")
                return
            if size > opts.max_body_size:
                raise fatal("E_BAD_BODY", f"{cmd} body too big {size} > {opts.max_body_size}")
            if size <= 0:
                raise fatal("E_BAD_BODY", f"{cmd} invalid body size {size}")

    def _check_topic(self, cmd: str, raw: bytes, prefix: str = "") -> str:
        name = raw.decode("utf-8", "replace")
        if name not in self.nsqd.topics and not is_valid_topic_name(name):
            raise fatal("E_BAD_TOPIC", f"{prefix}{cmd} topic name {go_quote(name)} is not valid")
        return name

    # --- commands -----------------------------------------------------------------------------

    def _identify(self, params: list[bytes], body: Body) -> None:
        try:
            data = json.loads(body or b"")
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            raise fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        err = self._apply_identify(data)
        if err:
            raise fatal("E_BAD_BODY", "IDENTIFY " + err)
        self.identified = True
        log.info("[%s] IDENTIFY: %s", self.remote_address, data)
        if not data.get("feature_negotiation"):
            self._append(OK_FRAME)
            return
        nsqd = self.nsqd
        opts = nsqd.options
        tlsv1 = nsqd.tls_context is not None and bool(data.get("tls_v1"))
        deflate = opts.deflate and bool(data.get("deflate"))
        deflate_level = 6
        requested_level = data.get("deflate_level") or 0
        if deflate and requested_level > 0:
            deflate_level = requested_level
        if opts.max_deflate_level < deflate_level:
            deflate_level = opts.max_deflate_level
        snappy = opts.snappy and bool(data.get("snappy"))
        if deflate and snappy:
            raise fatal("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        resp = {
            "max_rdy_count": opts.max_rdy_count,
            "version": NSQ_VERSION,
            "max_msg_timeout": int(opts.max_msg_timeout * 1000),
            "msg_timeout": int(self.msg_timeout * 1000),
            "tls_v1": tlsv1,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": nsqd.auth_client is not None,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": int(self.output_buffer_timeout * 1000),
        }
        self._append(encode_response(json.dumps(resp, separators=(",", ":")).encode()))
        compression = ("snappy", 0) if snappy else ("deflate", deflate_level) if deflate else None
        if tlsv1 or compression is not None:
            self.flush()  # the response goes out before the upgrade, in plain text
        if tlsv1:
            self._start_tls(compression)
        elif compression is not None:
            self._compress(*compression)

    def _auth(self, params: list[bytes], body: Body) -> None:
        if self.has_authorizations():
            raise fatal("E_INVALID", "AUTH already set")
        if self.nsqd.auth_client is None:
            raise fatal("E_AUTH_DISABLED", "AUTH disabled")
        self.auth_secret = (body or b"").decode("utf-8", "replace")

        def answered(result: AuthState | AuthError) -> None:
            if isinstance(result, AuthError):
                # the auth server's errors are not for untrusted clients: logged only
                log.warning("PROTOCOL(V2): [%s] AUTH failed %s", self.remote_address, result)
                raise fatal("E_AUTH_FAILED", "AUTH failed")
            self.auth_state = result
            if not result.authorizations:
                raise fatal("E_UNAUTHORIZED", "AUTH no authorizations found")
            resp = {
                "identity": result.identity,
                "identity_url": result.identity_url,
                "permission_count": len(result.authorizations),
            }
            self._append(encode_response(json.dumps(resp, separators=(",", ":")).encode()))

        self._suspend(self._query_auth(), answered)

    def _sub(self, params: list[bytes], body: Body) -> None:
        if self.state != STATE_INIT:
            raise fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise fatal("E_INVALID", "SUB insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "replace")
        if not is_valid_topic_name(topic_name):
            raise fatal("E_BAD_TOPIC", f"SUB topic name {go_quote(topic_name)} is not valid")
        channel_name = params[2].decode("utf-8", "replace")
        if not is_valid_channel_name(channel_name):
            raise fatal("E_BAD_CHANNEL", f"SUB channel name {go_quote(channel_name)} is not valid")
        if not self._check_auth("SUB", topic_name, channel_name, lambda: self._sub(params, body)):
            return
        nsqd = self.nsqd
        if nsqd.exiting:
            raise fatal("E_INVALID", "cannot SUB in current state")
        channel = nsqd.get_topic(topic_name).get_channel(channel_name)
        if not channel.add_client(self):
            raise fatal(
                "E_TOO_MANY_CHANNEL_CONSUMERS",
                f"channel consumers for {topic_name}:{channel_name} exceeds limit of "
                f"{nsqd.options.max_channel_consumers}",
            )
        self.state = STATE_SUBSCRIBED
        self.channel = channel
        self._append(OK_FRAME)

    def _rdy(self, params: list[bytes], body: Body) -> None:
        state = self.state
        if state == STATE_CLOSING:
            return
        if state != STATE_SUBSCRIBED:
            raise fatal("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = parse_base10(params[1])
            if parsed is None:
                raise fatal("E_INVALID", f"RDY could not parse count {params[1].decode('utf-8', 'replace')}")
            count = parsed
        max_rdy = self.nsqd.options.max_rdy_count
        if count > max_rdy:
            raise fatal("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.ready_count = count
        if self.channel is not None:
            self.channel.schedule_pump()

    def _msg_id(self, cmd: str, params: list[bytes], nparams: int) -> bytes:
        state = self.state
        if state != STATE_SUBSCRIBED and state != STATE_CLOSING:
            raise fatal("E_INVALID", f"cannot {cmd} in current state")
        if len(params) < nparams:
            raise fatal("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != 16:
            raise fatal("E_INVALID", "Invalid Message ID")
        return msg_id

    def _fin(self, params: list[bytes], body: Body) -> None:
        # the hottest consumer command: the channel's fast path, errors take the slow one
        ch = self.channel
        if len(params) == 2 and ch is not None and ch.finish(self, params[1]) is None:
            self.finish_count += 1
            self.in_flight_count -= 1
            if not self.in_flight_count:
                ch.all_finished(self)
            return
        msg_id = self._msg_id("FIN", params, 2)
        assert ch is not None
        err = ch.finish(self, msg_id)
        if err is not None:
            raise ProtocolError("E_FIN_FAILED", f"FIN {msg_id.decode('latin-1')} failed {err}", fatal=False)
        self.finish_count += 1
        self.in_flight_count -= 1

    def _req(self, params: list[bytes], body: Body) -> None:
        msg_id = self._msg_id("REQ", params, 3)
        ms = parse_base10(params[2])
        if ms is None:
            raise fatal("E_INVALID", f"REQ could not parse timeout {params[2].decode('utf-8', 'replace')}")
        delay = ms / 1000
        max_req = self.nsqd.options.max_req_timeout
        if delay > max_req:
            log.info(
                "PROTOCOL(V2): [%s] REQ timeout %dms out of range 0-%dms. Setting to max",
                self.remote_address,
                ms,
                int(max_req * 1000),
            )
            delay = max_req
        ch = self.channel
        assert ch is not None
        err = ch.requeue(self, msg_id, delay)
        if err is not None:
            raise ProtocolError("E_REQ_FAILED", f"REQ {msg_id.decode('latin-1')} failed {err}", fatal=False)
        self.requeue_count += 1
        self.in_flight_count -= 1
        ch.schedule_pump()

    def _touch(self, params: list[bytes], body: Body) -> None:
        msg_id = self._msg_id("TOUCH", params, 2)
        ch = self.channel
        assert ch is not None
        err = ch.touch(self, msg_id)
        if err is not None:
            raise ProtocolError(
                "E_TOUCH_FAILED", f"TOUCH {msg_id.decode('latin-1')} failed {err}", fatal=False
            )

    def _cls(self, params: list[bytes], body: Body) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise fatal("E_INVALID", "cannot CLS in current state")
        self.ready_count = 0
        self.state = STATE_CLOSING
        self._append(CLOSE_WAIT_FRAME)

    def _nop(self, params: list[bytes], body: Body) -> None:
        return None

    def _publish(self, code: str, cmd: str, topic_name: str, bodies: list[bytes], defer: float) -> None:
        nsqd = self.nsqd
        if nsqd.auth_client is not None and not self._check_auth(
            cmd, topic_name, "", lambda: self._publish(code, cmd, topic_name, bodies, defer)
        ):
            return
        syncer = nsqd.syncer
        assert syncer is not None
        urgent = syncer.urgent_requests
        try:
            if nsqd.exiting:
                raise TopicExitingError()
            topic = nsqd.get_topic(topic_name)
            topic.put_bodies(bodies, defer)
        except PolicyRejectedError as e:
            # a full queue is back pressure, not a broken connection: the publisher is told
            # and may try again on the same connection (nothing of the publish was stored)
            raise ProtocolError(code, f"{cmd} failed {e}", fatal=False) from None
        except (TopicExitingError, DiskQueueError, OSError) as e:
            raise fatal(code, f"{cmd} failed {e}") from None
        pc = self.pub_counts
        pc[topic_name] = pc.get(topic_name, 0) + len(bodies)
        self._append(OK_FRAME)
        if topic.starting:
            # as Go's GetTopic: answered once the channels nsqlookupd knows exist
            self._hold_for_start(topic)
        if syncer.urgent_requests != urgent:
            # this publish reached a queue's --sync-every: its OK waits for the fsync
            self._hold_for_sync(code, cmd)

    def _pub(self, params: list[bytes], body: Body) -> None:
        assert isinstance(body, bytes)  # (only an MPUB body may be a bytearray)
        self._publish("E_PUB_FAILED", "PUB", params[1].decode("utf-8", "replace"), [body], 0.0)

    def _dpub(self, params: list[bytes], body: Body) -> None:
        assert isinstance(body, bytes)
        ms = parse_base10(params[2]) or 0
        self._publish("E_DPUB_FAILED", "DPUB", params[1].decode("utf-8", "replace"), [body], ms / 1000)

    def _mpub(self, params: list[bytes], body: Body) -> None:
        assert body is not None
        opts = self.nsqd.options
        bodies = decode_mpub(body, opts.max_msg_size, opts.max_body_size)
        self._publish("E_MPUB_FAILED", "MPUB", params[1].decode("utf-8", "replace"), bodies, 0.0)


ProtocolV2._handlers.update(
    {
        b"PUB": ProtocolV2._pub,
        b"MPUB": ProtocolV2._mpub,
        b"FIN": ProtocolV2._fin,
        b"RDY": ProtocolV2._rdy,
        b"REQ": ProtocolV2._req,
        b"TOUCH": ProtocolV2._touch,
        b"NOP": ProtocolV2._nop,
        b"DPUB": ProtocolV2._dpub,
        b"IDENTIFY": ProtocolV2._identify,
        b"SUB": ProtocolV2._sub,
        b"CLS": ProtocolV2._cls,
        b"AUTH": ProtocolV2._auth,
    }
)
