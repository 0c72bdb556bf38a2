"""The per-connection handler of TCP protocol V2 (an ``asyncio.Protocol``).

A thin adapter around :mod:`nsqpy.protocol`: bytes go into a :class:`CommandParser`, each
command runs against the daemon's topics/channels, and replies and messages are collected
in one output buffer that is written once per batch (honouring the client's
output_buffer_size/timeout for message frames, as nsqd does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import struct
import time
from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from .. import NSQ_VERSION
from ..goflags import go_quote
from ..protocol.commands import CommandParser, LineTooLong, decode_mpub
from ..protocol.errors import ProtocolError
from ..protocol.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_MESSAGE,
    HEARTBEAT_FRAME,
    MAGIC_V2,
    MESSAGE_HEADER_SIZE,
    OK_FRAME,
    encode_error,
    encode_response,
)
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .diskqueue import DiskQueueError
from .topic import TopicExitingError

if TYPE_CHECKING:
    from .channel import Channel
    from .message import Message
    from .nsqd import NSQD

log = logging.getLogger("nsqd")

STATE_INIT = 0
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

DEFAULT_BUFFER_SIZE = 16 * 1024

_MSG_HEAD = struct.Struct(">IiqH").pack
_INFINITE = float("inf")


def parse_base10(b: bytes) -> int | None:
    """NSQ's ByteToBase10: ASCII digits only (the empty string is 0), else None."""
    if b and not b.isdigit():
        return None
    return int(b) if b else 0


def _fatal(code: str, desc: str) -> ProtocolError:
    return ProtocolError(code, desc, fatal=True)


