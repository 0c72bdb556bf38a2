#!/usr/bin/env python3
"""bench_latency: end-to-end publish→deliver latency at a fixed publish rate.

One publisher process sends --rate msgs/s for --runfor (PUB for a single due message,
a small MPUB when several are due at once, at most --max-batch), each --size body starting
with the send time (time.time_ns(), int64 big-endian). One consumer (this process;
IDENTIFY with output buffering disabled by default, RDY --rdy) stamps each received chunk
with time.time_ns() and records receive - send per message. Prints count, p50, p90, p99,
p99.9 and max in ms. Publisher and consumer share the host clock. Raw TCP protocol V2;
nothing from nsqpy is imported unless --snappy or --deflate asks for its compressors
(--tls uses the stdlib's ssl); both connections upgrade alike.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import nsqbench as nb

TOOL = "bench_latency"
_Q = struct.Struct(">q")


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    p.add_argument("--runfor", type=nb.parse_duration, default=10.0, help="publishing time (10s)")
    p.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150", help="<addr>:<port> to connect to nsqd")
    p.add_argument("--topic", default="latency_bench", help="topic")
    p.add_argument("--channel", default="ch", help="channel")
    p.add_argument("--rate", type=float, default=10000.0, help="messages per second to publish")
    p.add_argument("--size", type=int, default=100, help="message size in bytes (>= 8)")
    p.add_argument("--max-batch", type=int, default=50, help="largest MPUB when the publisher is behind")
    p.add_argument("--rdy", type=int, default=2500, help="consumer RDY count")
    p.add_argument(
        "--output-buffer-size",
        type=int,
        default=-1,
        help="consumer IDENTIFY output_buffer_size (-1: no buffering)",
    )
    p.add_argument(
        "--output-buffer-timeout",
        type=int,
        default=-1,
        help="consumer IDENTIFY output_buffer_timeout ms (-1: disabled)",
    )
    p.add_argument(
        "--warmup",
        type=nb.parse_duration,
        default=0.0,
        help="ignore messages sent during the first part of the run",
    )
    p.add_argument(
        "--grace",
        type=nb.parse_duration,
        default=5.0,
        help="how long to wait for outstanding messages after publishing stops",
    )
    p.add_argument("--json", action="store_true", help="also print one JSON result line on stdout")
    nb.add_upgrade_args(p)
    args = p.parse_args(nb.go_flags(argv))
    nb.check_upgrade_args(p, args)
    if args.size < 8:
        p.error("--size must be >= 8 (the timestamp)")
    if args.rate <= 0 or args.max_batch < 1:
        p.error("--rate must be > 0 and --max-batch >= 1")
    return args


# ---------------------------------------------------------------- publisher (child process)


def publisher(args: argparse.Namespace, conn) -> None:
    """Connect, wait for "go", publish at --rate for --runfor, send back the tallies."""
    try:
        sock = nb.connect(args.nsqd_tcp_address)
        reader = nb.FrameReader(sock)
        # the socket itself, or an nb.UpgradedConn with --tls/--snappy/--deflate
        sock, _ = nb.identify_and_upgrade(sock, reader, nb.client_fields("latency-writer"), args)
        sock.settimeout(None)  # blocking sends; MSG_DONTWAIT for the non-blocking reads
    except Exception as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send({"ready": True})
    conn.recv()
    try:
        conn.send(_publish(sock, reader, args))
    except Exception as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        sock.close()


def _publish(sock: socket.socket | nb.UpgradedConn, reader: nb.FrameReader, args: argparse.Namespace) -> dict:
    topic = args.topic.encode()
    pub_head = b"PUB " + topic + b"\n" + struct.pack(">i", args.size)
    mpub_head = b"MPUB " + topic + b"\n"
    item_len = struct.pack(">i", args.size)
    pad = b"\x00" * (args.size - 8)
    rate, max_batch = args.rate, args.max_batch
    interval = 1e9 / rate
    pending: deque[int] = deque()  # message counts of unacknowledged PUB/MPUBs
    sent = acked = pubs = mpubs = 0
    late_max = 0
    sendall = sock.sendall
    buf = reader.buf  # frames already read stay in the reader's buffer
    hdr = nb.FRAME_HEADER.unpack_from
    time_ns, mono_ns = time.time_ns, time.monotonic_ns
    t0 = mono_ns()
    end = t0 + int(args.runfor * 1e9)

    def drain(block: bool) -> None:
        nonlocal acked
        while True:
            try:
                chunk = sock.recv(65536, 0 if block else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not chunk:
                raise nb.ProtocolError("connection closed by nsqd")
            buf.extend(chunk)
            pos = 0
            while len(buf) - pos >= 8:
                size, ft = hdr(buf, pos)
                if len(buf) < pos + 4 + size:
                    break
                data = bytes(buf[pos + 8 : pos + 4 + size])
                pos += 4 + size
                if ft == nb.FRAME_RESPONSE and data == b"OK":
                    acked += pending.popleft()
                elif ft == nb.FRAME_RESPONSE and data == nb.HEARTBEAT:
                    sendall(b"NOP\n")
                else:
                    raise nb.ProtocolError(f"publisher got {data[:100]!r}")
            del buf[:pos]
            if block:
                return

    while True:
        now = mono_ns()
        if now >= end:
            break
        due = int((now - t0) / interval) + 1 - sent  # message k is due at t0 + k*interval
        if due > 0:
            k = min(due, max_batch)
            late_max = max(late_max, now - (t0 + int(sent * interval)))
            body = _Q.pack(time_ns()) + pad
            if k == 1:
                sendall(pub_head + body)
                pubs += 1
            else:
                payload = struct.pack(">i", k) + (item_len + body) * k
                sendall(mpub_head + struct.pack(">i", len(payload)) + payload)
                mpubs += 1
            pending.append(k)
            sent += k
            drain(False)
        else:
            # sleep until the next message is due; never spin, the daemon needs the CPU
            time.sleep((t0 + sent * interval - now) / 1e9)
    publish_s = (mono_ns() - t0) / 1e9
    sock.settimeout(10.0)
    while pending:
        drain(True)
    return {
        "sent": sent,
        "acked": acked,
        "pubs": pubs,
        "mpubs": mpubs,
        "late_max_ms": late_max / 1e6,
        "publish_s": publish_s,
        "cpu_s": time.process_time(),
    }


# ---------------------------------------------------------------- consumer (this process)


percentile = nb.percentile


def run(args: argparse.Namespace) -> int:
    sock: socket.socket | nb.UpgradedConn = nb.connect(args.nsqd_tcp_address)
    reader = nb.FrameReader(sock)
    fields = nb.client_fields("latency-reader")
    fields.update(
        feature_negotiation=True,
        output_buffer_size=args.output_buffer_size,
        output_buffer_timeout=args.output_buffer_timeout,
    )
    upgrade = ""
    try:
        # from here on sock is the socket itself, or an nb.UpgradedConn with the upgrade flags
        sock, neg = nb.identify_and_upgrade(sock, reader, fields, args)
        neg = neg or {}
        if isinstance(sock, nb.UpgradedConn):
            upgrade = sock.describe()
        rdy = args.rdy
        max_rdy = neg.get("max_rdy_count")
        if isinstance(max_rdy, int) and 0 < max_rdy < rdy:
            rdy = max_rdy
        sock.sendall(f"SUB {args.topic} {args.channel}\n".encode())
        reader.expect_ok("SUB")
        sock.sendall(b"RDY %d\n" % rdy)
    except Exception as exc:
        nb.report_failure(TOOL, [f"consumer handshake: {type(exc).__name__}: {exc}"], args.json)
        return 1

    ctx = nb.mp_context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=publisher, args=(args, child), daemon=True)
    proc.start()
    if not parent.poll(30):
        nb.report_failure(TOOL, ["publisher did not start"], args.json)
        proc.kill()
        return 1
    hello = parent.recv()
    if "error" in hello:
        nb.report_failure(TOOL, [f"publisher: {hello['error']}"], args.json)
        return 1

    lat: list[int] = []
    errors: list[str] = []
    received = 0
    buf = bytearray(1 << 20)
    mv = memoryview(buf)
    have = len(reader.buf)
    buf[:have] = reader.buf
    hdr = nb.FRAME_HEADER.unpack_from
    ts_at = _Q.unpack_from
    time_ns, mono_ns = time.time_ns, time.monotonic_ns
    warm_until = time_ns() + int(args.warmup * 1e9)
    pub_result = None
    grace_end = None
    sock.settimeout(None)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    fatal = False
    parent.send("go")
    while not fatal:
        try:
            n = sock.recv_into(mv[have:], 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            n = -1
            if poller.poll(50):
                try:
                    n = sock.recv_into(mv[have:], 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    pass
        if n == 0:
            errors.append("consumer connection closed by nsqd")
            break
        if n > 0:
            now = time_ns()
            end = have + n
            pos = 0
            fins = []
            while end - pos >= 8:
                size, ft = hdr(buf, pos)
                nxt = pos + 4 + size
                if nxt > end:
                    break
                if ft == 2:
                    fins.append(buf[pos + 18 : pos + 34])
                    sent_ns = ts_at(buf, pos + 34)[0]
                    if sent_ns >= warm_until:
                        lat.append(now - sent_ns)
                else:
                    data = bytes(buf[pos + 8 : nxt])
                    if ft == 0 and data == nb.HEARTBEAT:
                        sock.sendall(b"NOP\n")
                    elif ft == 1 and data.startswith(nb.NON_FATAL_ERRORS):
                        errors.append(data.decode(errors="replace"))
                    else:
                        errors.append(f"consumer got frame type {ft}: {data[:100]!r}")
                        fatal = True
                        break
                pos = nxt
            if fins:
                received += len(fins)
                sock.sendall(b"FIN " + b"\nFIN ".join(fins) + b"\n")
            rest = end - pos
            if pos == 0 and rest == len(buf):
                errors.append("frame larger than the 1MiB receive buffer")
                break
            buf[:rest] = buf[pos:end]
            have = rest
        if pub_result is None and parent.poll():
            pub_result = parent.recv()
            if "error" in pub_result:
                errors.append(f"publisher: {pub_result['error']}")
                break
            grace_end = mono_ns() + int(args.grace * 1e9)
        if pub_result is not None and (received >= pub_result["acked"] or mono_ns() >= grace_end):
            break
    sock.close()
    proc.join(timeout=5)

    lat.sort()
    pub = pub_result or {}
    acked = pub.get("acked", 0)
    res = {
        "tool": TOOL,
        "rate": args.rate,
        "size": args.size,
        "published": acked,
        "received": received,
        "missing": max(0, acked - received),
        "count": len(lat),
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "p99_ms": percentile(lat, 99),
        "p999_ms": percentile(lat, 99.9),
        "max_ms": lat[-1] / 1e6 if lat else float("nan"),
        "publisher": pub,
        "upgrade": nb.upgrade_name(args),
        "negotiated": upgrade,
        "errors": errors,
    }
    if upgrade:
        nb.log(TOOL, f"upgrade: {upgrade}")
    nb.log(
        TOOL,
        f"rate: {args.rate:g}/s - count: {len(lat)} - p50: {res['p50_ms']:.3f}ms - "
        f"p90: {res['p90_ms']:.3f}ms - p99: {res['p99_ms']:.3f}ms - "
        f"p99.9: {res['p999_ms']:.3f}ms - max: {res['max_ms']:.3f}ms",
    )
    if pub:
        achieved = acked / pub["publish_s"] if pub.get("publish_s") else 0.0
        nb.log(
            TOOL,
            f"published {acked} ({achieved:.0f}/s, {pub.get('pubs', 0)} PUB + "
            f"{pub.get('mpubs', 0)} MPUB, publisher max lateness "
            f"{pub.get('late_max_ms', 0):.3f}ms, publisher cpu "
            f"{pub.get('cpu_s', 0):.2f}s, consumer cpu {time.process_time():.2f}s), "
            f"received {received}",
        )
    if res["missing"]:
        errors.append(f"{res['missing']} messages not received within --grace")
    for e in errors:
        nb.log(TOOL, f"ERROR: {e}")
    if args.json:
        print(json.dumps(res, default=str))
    return 1 if errors or not lat else 0


def main(argv: list[str] | None = None) -> int:
    return run(build_args(argv))


if __name__ == "__main__":
    sys.exit(main())
