"""The state of one TCP client connection of nsqd (Go's ``client_v2.go``).

:class:`ClientV2` is the asyncio protocol side of a connection: its IDENTIFY-able
settings, the output buffer written once per batch (honouring the client's
output_buffer_size/timeout for message frames, as nsqd does; large bodies are handed to the
transport as they are, never copied into it), heartbeats, RDY flow control and in-flight
tracking, the fsync hold of durable publishes, and its stats. The commands that act on it
are in :mod:`~nsqpy.nsqd.protocol_v2` (:class:`ProtocolV2` subclasses it, so the hot paths
stay plain attribute accesses, and receives as an ``asyncio.BufferedProtocol``: straight
into its command parser's buffers).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from .._speedups import compiled
from ..protocol.errors import ProtocolError
from ..protocol.frames import (
    FRAME_TYPE_MESSAGE,
    HEARTBEAT_FRAME,
    MESSAGE_FRAME_PREFIX,
    MESSAGE_HEADER_SIZE,
    encode_error,
)

#: a message frame's bytes beyond its body: the size field and the header
_FRAME_OVERHEAD = 4 + MESSAGE_HEADER_SIZE

if TYPE_CHECKING:
    from ..transport import Stack
    from .auth import AuthState
    from .channel import Channel
    from .message import Message
    from .nsqd import NSQD

if compiled:
    from .._speedups._hot import send_batch as _c_send_batch

log = logging.getLogger("nsqd")

STATE_INIT = 0
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

DEFAULT_BUFFER_SIZE = 16 * 1024
#: the compiled send_batch leaves a body this long out of its batch's bytes (uncopied, after
#: its frame header), as send_batch_py leaves every body
LARGE_BODY = 16 * 1024
#: output whose pieces average this many bytes goes to the transport as it is (uvloop writes
#: it with writev) rather than joined into one copy
WRITEV_AVERAGE = 4096

_MSG_HEAD = MESSAGE_FRAME_PREFIX.pack
_INFINITE = float("inf")


def send_batch_py(
    q: deque[Message],
    n: int,
    owner: ClientV2,
    in_flight: dict[bytes, Message],
    entries: deque[tuple[float, Message]],
    deadline: float,
    now: float,
    out: list[bytes],
    sample: int = 0,
    dropped: list[Message] | None = None,
    expire_before: int = 0,
    max_attempts: int = 0,
    rejected: list[Message] | None = None,
) -> tuple[int, int]:
    """Put up to ``n`` messages of the channel queue ``q`` in flight to ``owner`` (attempts,
    client, deadline, the in-flight index, the deadline ``entries``) and their frames on
    ``out``; with ``sample`` (1-99) each is skipped unless ``randrange(100) <= sample`` (and
    appended to ``dropped``, if given). A message published before ``expire_before`` (ns) or
    with ``max_attempts`` attempts made is not sent but appended to ``rejected`` (a queue's
    policy, 0 for none). Returns (messages sent, frame bytes)."""
    popleft = q.popleft
    entry_append = entries.append
    append = out.append
    head = _MSG_HEAD
    hsize = MESSAGE_HEADER_SIZE
    mtype = FRAME_TYPE_MESSAGE
    sent = 0
    nbytes = 0
    if sample:
        from random import randrange
    while sent < n and q:
        msg = popleft()
        if sample and randrange(100) > sample:
            if dropped is not None:
                dropped.append(msg)
            continue
        if (expire_before and msg.timestamp < expire_before) or (
            max_attempts and msg.attempts >= max_attempts
        ):
            assert rejected is not None
            rejected.append(msg)
            continue
        if msg.deadline < 0.0:  # queued by several channels (SHARED): this one's own copy
            msg = msg.copy()
        msg.attempts += 1
        msg.client = owner
        msg.deadline = deadline
        msg.delivery_ts = now
        in_flight[msg.id] = msg
        entry_append((deadline, msg))
        body = msg.body
        append(head(hsize + len(body), mtype, msg.timestamp, msg.attempts))
        append(msg.id)
        append(body)
        nbytes += _FRAME_OVERHEAD + len(body)
        sent += 1
    return sent, nbytes


def parse_base10(b: bytes) -> int | None:
    """NSQ's ByteToBase10: ASCII digits only (the empty string is 0), else None."""
    if b and not b.isdigit():
        return None
    return int(b) if b else 0


def fatal(code: str, desc: str) -> ProtocolError:
    """A fatal protocol error: sent as an error frame, then the connection closes."""
    return ProtocolError(code, desc, fatal=True)


#: heartbeat ticks due within this many seconds of each other share one timer
HEARTBEAT_SLOT = 0.025


