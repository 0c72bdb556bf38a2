"""Wire helpers and reporting shared by the bench tools.

Standard library only, and nothing from nsqpy: the tools speak raw NSQ TCP protocol V2 so
they can load any nsqd (ours or the Go one) and never share a bug with the daemon.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import struct
import sys
import time
from datetime import datetime, timezone

MAGIC_V2 = b"  V2"
FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
HEARTBEAT = b"_heartbeat_"
NON_FATAL_ERRORS = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")

# [uint32 size][int32 frame type]; a message frame's data is
# [int64 timestamp][uint16 attempts][16-byte hex id][body], so the id sits at
# frame offset 18..34 and the body starts at 34.
FRAME_HEADER = struct.Struct(">Ii")
MSG_ID_START = 18
MSG_ID_END = 34
MSG_BODY_START = 34
MSG_OVERHEAD = 30  # frame size minus body length for a message frame

_I32 = struct.Struct(">i")

VERSION = "nsqpy-bench/0.1"


class ProtocolError(Exception):
    """The daemon answered with an error frame or broke the framing."""


def mp_context() -> multiprocessing.context.BaseContext:
    """fork where available (cheap, no re-import), spawn elsewhere."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def go_flags(argv: list[str] | None) -> list[str]:
    """Accept Go flag spelling too: "-runfor=5s" / "-runfor 5s" become "--runfor…"."""
    if argv is None:
        argv = sys.argv[1:]
    return ["-" + a if len(a) > 2 and a[0] == "-" and a[1].isalpha() else a for a in argv]


def parse_duration(text: str) -> float:
    """Go-style duration ("10s", "1m30s", "250ms", "1.5s") or plain seconds, in seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, i, n = 0.0, 0, len(text)
    if n == 0:
        raise ValueError("empty duration")
    while i < n:
        j = i
        while j < n and (text[j].isdigit() or text[j] == "."):
            j += 1
        if j == i:
            raise ValueError(f"invalid duration {text!r}")
        k = j
        while k < n and not (text[k].isdigit() or text[k] == "."):
            k += 1
        unit = text[j:k]
        if unit not in units:
            raise ValueError(f"invalid unit {unit!r} in duration {text!r}")
        total += float(text[i:j]) * units[unit]
        i = k
    return total


def go_duration(ns: int) -> str:
    """Format nanoseconds like Go's time.Duration.String() ("10.001234567s", "1m0.5s")."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)

    def frac(v: int, prec: int) -> tuple[int, str]:
        whole, rest = divmod(v, 10**prec)
        digits = f"{rest:0{prec}d}".rstrip("0")
        return whole, ("." + digits if digits else "")

    if u < 1_000_000_000:
        if u < 1_000:
            return f"{sign}{u}ns"
        if u < 1_000_000:
            whole, f = frac(u, 3)
            return f"{sign}{whole}{f}µs"
        whole, f = frac(u, 6)
        return f"{sign}{whole}{f}ms"
    secs, f = frac(u, 9)
    out = f"{secs % 60}{f}s"
    mins = secs // 60
    if mins:
        hours, mins = divmod(mins, 60)
        out = f"{mins}m{out}"
        if hours:
            out = f"{hours}h{out}"
    return sign + out


