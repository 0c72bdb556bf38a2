#!/usr/bin/env python3
"""bench_writer: publish MPUB batches to one nsqd as fast as it will take them.

Modelled on nsqio/nsq bench/bench_writer: same flags and the same result line
("duration: … - …mb/s - …ops/s - …us/op"). Each of --procs worker *processes* owns one
connection (Go uses one goroutine per GOMAXPROCS; a Python client needs processes to keep a
daemon busy) and keeps up to --pipeline MPUBs outstanding so the connection never idles.
Speaks raw TCP protocol V2; nothing from nsqpy is imported unless --snappy or --deflate
asks for its compressors (--tls uses the stdlib's ssl): see nsqbench.identify_and_upgrade.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import sys
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import nsqbench as nb

TOOL = "bench_writer"


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    p.add_argument("--runfor", type=nb.parse_duration, default=10.0, help="duration of time to run (10s)")
    p.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150", help="<addr>:<port> to connect to nsqd")
    p.add_argument("--topic", default="sub_bench", help="topic to publish to")
    p.add_argument("--size", type=int, default=100, help="size of messages (bytes)")
    p.add_argument("--batch-size", type=int, default=200, help="messages per MPUB")
    p.add_argument("--procs", type=int, default=1, help="publisher processes (one connection each)")
    p.add_argument("--pipeline", type=int, default=4, help="MPUBs outstanding per connection")
    p.add_argument(
        "--count", type=int, default=0, help="stop after about this many messages in total (0: no limit)"
    )
    p.add_argument("--deadline", default="", help="'YYYY-MM-DD HH:MM:SS' (UTC) to start the run")
    p.add_argument("--no-identify", action="store_true", help="skip IDENTIFY")
    p.add_argument("--json", action="store_true", help="also print one JSON result line on stdout")
    nb.add_upgrade_args(p)
    args = p.parse_args(nb.go_flags(argv))
    if args.size < 1 or args.batch_size < 1 or args.procs < 1 or args.pipeline < 1:
        p.error("--size, --batch-size, --procs and --pipeline must be >= 1")
    nb.check_upgrade_args(p, args)
    if args.no_identify and nb.upgrade_wanted(args):
        p.error("--tls, --snappy and --deflate need IDENTIFY (drop --no-identify)")
    return args


def pub_worker(idx: int, args: argparse.Namespace, per_proc_count: int, ready_q, start_ev, result_q) -> None:
    """One connection: handshake, signal ready, wait for the start, then pipeline MPUBs."""
    conn = sock = None
    try:
        conn = sock = nb.connect(args.nsqd_tcp_address)
        reader = nb.FrameReader(sock)
        upgrade = ""
        if not args.no_identify:
            # conn: the socket itself, or an nb.UpgradedConn with --tls/--snappy/--deflate
            conn, _ = nb.identify_and_upgrade(sock, reader, nb.client_fields("writer"), args)
            if conn is not sock:
                upgrade = conn.describe()
        cmd = nb.mpub_cmd(args.topic, [b"\x00" * args.size] * args.batch_size)
    except Exception as exc:  # report instead of dying silently in the child
        ready_q.put((idx, f"{type(exc).__name__}: {exc}"))
        if conn is not None:
            conn.close()
        return
    ready_q.put((idx, None))
    start_ev.wait()
    progress = [0]  # acknowledged MPUBs, kept up to date so a failure still reports them
    rtts: list[int] = []  # each acknowledged MPUB's round trip, ns
    try:
        t_end = _pump(conn, cmd, args, per_proc_count, progress, rtts)
        result_q.put(
            {
                "idx": idx,
                "msgs": progress[0] * args.batch_size,
                "t_end": t_end,
                "upgrade": upgrade,
                "rtts": rtts,
                "error": None,
            }
        )
    except Exception as exc:
        result_q.put(
            {
                "idx": idx,
                "msgs": progress[0] * args.batch_size,
                "t_end": time.monotonic_ns(),
                "upgrade": upgrade,
                "rtts": rtts,
                "error": f"{type(exc).__name__}: {exc}",
            }
        )
    finally:
        conn.close()


def _pump(
    sock: socket.socket | nb.UpgradedConn,
    cmd: bytes,
    args: argparse.Namespace,
    limit: int,
    progress: list[int],
    rtts: list[int],
) -> int:
    """Keep --pipeline MPUBs in flight until --runfor (or the count) is reached; drain the OKs.

    Counts acknowledged MPUBs in progress[0] and appends each one's round trip (ns, from
    its send to its OK: nsqd answers in order) to ``rtts``; returns the monotonic time it
    finished."""
    sock.settimeout(30.0)
    end = time.monotonic() + args.runfor
    pipeline = args.pipeline
    max_batches = -(-limit // args.batch_size) if limit else 0
    sent = outstanding = 0
    sendall, recv_into = sock.sendall, sock.recv_into
    hdr = nb.FRAME_HEADER.unpack_from
    buf = bytearray(65536)
    mv = memoryview(buf)
    have = 0
    monotonic = time.monotonic
    monotonic_ns = time.monotonic_ns
    sent_at: deque[int] = deque()
    took = rtts.append
    sending = True
    while True:
        if sending:
            if monotonic() >= end or (max_batches and sent >= max_batches):
                sending = False
            else:
                while outstanding < pipeline and not (max_batches and sent >= max_batches):
                    sent_at.append(monotonic_ns())
                    sendall(cmd)
                    sent += 1
                    outstanding += 1
        if not sending and outstanding == 0:
            return time.monotonic_ns()
        n = recv_into(mv[have:])
        if n == 0:
            raise nb.ProtocolError("connection closed by nsqd")
        have += n
        pos = 0
        while have - pos >= 8:
            size, ft = hdr(buf, pos)
            nxt = pos + 4 + size
            if nxt > have:
                break
            data = bytes(buf[pos + 8 : nxt])
            pos = nxt
            if ft == nb.FRAME_RESPONSE:
                if data == b"OK":
                    took(monotonic_ns() - sent_at.popleft())
                    progress[0] += 1
                    outstanding -= 1
                elif data == nb.HEARTBEAT:
                    sendall(b"NOP\n")
                else:
                    raise nb.ProtocolError(f"unexpected response {data[:100]!r}")
            elif ft == nb.FRAME_ERROR:
                raise nb.ProtocolError(data.decode(errors="replace"))
            else:
                raise nb.ProtocolError(f"unexpected frame type {ft}")
        if pos:
            rest = have - pos
            buf[:rest] = buf[pos:have]
            have = rest
        if have == len(buf):
            raise nb.ProtocolError("response frame larger than 64KiB")


def run(args: argparse.Namespace) -> int:
    ctx = nb.mp_context()
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    start_ev = ctx.Event()
    per_proc = -(-args.count // args.procs) if args.count else 0
    procs = [
        ctx.Process(target=pub_worker, daemon=True, args=(i, args, per_proc, ready_q, start_ev, result_q))
        for i in range(args.procs)
    ]
    for p in procs:
        p.start()
    errors = []
    for _ in procs:
        try:
            idx, err = ready_q.get(timeout=30)
        except queue.Empty:
            errors.append("timed out waiting for publishers to connect")
            break
        if err:
            errors.append(f"proc {idx}: {err}")
    if errors:
        nb.report_failure(TOOL, errors, args.json)
        for p in procs:
            p.kill()
        return 1
    nb.wait_deadline(args.deadline, TOOL)
    start = time.monotonic_ns()
    start_ev.set()
    results = []
    for _ in procs:
        try:
            results.append(result_q.get(timeout=args.runfor + 120))
        except queue.Empty:
            errors.append("timed out waiting for publisher results")
            break
    end = time.monotonic_ns()
    for p in procs:
        p.join(timeout=5)
    total = sum(r["msgs"] for r in results)
    for r in results:
        if r["error"]:
            errors.append(f"proc {r['idx']}: {r['error']}")
    for e in errors:
        nb.log(TOOL, f"ERROR: {e}")
    per_proc_out = [
        {"idx": r["idx"], "msgs": r["msgs"], "duration_s": (r["t_end"] - start) / 1e9}
        for r in sorted(results, key=lambda r: r["idx"])
    ]
    upgrade = next((r["upgrade"] for r in results if r.get("upgrade")), "")
    if upgrade:
        nb.log(TOOL, f"upgrade: {upgrade}")
    rtt = nb.percentiles_ms([t for r in results for t in r.get("rtts", ())])
    if rtt:
        nb.log(
            TOOL,
            f"MPUB round trip: p50 {rtt['p50_ms']:.3f}ms p99 {rtt['p99_ms']:.3f}ms "
            f"max {rtt['max_ms']:.3f}ms (n={rtt['n']})",
        )
    nb.report(
        TOOL,
        end - start,
        total,
        args.size,
        args.json,
        procs=args.procs,
        batch_size=args.batch_size,
        pipeline=args.pipeline,
        topic=args.topic,
        per_proc=per_proc_out,
        rtt=rtt,
        upgrade=nb.upgrade_name(args),
        negotiated=upgrade,
        errors=errors,
    )
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    return run(build_args(argv))


if __name__ == "__main__":
    sys.exit(main())
