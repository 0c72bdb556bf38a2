"""TCP protocol V2's command loop and commands (Go's ``protocol_v2.go``).

:class:`ProtocolV2` is the connection object nsqd creates per TCP client: it turns the bytes
of :class:`~nsqpy.nsqd.client_v2.ClientV2` into commands with :class:`CommandParser` and runs
each against the daemon's topics and channels. The connection state it acts on (output
buffer, heartbeats, flow control, in-flight tracking, the transport upgrades) lives in
:mod:`~nsqpy.nsqd.client_v2`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import NSQ_VERSION
from ..goflags import go_quote
from ..protocol.commands import CommandParser, LineTooLong, decode_mpub
from ..protocol.errors import ProtocolError
from ..protocol.frames import (
    CLOSE_WAIT_FRAME,
    MAGIC_V2,
    OK_FRAME,
    encode_error,
    encode_response,
)
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .client_v2 import (
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    ClientV2,
    fatal,
    parse_base10,
)
from .diskqueue import DiskQueueError
from .topic import TopicExitingError

if TYPE_CHECKING:
    from .nsqd import NSQD

log = logging.getLogger("nsqd")


class ProtocolV2(ClientV2):
    """TCP protocol V2 on one client connection: the command loop and the commands."""

    def __init__(self, nsqd: NSQD) -> None:
        super().__init__(nsqd)
        self._magic = b""
        self._parser = CommandParser()
        self._handlers: dict[bytes, Callable[[list[bytes], bytes | None], None]] = {
            b"PUB": self._pub,
            b"MPUB": self._mpub,
            b"FIN": self._fin,
            b"RDY": self._rdy,
            b"REQ": self._req,
            b"TOUCH": self._touch,
            b"NOP": self._nop,
            b"DPUB": self._dpub,
            b"IDENTIFY": self._identify,
            b"SUB": self._sub,
            b"CLS": self._cls,
            b"AUTH": self._auth,
        }

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._last_read = self.nsqd.loop.time()
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
        parser = self._parser
        parser.feed(data)
        handlers = self._handlers
        validate = self._validate
        while not self.closed:
            try:
                cmd = parser.next(validate)
                if cmd is None:
                    break
                name, params, body = cmd
                handler = handlers.get(name)
                if handler is None:
                    raise fatal("E_INVALID", "invalid command " + name.decode("utf-8", "replace"))
                handler(params, body)
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

    # --- validation before a body is buffered ----------------------------------------------------

    def _validate(self, name: bytes, params: list[bytes], size: int | None) -> None:
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
                self._check_topic("MPUB", params[1], prefix="E_BAD_TOPIC ")
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

    def _identify(self, params: list[bytes], body: bytes | None) -> None:
        try:
            data = json.loads(body or b"")
        except ValueError:
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
        opts = self.nsqd.options
        deflate_level = 6
        if opts.max_deflate_level < deflate_level:
            deflate_level = opts.max_deflate_level
        resp = {
            "max_rdy_count": opts.max_rdy_count,
            "version": NSQ_VERSION,
            "max_msg_timeout": int(opts.max_msg_timeout * 1000),
            "msg_timeout": int(self.msg_timeout * 1000),
            "tls_v1": False,
            "deflate": False,
            "deflate_level": deflate_level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": False,
            "sample_rate": self.sample_rate,
            "auth_required": False,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": int(self.output_buffer_timeout * 1000),
        }
        self._append(encode_response(json.dumps(resp, separators=(",", ":")).encode()))

    def _auth(self, params: list[bytes], body: bytes | None) -> None:
        raise fatal("E_AUTH_DISABLED", "AUTH disabled")

    def _sub(self, params: list[bytes], body: bytes | None) -> None:
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

    def _rdy(self, params: list[bytes], body: bytes | None) -> None:
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

    def _fin(self, params: list[bytes], body: bytes | None) -> None:
        # the hottest consumer command: validate and finish inline, errors take the slow path
        ch = self.channel
        if len(params) == 2 and ch is not None:
            msg_id = params[1]
            msg = ch.in_flight.get(msg_id)
            if msg is not None and msg.client is self:
                del ch.in_flight[msg_id]
                msg.client = None
                self.finish_count += 1
                self.in_flight_count -= 1
                if not self.in_flight_count:
                    self._inflight_q.clear()  # every entry is stale now
                if not ch._pump_scheduled:
                    ch.schedule_pump()
                return
        msg_id = self._msg_id("FIN", params, 2)
        assert ch is not None
        err = ch.finish(self, msg_id)
        if err is not None:
            raise ProtocolError("E_FIN_FAILED", f"FIN {msg_id.decode('latin-1')} failed {err}", fatal=False)
        self.finish_count += 1
        self.in_flight_count -= 1
        ch.schedule_pump()

    def _req(self, params: list[bytes], body: bytes | None) -> None:
        msg_id = self._msg_id("REQ", params, 3)
        ms = parse_base10(params[2])
        if ms is None:
            raise fatal("E_INVALID", f"REQ could not parse timeout {params[2].decode('utf-8', 'replace')}")
        delay = ms / 1000
        max_req = self.nsqd.options.max_req_timeout
        if delay > max_req:
            log.info(
                "PROTOCOL(V2): [%s] REQ timeout %dms out of range 0-%dms. Setting to max",
                self.remote_address, ms, int(max_req * 1000),
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

    def _touch(self, params: list[bytes], body: bytes | None) -> None:
        msg_id = self._msg_id("TOUCH", params, 2)
        ch = self.channel
        assert ch is not None
        err = ch.touch(self, msg_id)
        if err is not None:
            raise ProtocolError(
                "E_TOUCH_FAILED", f"TOUCH {msg_id.decode('latin-1')} failed {err}", fatal=False
            )

    def _cls(self, params: list[bytes], body: bytes | None) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise fatal("E_INVALID", "cannot CLS in current state")
        self.ready_count = 0
        self.state = STATE_CLOSING
        self._append(CLOSE_WAIT_FRAME)

    def _nop(self, params: list[bytes], body: bytes | None) -> None:
        return None

    def _publish(self, code: str, cmd: str, topic_name: str, bodies: list[bytes], defer: float) -> None:
        nsqd = self.nsqd
        try:
            if nsqd.exiting:
                raise TopicExitingError()
            must_sync = nsqd.get_topic(topic_name).put_bodies(bodies, defer)
        except (TopicExitingError, DiskQueueError, OSError) as e:
            raise fatal(code, f"{cmd} failed {e}") from None
        pc = self.pub_counts
        pc[topic_name] = pc.get(topic_name, 0) + len(bodies)
        self._append(OK_FRAME)
        if must_sync:
            self._hold_for_sync(code, cmd)

    def _pub(self, params: list[bytes], body: bytes | None) -> None:
        assert body is not None
        self._publish("E_PUB_FAILED", "PUB", params[1].decode("utf-8", "replace"), [body], 0.0)

    def _dpub(self, params: list[bytes], body: bytes | None) -> None:
        assert body is not None
        ms = parse_base10(params[2]) or 0
        self._publish("E_DPUB_FAILED", "DPUB", params[1].decode("utf-8", "replace"), [body], ms / 1000)

    def _mpub(self, params: list[bytes], body: bytes | None) -> None:
        assert body is not None
        opts = self.nsqd.options
        bodies = decode_mpub(body, opts.max_msg_size, opts.max_body_size)
        self._publish("E_MPUB_FAILED", "MPUB", params[1].decode("utf-8", "replace"), bodies, 0.0)