def result_line(duration_ns: int, msgs: int, size: int) -> str:
    """The figures part of Go's bench output: 'duration: … - …mb/s - …ops/s - …us/op'."""
    secs = duration_ns / 1e9 if duration_ns > 0 else float("nan")
    mbs = msgs * size / secs / 1024 / 1024
    ops = msgs / secs
    # Go divides whole microseconds by the count (and prints +Inf for zero messages).
    us_op = (duration_ns // 1000) / msgs if msgs else float("inf")
    return (
        f"duration: {go_duration(duration_ns)} - {mbs:.3f}mb/s - {ops:.3f}ops/s - "
        f"{_go_float(us_op)}us/op"
    )


def _go_float(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return f"{v:.3f}"


def log(tool: str, text: str) -> None:
    """Write like Go's log package with SetPrefix("[tool] "): prefix, local date/time, text."""
    stamp = datetime.now().strftime("%Y/%m/%d %H:%M:%S")
    sys.stderr.write(f"[{tool}] {stamp} {text}\n")
    sys.stderr.flush()


def report(
    tool: str, duration_ns: int, msgs: int, size: int, as_json: bool, **extra: object
) -> dict:
    """Print the Go-format line (stderr) and, when asked, one JSON line (stdout)."""
    log(tool, result_line(duration_ns, msgs, size))
    secs = duration_ns / 1e9 if duration_ns > 0 else 0.0
    data: dict = {
        "tool": tool,
        "duration_s": secs,
        "msgs": msgs,
        "bytes": msgs * size,
        "size": size,
        "ops_per_s": msgs / secs if secs else 0.0,
        "mb_per_s": msgs * size / secs / 1024 / 1024 if secs else 0.0,
        "us_per_op": (duration_ns // 1000) / msgs if msgs else None,
    }
    data.update(extra)
    if as_json:
        sys.stdout.write(json.dumps(data) + "\n")
        sys.stdout.flush()
    return data


def report_failure(tool: str, errors: list[str], as_json: bool) -> None:
    """Log errors that prevented a run; with --json, still emit a result line carrying them."""
    for e in errors:
        log(tool, f"ERROR: {e}")
    if as_json:
        result = {"tool": tool, "msgs": 0, "duration_s": 0.0, "errors": errors}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


def wait_deadline(deadline: str, tool: str) -> None:
    """Go's --deadline: sleep until 'YYYY-MM-DD HH:MM:SS' (UTC, as time.Parse gives)."""
    if not deadline:
        return
    t = datetime.strptime(deadline, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    d = t.timestamp() - time.time()
    log(tool, f"sleeping until {t} ({go_duration(int(d * 1e9))})")
    if d > 0:
        time.sleep(d)


# --------------------------------------------------------------------------- wire


def connect(addr: str, timeout: float = 5.0) -> socket.socket:
    host, port = parse_addr(addr)
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC_V2)
    return sock


def cmd_with_body(line: bytes, body: bytes) -> bytes:
    return line + b"\n" + _I32.pack(len(body)) + body


def identify_cmd(fields: dict) -> bytes:
    return cmd_with_body(b"IDENTIFY", json.dumps(fields).encode())


def mpub_cmd(topic: str, bodies: list[bytes]) -> bytes:
    parts = [_I32.pack(len(bodies))]
    for b in bodies:
        parts.append(_I32.pack(len(b)))
        parts.append(b)
    return cmd_with_body(b"MPUB " + topic.encode(), b"".join(parts))


def pub_cmd(topic: str, body: bytes) -> bytes:
    return cmd_with_body(b"PUB " + topic.encode(), body)


def client_fields(tool: str) -> dict:
    host = socket.gethostname()
    return {"client_id": f"{tool}-{os.getpid()}", "hostname": host,
            "user_agent": f"{tool}/{VERSION}"}


class FrameReader:
    """Blocking reader of whole frames for the handshake and low-rate paths."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

    def read_frame(self) -> tuple[int, bytes]:
        """Next frame as (type, data); heartbeats are answered with NOP and skipped."""
        while True:
            ft, data = self._next()
            if ft == FRAME_RESPONSE and data == HEARTBEAT:
                self.sock.sendall(b"NOP\n")
                continue
            return ft, data

    def _next(self) -> tuple[int, bytes]:
        buf = self.buf
        while True:
            if len(buf) >= 8:
                size, ft = FRAME_HEADER.unpack_from(buf, 0)
                if size < 4:
                    raise ProtocolError(f"bad frame size {size}")
                if len(buf) >= 4 + size:
                    data = bytes(buf[8 : 4 + size])
                    del buf[: 4 + size]
                    return ft, data
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ProtocolError("connection closed by nsqd")
            buf += chunk

    def expect_ok(self, what: str) -> bytes:
        ft, data = self.read_frame()
        if ft == FRAME_ERROR:
            raise ProtocolError(f"{what}: {data.decode(errors='replace')}")
        if ft != FRAME_RESPONSE:
            raise ProtocolError(f"{what}: unexpected frame type {ft}")
        return data


def handshake_identify(sock: socket.socket, reader: FrameReader, fields: dict) -> dict | None:
    """Send IDENTIFY and read its reply; returns the negotiated JSON when asked for."""
    sock.sendall(identify_cmd(fields))
    data = reader.expect_ok("IDENTIFY")
    if fields.get("feature_negotiation"):
        if data == b"OK":
            return {}
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ProtocolError(f"IDENTIFY: bad JSON reply {data[:200]!r}") from exc
    if data != b"OK":
        raise ProtocolError(f"IDENTIFY: unexpected reply {data[:200]!r}")
    return None