class HeartbeatWheel:
    """The daemon's heartbeat ticks, grouped by due time into slots of :data:`HEARTBEAT_SLOT`
    with one event-loop timer per occupied slot, instead of a timer per connection (~0.5 KiB
    each with uvloop: 5 MiB for 10,000 idle consumers). A tick runs up to a slot late."""

    __slots__ = ("loop", "slots")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: slot number (due time // HEARTBEAT_SLOT, rounded up) -> its clients by id
        self.slots: dict[int, dict[int, ClientV2]] = {}

    def add(self, client: ClientV2, delay: float) -> int:
        """Tick ``client`` (its ``_heartbeat_tick``) in ``delay`` seconds; returns the slot."""
        slot = math.ceil((self.loop.time() + delay) / HEARTBEAT_SLOT)
        clients = self.slots.get(slot)
        if clients is None:
            clients = self.slots[slot] = {}
            self.loop.call_at(slot * HEARTBEAT_SLOT, self._fire, slot)
        clients[client.id] = client
        return slot

    def discard(self, client: ClientV2, slot: int) -> None:
        clients = self.slots.get(slot)
        if clients is not None:
            clients.pop(client.id, None)

    def _fire(self, slot: int) -> None:
        for client in self.slots.pop(slot, {}).values():
            client._heartbeat_tick()


class ClientV2(asyncio.BufferedProtocol):
    """One TCP client of nsqd: a producer, a consumer, or both."""

    # Slots, not an instance dict: over 30 attributes un-share CPython's key-sharing dict,
    # ~1.6 KiB of every connection (10,000 idle consumers: 16 MiB); slots take ~0.4 KiB.
    # (ProtocolV2 adds a few attributes of its own in a small dict.)
    __slots__ = (
        "_close_on_release",
        "_flush_now",
        "_flush_timer",
        "_hb_slot",
        "_held",
        "_held_for",
        "_last_hb",
        "_last_read",
        "_out",
        "_out_len",
        "_stack",
        "_suspended",
        "_sync_pending",
        "_write_paused_at",
        "auth_secret",
        "auth_state",
        "channel",
        "client_id",
        "closed",
        "connect_ts",
        "deflate",
        "finish_count",
        "heartbeat_interval",
        "hostname",
        "id",
        "identified",
        "in_flight_count",
        "message_count",
        "msg_timeout",
        "nsqd",
        "output_buffer_size",
        "output_buffer_timeout",
        "pub_counts",
        "ready_count",
        "remote_address",
        "requeue_count",
        "sample_rate",
        "snappy",
        "state",
        "tls",
        "transport",
        "user_agent",
    )

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        opts = nsqd.options
        self.id = nsqd.next_client_id()
        self.transport: asyncio.Transport | None = None
        self.remote_address = ""
        self.state = STATE_INIT
        self.closed = False
        self._out: list[bytes] = []
        self._out_len = 0
        self._flush_now = False
        self._flush_timer: asyncio.TimerHandle | None = None
        self._write_paused_at = 0.0
        #: responses are held until a group-commit fsync covers this client's publishes, and
        #: until a topic it published to has created its channels: how many holds are on
        self._held = 0
        #: one of them is for the next sync round
        self._sync_pending = False
        self._close_on_release = False
        #: (error code, command) of the publish that asked for the fsync being waited for
        self._held_for: tuple[str, str] = ("E_PUB_FAILED", "PUB")
        #: the HeartbeatWheel slot this client's next heartbeat tick is in (0: none)
        self._hb_slot = 0
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
        # the transport upgrades (None: plain TCP, the hot path) and AUTH
        self._stack: Stack | None = None
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.auth_secret = ""
        self.auth_state: AuthState | None = None
        #: commands wait while an AUTH request (or a TLS handshake) is under way
        self._suspended = False

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

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        self._cancel_heartbeat()
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
        self._resume_reading()
        if self.channel is not None:
            self.channel.schedule_pump()

    def _resume_reading(self) -> None:
        """Read again unless something else still holds the connection."""
        if (
            self.transport is not None
            and not self.closed
            and not self._held
            and not self._suspended
            and not self._write_paused_at
        ):
            self.transport.resume_reading()

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
            if len(out) == 1:
                data = out[0]
            elif self._stack is None and self._out_len >= WRITEV_AVERAGE * len(out):
                # large bodies: written as they are, not copied into one buffer first
                self.transport.writelines(out)
                out.clear()
                self._out_len = 0
                self._flush_now = False
                return
            else:
                data = b"".join(out)
            if self._stack is not None:
                data = self._stack.send(data)
            self.transport.write(data)
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
        if self._sync_pending:
            return
        self._sync_pending = True
        self._held_for = (code, cmd)
        self._hold()
        syncer = self.nsqd.syncer
        assert syncer is not None
        syncer.wait(self._sync_done)

    def _hold_for_start(self, topic: Any) -> None:
        """Hold this client's responses until ``topic`` has created the channels nsqlookupd
        knows (Go answers a publish to a new topic only then)."""
        self._hold()
        topic.when_started(self._release)

    def _hold(self) -> None:
        self._held += 1
        if self.transport is not None:
            self.transport.pause_reading()

    def _release(self) -> None:
        """One hold is over: the responses go once none is left."""
        if self._held:
            self._held -= 1
        if self._held or self.closed:
            return
        if self._close_on_release:
            self.close_after_flush()
            return
        self.flush()
        self._resume_reading()

    def _sync_done(self, err: BaseException | None) -> None:
        self._sync_pending = False
        if err is not None:
            self._held = 0
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
        self._release()

    # --- heartbeats ---------------------------------------------------------------------------

    def _cancel_heartbeat(self) -> None:
        if self._hb_slot:
            wheel = self.nsqd.heartbeats
            if wheel is not None:
                wheel.discard(self, self._hb_slot)
            self._hb_slot = 0

    def _schedule_heartbeat(self) -> None:
        self._cancel_heartbeat()
        interval = self.heartbeat_interval
        if interval > 0 and not self.closed:
            wheel = self.nsqd.heartbeats
            if wheel is None:
                wheel = self.nsqd.heartbeats = HeartbeatWheel(self.nsqd.loop)
            # tick at half the interval so the 2x read deadline is enforced closely
            self._hb_slot = wheel.add(self, interval / 2)

    def _heartbeat_tick(self) -> None:
        self._hb_slot = 0
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
        now = self.nsqd.loop.time()
        deadline = now + self.msg_timeout
        entries = channel.timers[self.id].queue
        sent_bytes = None
        # with a sample rate, the left-out messages are finished for the channel: a ledger
        # must know them (the compiled batch drops them silently)
        dropped: list[Message] | None = [] if self.sample_rate and channel.ledger is not None else None
        # a queue policy's filter: (published before, attempts made, where they go) or None
        filt = channel.filter
        if compiled and dropped is None:
            if self.sample_rate or filt is not None:
                from random import randrange

                sent_bytes = _c_send_batch(
                    channel.queue,
                    n,
                    self,
                    channel.in_flight,
                    entries,
                    deadline,
                    now,
                    self._out,
                    self.sample_rate,
                    randrange,
                    *(filt if filt is not None else (0, 0, [])),
                )
            else:
                sent_bytes = _c_send_batch(
                    channel.queue, n, self, channel.in_flight, entries, deadline, now, self._out
                )
        if sent_bytes is None:
            sent_bytes = send_batch_py(
                channel.queue,
                n,
                self,
                channel.in_flight,
                entries,
                deadline,
                now,
                self._out,
                self.sample_rate,
                dropped,
                *(filt if filt is not None else ()),
            )
        if dropped:
            channel.dropped(dropped)
        sent, nbytes = sent_bytes
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

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1

    def emptied(self) -> None:
        """The channel dropped every message (empty): none is in flight to us any more."""
        self.in_flight_count = 0

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
        for key in ("feature_negotiation", "tls_v1", "snappy", "deflate"):
            v = data.get(key)
            if v is not None and not isinstance(v, bool):
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

    def has_authorizations(self) -> bool:
        """Go's HasAuthorizations: AUTH succeeded with at least one authorization."""
        st = self.auth_state
        return st is not None and bool(st.authorizations)

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
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
            "authed": self.has_authorizations(),
            "auth_identity": "",
            "auth_identity_url": "",
            "tls": self.tls,
            "tls_cipher_suite": "",
            "tls_version": "",
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }
        if self.auth_state is not None:
            out["auth_identity"] = self.auth_state.identity
            out["auth_identity_url"] = self.auth_state.identity_url
        tls = self._stack.tls if self.tls and self._stack is not None else None
        if tls is not None:
            out["tls_cipher_suite"] = tls.cipher()
            out["tls_version"] = tls.version()
            proto = tls.negotiated_protocol()
            out["tls_negotiated_protocol"] = proto
            out["tls_negotiated_protocol_is_mutual"] = True  # Go: always true (deprecated)
        if self.pub_counts:
            out["pub_counts"] = [{"topic": t, "count": c} for t, c in self.pub_counts.items()]
        return out
