"""Wire helpers and reporting shared by the bench tools.

Standard library only, and nothing from nsqpy on the plain path: the tools speak raw NSQ
TCP protocol V2 so they can load any nsqd (ours or the Go one) and never share a bug with
the daemon. The connection upgrades (--tls, --snappy, --deflate) use the stdlib's ssl for
TLS and nsqpy.transport's SnappyLayer/DeflateLayer (cramjam, zlib) for compression, imported
only when asked for.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import multiprocessing
import os
import resource
import select
import socket
import ssl
import struct
import sys
import time
from datetime import UTC, datetime

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
    return f"duration: {go_duration(duration_ns)} - {mbs:.3f}mb/s - {ops:.3f}ops/s - {_go_float(us_op)}us/op"


def _go_float(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return f"{v:.3f}"


def log(tool: str, text: str) -> None:
    """Write like Go's log package with SetPrefix("[tool] "): prefix, local date/time, text."""
    stamp = datetime.now().strftime("%Y/%m/%d %H:%M:%S")
    sys.stderr.write(f"[{tool}] {stamp} {text}\n")
    sys.stderr.flush()


def tool_cpu_seconds() -> float:
    """CPU-seconds (user + system) of this tool so far, its finished worker processes
    included: whether the load generator, not the daemon, was the limit."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def report(tool: str, duration_ns: int, msgs: int, size: int, as_json: bool, **extra: object) -> dict:
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
        "tool_cpu_s": tool_cpu_seconds(),
    }
    data.update(extra)
    if as_json:
        sys.stdout.write(json.dumps(data) + "\n")
        sys.stdout.flush()
    return data


def percentile(sorted_vals: list[int], q: float) -> float:
    """Nearest-rank percentile of a sorted list of ns, in ms."""
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q / 100 * len(sorted_vals)) - 1))
    return sorted_vals[k] / 1e6


def percentiles_ms(values_ns: list[int]) -> dict | None:
    """n, p50, p90, p99 and max (ms) of durations in ns; None if there are none."""
    if not values_ns:
        return None
    v = sorted(values_ns)
    return {
        "n": len(v),
        "p50_ms": percentile(v, 50),
        "p90_ms": percentile(v, 90),
        "p99_ms": percentile(v, 99),
        "max_ms": v[-1] / 1e6,
    }


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
    t = datetime.strptime(deadline, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
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
    return {"client_id": f"{tool}-{os.getpid()}", "hostname": host, "user_agent": f"{tool}/{VERSION}"}


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


# --------------------------------------------------------------------------- upgrades
#
# Not in Go's bench tools. With --tls/--snappy/--deflate a tool IDENTIFYs with
# feature_negotiation and the options asked for, then upgrades as NSQ 1.3 does: the JSON
# reply comes in plain text; if tls_v1 was agreed, the TLS handshake (stdlib ssl on the
# socket) and an OK frame over TLS; if snappy or deflate was agreed, the compressor around
# the stream and an OK frame through it. From then on the tool talks to an UpgradedConn,
# which has the socket methods the tools call; without a flag they keep the bare socket.


def add_upgrade_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection upgrades (not in Go's bench tools)")
    g.add_argument(
        "--tls", action="store_true", help="negotiate TLS (IDENTIFY tls_v1) and send/receive over it"
    )
    g.add_argument(
        "--tls-root-ca-file",
        default="",
        help="verify nsqd's certificate (and its name) against this CA file (PEM)",
    )
    g.add_argument(
        "--tls-insecure-skip-verify",
        action="store_true",
        help="do not verify nsqd's certificate (the default without --tls-root-ca-file)",
    )
    g.add_argument("--snappy", action="store_true", help="negotiate snappy compression")
    g.add_argument("--deflate", action="store_true", help="negotiate deflate compression")
    g.add_argument(
        "--deflate-level",
        type=int,
        default=6,
        help="IDENTIFY deflate_level in [1,9] (6); nsqd caps it at its --max-deflate-level",
    )


def check_upgrade_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.snappy and args.deflate:
        p.error("--snappy and --deflate are exclusive (nsqd allows one compression)")
    if not 1 <= args.deflate_level <= 9:
        p.error("--deflate-level must be in [1,9]")


def upgrade_wanted(args: argparse.Namespace) -> bool:
    return bool(args.tls or args.snappy or args.deflate)


def upgrade_name(args: argparse.Namespace) -> str:
    """What the flags ask for: "none", "tls", "snappy", "tls+deflate(6)", …"""
    parts = (
        (["tls"] if args.tls else [])
        + (["snappy"] if args.snappy else [])
        + ([f"deflate({args.deflate_level})"] if args.deflate else [])
    )
    return "+".join(parts) or "none"


def upgrade_fields(args: argparse.Namespace) -> dict:
    """The IDENTIFY fields that ask for the upgrades (empty without a flag)."""
    if not upgrade_wanted(args):
        return {}
    return {
        "feature_negotiation": True,
        "tls_v1": bool(args.tls),
        "snappy": bool(args.snappy),
        "deflate": bool(args.deflate),
        "deflate_level": args.deflate_level,
    }


def client_ssl_context(args: argparse.Namespace) -> ssl.SSLContext:
    """Verify against --tls-root-ca-file when given (unless --tls-insecure-skip-verify),
    otherwise skip verification: a bench measures throughput, not a PKI."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if args.tls_root_ca_file and not args.tls_insecure_skip_verify:
        context.load_verify_locations(cafile=args.tls_root_ca_file)
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def identify_and_upgrade(
    sock: socket.socket, reader: FrameReader, fields: dict, args: argparse.Namespace
) -> tuple[socket.socket | UpgradedConn, dict | None]:
    """IDENTIFY with ``fields`` plus the upgrade fields, then upgrade as negotiated.

    Returns the connection to use from now on (``sock`` itself without an upgrade flag; the
    reader then reads through it too) and the IDENTIFY reply. Fails if nsqd did not agree
    to an upgrade that was asked for, rather than measuring plain TCP under its name."""
    if not upgrade_wanted(args):
        return sock, handshake_identify(sock, reader, fields)
    neg = handshake_identify(sock, reader, {**fields, **upgrade_fields(args)}) or {}
    for key, wanted, hint in (
        ("tls_v1", args.tls, "--tls-cert and --tls-key"),
        ("snappy", args.snappy, "--snappy=true"),
        ("deflate", args.deflate, "--deflate=true"),
    ):
        if wanted and not neg.get(key):
            raise ProtocolError(f"IDENTIFY: nsqd did not agree to {key} (start it with {hint})")
    timeout = sock.gettimeout()
    base: socket.socket = sock
    tls = ""
    if args.tls:
        if reader.buf:
            raise ProtocolError(f"unexpected bytes before the TLS handshake {bytes(reader.buf[:50])!r}")
        host = parse_addr(args.nsqd_tcp_address)[0]
        base = client_ssl_context(args).wrap_socket(sock, server_hostname=host)  # handshakes
        tls = f"{base.version()} {(base.cipher() or ('?',))[0]}"
    conn = UpgradedConn(base, timeout)
    conn.tls = tls
    reader.sock = conn
    if args.tls:
        ok = reader.expect_ok("TLS")
        if ok != b"OK":
            raise ProtocolError(f"TLS: unexpected reply {ok[:100]!r}")
    if args.snappy or args.deflate:
        from nsqpy.transport import DeflateLayer, SnappyLayer

        if args.snappy:
            layer = SnappyLayer()
            conn.compression = "snappy"
        else:
            level = neg.get("deflate_level") or args.deflate_level
            layer = DeflateLayer(level)
            conn.compression = f"deflate({level})"
        # what already arrived after the last plain/TLS frame is compressed stream
        pending = bytes(reader.buf)
        reader.buf.clear()
        conn.compress(layer, pending)
        ok = reader.expect_ok(conn.compression)
        if ok != b"OK":
            raise ProtocolError(f"{conn.compression}: unexpected reply {ok[:100]!r}")
    return conn, neg