class ClientV2(asyncio.Protocol):
    """One TCP client of nsqd: a producer, a consumer, or both."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        opts = nsqd.options
        self.id = nsqd.next_client_id()
        self.transport: asyncio.Transport | None = None
        self.remote_address = ""
        self.state = STATE_INIT
        self.closed = False
        self._magic = b""
        self._parser = CommandParser()
        self._out: list[bytes] = []
        self._out_len = 0
        self._flush_now = False
        self._flush_timer: asyncio.TimerHandle | None = None
        self._write_paused_at = 0.0
        #: responses held until a group-commit fsync covers this client's publishes
        self._held = False
        self._close_on_release = False
        #: (error code, command) of the publish that asked for the fsync being waited for
        self._held_for: tuple[str, str] = ("E_PUB_FAILED", "PUB")
        self._hb_timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._last_hb = 0.0
        # IDENTIFY-able settings
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.heartbeat_interval = opts.client_timeout / 2
        self.output_buffer_size = DEFAULT_BUFFER_SIZE
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.msg_timeout = opts.msg_timeout
        self.sample_rate = 0
        self.identified = False
        # subscription and flow control
        self.channel: Channel | None = None
        self.ready_count = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_ts = int(time.time())
        self._inflight_q: deque[tuple[float, Message]] = deque()
        self._inflight_heap: list[tuple[float, int, Message]] = []
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

    def __repr__(self) -> str:
        return f"<ClientV2 {self.id} {self.remote_address}>"

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host = peer[0]
            self.remote_address = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
            self.client_id = self.hostname = host
        else:
            self.remote_address = str(peer or "unix")
        now = self.nsqd.loop.time()
        self._last_read = self._last_hb = now
        self.nsqd.add_client(self)
        self._schedule_heartbeat()

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
                    raise _fatal("E_INVALID", "invalid command " + name.decode("utf-8", "replace"))
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

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        if self._hb_timer is not None:
            self._hb_timer.cancel()
            self._hb_timer = None
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._out.clear()
        ch = self.channel
        if ch is not None:
            ch.remove_client(self)
        self.nsqd.remove_client(self)
        log.info("PROTOCOL(V2): [%s] exiting ioloop", self.remote_address)

    def pause_writing(self) -> None:
        self._write_paused_at = self.nsqd.loop.time()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused_at = 0.0
        if self.transport is not None and not self.closed and not self._held:
            self.transport.resume_reading()
        if self.channel is not None:
            self.channel.schedule_pump()

    # --- output -------------------------------------------------------------------------------

    def _append(self, frame: bytes) -> None:
        self._out.append(frame)
        self._out_len += len(frame)
        self._flush_now = True

    def flush(self) -> None:
        """Write everything buffered now (unless held for an fsync)."""
        if self._held:
            return
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._out and self.transport is not None:
            out = self._out
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
        self._out_len = 0
        self._flush_now = False

    def _timed_flush(self) -> None:
        self._flush_timer = None
        self.flush()

    def close_after_flush(self) -> None:
        """Send what is buffered, then close (after a fatal error)."""
        if self._held:
            self._close_on_release = True
            return
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        """Close the connection (channel/topic deleted, daemon exiting)."""
        self.close_after_flush()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _hold_for_sync(self, code: str, cmd: str) -> None:
        """Hold this client's responses (and stop reading) until its writes are fsynced."""
        if self._held:
            return
        self._held = True
        self._held_for = (code, cmd)
        if self.transport is not None:
            self.transport.pause_reading()
        self.nsqd.wait_durable(self._sync_done)

    def _sync_done(self, err: BaseException | None) -> None:
        self._held = False
        if err is not None:
            # never acknowledge what is not on disk: the OKs are replaced by the publish's
            # error (fatal, as Go's E_PUB_FAILED), then the connection closes
            code, cmd = self._held_for
            text = f"{code} {cmd} failed {err}"
            log.error("[%s] - %s", self.remote_address, text)
            self._out.clear()
            self._out_len = 0
            self._append(encode_error(text.encode()))
            self.close_after_flush()
            return
        if self._close_on_release:
            self.close_after_flush()
            return
        self.flush()
        if self.transport is not None and not self.closed and not self._write_paused_at:
            self.transport.resume_reading()

    # --- heartbeats ---------------------------------------------------------------------------

    def _schedule_heartbeat(self) -> None:
        if self._hb_timer is not None:
            self._hb_timer.cancel()
            self._hb_timer = None
        interval = self.heartbeat_interval
        if interval > 0 and not self.closed:
            # tick at half the interval so the 2x read deadline is enforced closely
            self._hb_timer = self.nsqd.loop.call_later(interval / 2, self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        self._hb_timer = None
        if self.closed:
            return
        now = self.nsqd.loop.time()
        interval = self.heartbeat_interval
        if now - self._last_read >= 2 * interval:
            log.error("[%s] failed to read command - i/o timeout", self.remote_address)
            self.abort()
            return
        if self._write_paused_at and now - self._write_paused_at >= interval:
            log.error("[%s] write timeout: client is not reading", self.remote_address)
            self.abort()
            return
        if now - self._last_hb >= interval * 0.999:
            self._last_hb = now
            self._append(HEARTBEAT_FRAME)
            self.flush()
        self._schedule_heartbeat()

    # --- flow control (called by Channel) -------------------------------------------------------

    def can_receive(self) -> bool:
        return (
            self.in_flight_count < self.ready_count
            and self.state == STATE_SUBSCRIBED
            and not self._write_paused_at
            and not self.closed
        )

    def send_messages(self, channel: Channel, n: int) -> None:
        """Send up to ``n`` messages from the channel's queue, within RDY."""
        cap = self.ready_count - self.in_flight_count
        if n > cap:
            n = cap
        if n <= 0:
            return
        q = channel.queue
        popleft = q.popleft
        in_flight = channel.in_flight
        now = self.nsqd.loop.time()
        deadline = now + self.msg_timeout
        entry_append = self._inflight_q.append
        out = self._out
        append = out.append
        head = _MSG_HEAD
        hsize = MESSAGE_HEADER_SIZE
        mtype = FRAME_TYPE_MESSAGE
        sample = self.sample_rate
        sent = 0
        nbytes = 0
        while sent < n and q:
            msg = popleft()
            if sample and random.randrange(100) > sample:
                continue
            msg.attempts += 1
            msg.client = self
            msg.deadline = deadline
            msg.delivery_ts = now
            in_flight[msg.id] = msg
            entry_append((deadline, msg))
            body = msg.body
            append(head(hsize + len(body), mtype, msg.timestamp, msg.attempts))
            append(msg.id)
            append(body)
            nbytes += 34 + len(body)
            sent += 1
        self.in_flight_count += sent
        self.message_count += sent
        self._out_len += nbytes
        if (
            self.output_buffer_timeout <= 0
            or self._out_len >= self.output_buffer_size
            or self.in_flight_count >= self.ready_count
        ):
            self.flush()
        elif self._flush_timer is None and self._out:
            self._flush_timer = self.nsqd.loop.call_later(self.output_buffer_timeout, self._timed_flush)

    def track_in_flight(self, msg: Message, deadline: float) -> None:
        """(Re)set a message's in-flight deadline (TOUCH)."""
        msg.deadline = deadline
        q = self._inflight_q
        if not q or q[-1][0] <= deadline:
            q.append((deadline, msg))
        else:
            heappush(self._inflight_heap, (deadline, id(msg), msg))

    def expired_in_flight(self, now: float) -> list[Message]:
        """In-flight messages of this client whose deadline has passed.

        Entries for finished/requeued/touched messages are deleted lazily: dropped here from
        the front as they go stale, and the deque is compacted when stale entries dominate,
        so its size stays proportional to what is really in flight.
        """
        out: list[Message] = []
        ch = self.channel
        if ch is None:
            return out
        in_flight = ch.in_flight
        q = self._inflight_q
        while q:
            deadline, msg = q[0]
            live = msg.client is self and msg.deadline == deadline
            if live and deadline > now:
                break
            q.popleft()
            if live and in_flight.get(msg.id) is msg:
                out.append(msg)
        if len(q) > 2 * self.in_flight_count + 1024:
            self._inflight_q = deque(e for e in q if e[1].client is self and e[1].deadline == e[0])
        h = self._inflight_heap
        while h and h[0][0] <= now:
            deadline, _, msg = heappop(h)
            if msg.client is self and msg.deadline == deadline and in_flight.get(msg.id) is msg:
                out.append(msg)
        return out

    def owned_in_flight(self) -> list[Message]:
        """Every message currently in flight to this client."""
        seen: dict[int, Message] = {}
        for _, msg in self._inflight_q:
            if msg.client is self:
                seen[id(msg)] = msg
        for _, _, msg in self._inflight_heap:
            if msg.client is self:
                seen[id(msg)] = msg
        self._inflight_q.clear()
        self._inflight_heap.clear()
        return list(seen.values())

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1

    def emptied(self) -> None:
        self.in_flight_count = 0
        self._inflight_q.clear()
        self._inflight_heap.clear()

    # --- validation before a body is buffered ----------------------------------------------------

    def _validate(self, name: bytes, params: list[bytes], size: int | None) -> None:
        opts = self.nsqd.options
        if name == b"PUB" or name == b"DPUB":
            cmd = name.decode()
            if size is None:
                if len(params) < (2 if name == b"PUB" else 3):
                    raise _fatal("E_INVALID", f"{cmd} insufficient number of parameters")
                self._check_topic(cmd, params[1])
                if name == b"DPUB":
                    ms = parse_base10(params[2])
                    if ms is None:
                        raw = params[2].decode("utf-8", "replace")
                        raise _fatal("E_INVALID", f"DPUB could not parse timeout {raw}")
                    max_ms = int(opts.max_req_timeout * 1000)
                    if ms > max_ms:
                        raise _fatal("E_INVALID", f"DPUB timeout {ms} out of range 0-{max_ms}")
                return
            if size <= 0:
                raise _fatal("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
            if size > opts.max_msg_size:
                raise _fatal("E_BAD_MESSAGE", f"{cmd} message too big {size} > {opts.max_msg_size}")
        elif name == b"MPUB":
            if size is None:
                if len(params) < 2:
                    raise _fatal("E_INVALID", "MPUB insufficient number of parameters")
                self._check_topic("MPUB", params[1], prefix="E_BAD_TOPIC ")
                return
            if size <= 0:
                raise _fatal("E_BAD_BODY", f"MPUB invalid body size {size}")
            if size > opts.max_body_size:
                raise _fatal("E_BAD_BODY", f"MPUB body too big {size} > {opts.max_body_size}")
        elif name == b"IDENTIFY" or name == b"AUTH":
            cmd = name.decode()
            if size is None:
                if self.state != STATE_INIT:
                    raise _fatal("E_INVALID", f"cannot {cmd} in current state")
                if name == b"AUTH" and len(params) != 1:
                    raise _fatal("E_INVALID", "AUTH invalid number of parameters")
                return
            if size > opts.max_body_size:
                raise _fatal("E_BAD_BODY", f"{cmd} body too big {size} > {opts.max_body_size}")
            if size <= 0:
                raise _fatal("E_BAD_BODY", f"{cmd} invalid body size {size}")

    def _check_topic(self, cmd: str, raw: bytes, prefix: str = "") -> str:
        name = raw.decode("utf-8", "replace")
        if name not in self.nsqd.topics and not is_valid_topic_name(name):
            raise _fatal("E_BAD_TOPIC", f"{prefix}{cmd} topic name {go_quote(name)} is not valid")
        return name

    # --- commands -----------------------------------------------------------------------------

    def _identify(self, params: list[bytes], body: bytes | None) -> None:
        try:
            data = json.loads(body or b"")
        except ValueError:
            raise _fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise _fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        err = self._apply_identify(data)
        if err:
            raise _fatal("E_BAD_BODY", "IDENTIFY " + err)
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

    def _apply_identify(self, data: dict[str, Any]) -> str | None:
        """Validate and apply IDENTIFY fields; returns Go's error text on failure."""
        ints = {}
        for key in (
            "heartbeat_interval",
            "output_buffer_size",
            "output_buffer_timeout",
            "deflate_level",
            "sample_rate",
            "msg_timeout",
        ):
            v = data.get(key, 0)
            if v is None:
                v = 0
            if isinstance(v, bool) or not isinstance(v, int):
                return f"failed to decode JSON body ({key})"
            ints[key] = v
        for key in ("client_id", "hostname", "user_agent"):
            v = data.get(key, "")
            if v is not None and not isinstance(v, str):
                return f"failed to decode JSON body ({key})"
        opts = self.nsqd.options
        hb = ints["heartbeat_interval"]
        if hb == -1:
            heartbeat = 0.0
        elif hb == 0:
            heartbeat = self.heartbeat_interval
        elif 1000 <= hb <= opts.max_heartbeat_interval * 1000:
            heartbeat = hb / 1000
        else:
            return f"heartbeat interval ({hb}) is invalid"
        obt = ints["output_buffer_timeout"]
        if obt == -1:
            buf_timeout = 0.0
        elif obt == 0:
            buf_timeout = self.output_buffer_timeout
        elif opts.min_output_buffer_timeout * 1000 <= obt <= opts.max_output_buffer_timeout * 1000:
            buf_timeout = obt / 1000
        else:
            return f"output buffer timeout ({obt}) is invalid"
        obs = ints["output_buffer_size"]
        if obs == -1:
            buf_size = 1
            buf_timeout = 0.0
        elif obs == 0:
            buf_size = self.output_buffer_size
        elif 64 <= obs <= opts.max_output_buffer_size:
            buf_size = obs
        else:
            return f"output buffer size ({obs}) is invalid"
        sr = ints["sample_rate"]
        if sr < 0 or sr > 99:
            return f"sample rate ({sr}) is invalid"
        mt = ints["msg_timeout"]
        if mt == 0:
            msg_timeout = self.msg_timeout
        elif 1000 <= mt <= opts.max_msg_timeout * 1000:
            msg_timeout = mt / 1000
        else:
            return f"msg timeout ({mt}) is invalid"
        self.client_id = data.get("client_id") or ""
        self.hostname = data.get("hostname") or ""
        self.user_agent = data.get("user_agent") or ""
        self.heartbeat_interval = heartbeat
        self.output_buffer_timeout = buf_timeout
        self.output_buffer_size = buf_size
        self.sample_rate = sr
        self.msg_timeout = msg_timeout
        self._schedule_heartbeat()
        return None

    def _auth(self, params: list[bytes], body: bytes | None) -> None:
        raise _fatal("E_AUTH_DISABLED", "AUTH disabled")

    def _sub(self, params: list[bytes], body: bytes | None) -> None:
        if self.state != STATE_INIT:
            raise _fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise _fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise _fatal("E_INVALID", "SUB insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "replace")
        if not is_valid_topic_name(topic_name):
            raise _fatal("E_BAD_TOPIC", f"SUB topic name {go_quote(topic_name)} is not valid")
        channel_name = params[2].decode("utf-8", "replace")
        if not is_valid_channel_name(channel_name):
            raise _fatal("E_BAD_CHANNEL", f"SUB channel name {go_quote(channel_name)} is not valid")
        nsqd = self.nsqd
        if nsqd.exiting:
            raise _fatal("E_INVALID", "cannot SUB in current state")
        channel = nsqd.get_topic(topic_name).get_channel(channel_name)
        if not channel.add_client(self):
            raise _fatal(
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
            raise _fatal("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = parse_base10(params[1])
            if parsed is None:
                raise _fatal("E_INVALID", f"RDY could not parse count {params[1].decode('utf-8', 'replace')}")
            count = parsed
        max_rdy = self.nsqd.options.max_rdy_count
        if count > max_rdy:
            raise _fatal("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.ready_count = count
        if self.channel is not None:
            self.channel.schedule_pump()

    def _msg_id(self, cmd: str, params: list[bytes], nparams: int) -> bytes:
        state = self.state
        if state != STATE_SUBSCRIBED and state != STATE_CLOSING:
            raise _fatal("E_INVALID", f"cannot {cmd} in current state")
        if len(params) < nparams:
            raise _fatal("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != 16:
            raise _fatal("E_INVALID", "Invalid Message ID")
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
            raise _fatal("E_INVALID", f"REQ could not parse timeout {params[2].decode('utf-8', 'replace')}")
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
            raise _fatal("E_INVALID", "cannot CLS in current state")
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
            raise _fatal(code, f"{cmd} failed {e}") from None
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

    # --- stats --------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """``ClientV2Stats`` with NSQ's JSON field names."""
        out: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote_address,
            "state": self.state,
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": False,
            "snappy": False,
            "user_agent": self.user_agent,
            "tls": False,
            "tls_cipher_suite": "",
            "tls_version": "",
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }
        if self.pub_counts:
            out["pub_counts"] = [{"topic": t, "count": c} for t, c in self.pub_counts.items()]
        return out