class UpgradedConn:
    """A connection after NSQ's upgrades, with the socket methods the tools use (sendall,
    recv, recv_into with flags 0 or MSG_DONTWAIT, settimeout, fileno, close).

    Underneath is the TCP socket or the ssl.SSLSocket, kept non-blocking: reads gather every
    record/chunk already available (up to the buffer given), blocking calls wait in poll up
    to the timeout. A compressor, when pushed, encodes every sendall and decodes reads."""

    __slots__ = (
        "_eof",
        "_fd",
        "_layer",
        "_out",
        "_outpos",
        "_pollin",
        "_pollout",
        "_scratch",
        "_smv",
        "_sock",
        "_timeout",
        "compression",
        "tls",
    )

    def __init__(self, sock: socket.socket, timeout: float | None):
        self._sock = sock
        sock.settimeout(0.0)
        self._fd = sock.fileno()
        self._timeout = timeout
        self._layer = None
        self._out = memoryview(b"")  # decoded bytes not yet handed out
        self._outpos = 0
        self._scratch = bytearray(0)
        self._smv = memoryview(self._scratch)
        self._eof = False
        self._pollin = select.poll()
        self._pollin.register(self._fd, select.POLLIN)
        self._pollout = select.poll()
        self._pollout.register(self._fd, select.POLLOUT)
        self.tls = ""
        self.compression = ""

    def describe(self) -> str:
        return ", ".join(p for p in (self.tls and "TLS " + self.tls, self.compression) if p)

    def compress(self, layer, pending: bytes = b"") -> None:
        """Put a compressor (nsqpy.transport layer) on top; ``pending`` is stream already read."""
        self._layer = layer
        self._scratch = bytearray(1 << 18)
        self._smv = memoryview(self._scratch)
        if pending:
            self._out = memoryview(layer.decode(pending))
            self._outpos = 0

    # --- socket-like API

    def fileno(self) -> int:
        return self._fd

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def close(self) -> None:
        self._sock.close()

    def sendall(self, data: bytes) -> None:
        layer = self._layer
        if layer is not None:
            data = layer.encode(data)
        view = memoryview(data)
        total, pos = len(view), 0
        send = self._sock.send
        while pos < total:
            try:
                pos += send(view[pos:])
            except (BlockingIOError, ssl.SSLWantWriteError):
                self._wait(self._pollout)
            except ssl.SSLWantReadError:
                self._wait(self._pollin)

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        view = memoryview(buffer)
        if nbytes:
            view = view[:nbytes]
        n = self._gather(view)
        while n < 0:
            if flags & socket.MSG_DONTWAIT:
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
            self._wait(self._pollin)
            n = self._gather(view)
        return n

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        buf = bytearray(bufsize)
        n = self.recv_into(buf, 0, flags)
        return bytes(buf[:n])

    # --- internals

    def _wait(self, poller) -> None:
        t = self._timeout
        if not poller.poll(-1 if t is None else max(0, int(t * 1000))):
            raise TimeoutError("timed out")

    def _read(self, view) -> int:
        """One non-blocking read from the socket/TLS: bytes read, 0 at EOF, -1 for none yet."""
        try:
            return self._sock.recv_into(view)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return -1

    def _gather(self, view) -> int:
        """Fill ``view`` with what is available now: bytes given, 0 at EOF, -1 for none yet."""
        want = len(view)
        if want == 0:
            return 0
        total = 0
        layer = self._layer
        read = self._read
        if layer is None:
            while total < want and not self._eof:
                n = read(view[total:])
                if n <= 0:
                    self._eof = n == 0
                    break
                total += n
        else:
            smv = self._smv
            while total < want:
                out, pos = self._out, self._outpos
                if pos < len(out):
                    k = min(want - total, len(out) - pos)
                    view[total : total + k] = out[pos : pos + k]
                    total += k
                    self._outpos = pos + k
                    continue
                if self._eof:
                    break
                n = read(smv)
                if n <= 0:
                    self._eof = n == 0
                    break
                self._out = memoryview(layer.decode(smv[:n]))
                self._outpos = 0
        if total:
            return total
        return 0 if self._eof else -1
