#!/usr/bin/env python3
"""bench_reader: consume a channel as fast as nsqd delivers, FINishing every message.

Modelled on nsqio/nsq bench/bench_reader: same flags and the same result line. Each of
--procs worker processes opens one connection: magic, IDENTIFY (feature negotiation, output
buffering), SUB, RDY --rdy; then it parses message frames in bulk out of one bytearray and
answers each received chunk with one write holding a FIN per message. It runs for --runfor,
or until --count messages arrived over all processes, or (--idle-timeout) until nothing has
arrived for that long. Speaks raw TCP protocol V2; nothing from nsqpy is imported unless
--snappy or --deflate asks for its compressors (--tls uses the stdlib's ssl).

--parse-bench measures the parser alone on a canned in-memory stream (no sockets), so you
can check the reader is not the bottleneck.
"""

from __future__ import annotations

import argparse
import os
import queue
import select
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import nsqbench as nb

TOOL = "bench_reader"


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    p.add_argument("--runfor", type=nb.parse_duration, default=10.0, help="duration of time to run (10s)")
    p.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150", help="<addr>:<port> to connect to nsqd")
    p.add_argument("--size", type=int, default=100, help="message size used for the mb/s figure (Go style)")
    p.add_argument("--topic", default="sub_bench", help="topic to receive messages on")
    p.add_argument("--channel", default="ch", help="channel to receive messages on")
    p.add_argument("--rdy", type=int, default=2500, help="RDY count to use")
    p.add_argument("--procs", type=int, default=1, help="consumer processes (one connection each)")
    p.add_argument(
        "--channels",
        type=int,
        default=0,
        help="fan-out: one consumer on each of this many channels (--channel + 0, 1, …), their "
        "connections spread over --procs processes, each process polling its own",
    )
    p.add_argument(
        "--count", type=int, default=0, help="stop once this many messages arrived in total (0: no limit)"
    )
    p.add_argument(
        "--idle-timeout",
        type=nb.parse_duration,
        default=0.0,
        help="stop a connection after this long without messages (0: never)",
    )
    p.add_argument("--output-buffer-size", type=int, default=65536, help="IDENTIFY output_buffer_size")
    p.add_argument(
        "--output-buffer-timeout", type=int, default=250, help="IDENTIFY output_buffer_timeout (ms)"
    )
    p.add_argument("--msg-timeout", type=int, default=0, help="IDENTIFY msg_timeout (ms, 0: server default)")
    p.add_argument(
        "--heartbeat-interval",
        type=int,
        default=0,
        help="IDENTIFY heartbeat_interval (ms, 0: server default)",
    )
    p.add_argument("--deadline", default="", help="'YYYY-MM-DD HH:MM:SS' (UTC) to start the run")
    p.add_argument("--json", action="store_true", help="also print one JSON result line on stdout")
    p.add_argument(
        "--parse-bench",
        action="store_true",
        help="measure the frame parser on a canned in-memory stream and exit",
    )
    p.add_argument("--parse-msgs", type=int, default=2_000_000, help="messages for --parse-bench")
    p.add_argument(
        "--parse-chunk", type=int, default=65536, help="bytes per simulated recv for --parse-bench"
    )
    nb.add_upgrade_args(p)
    args = p.parse_args(nb.go_flags(argv))
    if args.procs < 1 or args.rdy < 1:
        p.error("--procs and --rdy must be >= 1")
    if args.channels < 0:
        p.error("--channels must be >= 0")
    nb.check_upgrade_args(p, args)
    if args.channels and nb.upgrade_wanted(args):
        p.error("--channels takes plain TCP connections (no --tls, --snappy, --deflate)")
    return args


class ReaderCore:
    """Receive buffer plus the bulk frame parser; no sockets, so it can be measured alone.

    Call ``space()`` for the writable memoryview, write n bytes there, then ``received(n)``:
    it parses every complete frame, returns the FIN payload for the messages (or None) and
    keeps a partial frame at the start of the buffer.
    """

    __slots__ = ("body_bytes", "buf", "have", "msgs", "mv", "others")

    def __init__(self, capacity: int = 1 << 20, initial: bytes = b""):
        capacity = max(capacity, len(initial) * 2, 4096)
        self.buf = bytearray(capacity)
        self.mv = memoryview(self.buf)
        self.buf[: len(initial)] = initial
        self.have = len(initial)
        self.msgs = 0
        self.body_bytes = 0
        self.others: list[tuple[int, bytes]] = []  # non-message frames, for the caller

    def space(self) -> memoryview:
        return self.mv[self.have :]

    def received(self, n: int) -> bytes | None:
        buf = self.buf
        end = self.have + n
        hdr = nb.FRAME_HEADER.unpack_from
        fins: list[bytearray] = []
        append = fins.append
        pos = 0
        body = 0
        while end - pos >= 8:
            size, ft = hdr(buf, pos)
            nxt = pos + 4 + size
            if nxt > end:
                break
            if ft == 2:
                append(buf[pos + 18 : pos + 34])
                body += size
            elif size < 4 or ft not in (0, 1):
                raise nb.ProtocolError(f"bad frame (size {size}, type {ft})")
            else:
                self.others.append((ft, bytes(buf[pos + 8 : nxt])))
            pos = nxt
        rest = end - pos
        if pos:
            if rest:
                buf[:rest] = buf[pos:end]
        elif rest == len(buf):
            self._grow(hdr(buf, 0)[0] + 4)
        self.have = rest
        if not fins:
            return None
        k = len(fins)
        self.msgs += k
        self.body_bytes += body - nb.MSG_OVERHEAD * k
        return b"FIN " + b"\nFIN ".join(fins) + b"\n"

    def _grow(self, need: int) -> None:
        """A single frame does not fit: reallocate (rare; only for huge messages)."""
        self.mv.release()
        bigger = bytearray(max(need + 4096, len(self.buf) * 2))
        bigger[: len(self.buf)] = self.buf
        self.buf = bigger
        self.mv = memoryview(bigger)


def subscribe(idx: int, args: argparse.Namespace, channel: str):
    """Connect, IDENTIFY (and upgrade), SUB ``channel``: (connection, its FrameReader, the
    RDY to send, what was negotiated). The connection is closed if any step fails."""
    conn = sock = nb.connect(args.nsqd_tcp_address)
    try:
        reader = nb.FrameReader(sock)
        fields = nb.client_fields("reader")
        fields.update(
            feature_negotiation=True,
            output_buffer_size=args.output_buffer_size,
            output_buffer_timeout=args.output_buffer_timeout,
        )
        if args.msg_timeout:
            fields["msg_timeout"] = args.msg_timeout
        if args.heartbeat_interval:
            fields["heartbeat_interval"] = args.heartbeat_interval
        # conn: the socket itself, or an nb.UpgradedConn with --tls/--snappy/--deflate
        conn, neg = nb.identify_and_upgrade(sock, reader, fields, args)
        neg = neg or {}
        upgrade = conn.describe() if conn is not sock else ""
        rdy = args.rdy
        max_rdy = neg.get("max_rdy_count")
        if isinstance(max_rdy, int) and 0 < max_rdy < rdy:
            nb.log(TOOL, f"proc {idx}: --rdy {rdy} > max_rdy_count {max_rdy}; using {max_rdy}")
            rdy = max_rdy
        conn.sendall(f"SUB {args.topic} {channel}\n".encode())
        ok = reader.expect_ok("SUB")
        if ok != b"OK":
            raise nb.ProtocolError(f"SUB: unexpected reply {ok[:100]!r}")
    except BaseException:
        conn.close()
        raise
    return conn, reader, rdy, upgrade


def sub_worker(idx: int, args: argparse.Namespace, ready_q, start_ev, result_q, total, stop_ns) -> None:
    """One connection: handshake and SUB, signal ready, wait for the start, RDY, consume."""
    try:
        conn, reader, rdy, upgrade = subscribe(idx, args, args.channel)
    except Exception as exc:
        ready_q.put((idx, f"{type(exc).__name__}: {exc}"))
        return
    ready_q.put((idx, None))
    start_ev.wait()
    core = ReaderCore(max(1 << 20, 4 * (args.size + 64)), bytes(reader.buf))
    try:
        reason, t_end, errs, hbs = _consume(conn, core, rdy, args, total, stop_ns)
        result_q.put(
            {
                "idx": idx,
                "msgs": core.msgs,
                "body_bytes": core.body_bytes,
                "t_end": t_end,
                "reason": reason,
                "non_fatal": errs,
                "heartbeats": hbs,
                "upgrade": upgrade,
                "error": None,
            }
        )
    except Exception as exc:
        result_q.put(
            {
                "idx": idx,
                "msgs": core.msgs,
                "body_bytes": core.body_bytes,
                "t_end": time.monotonic_ns(),
                "reason": "error",
                "non_fatal": 0,
                "heartbeats": 0,
                "upgrade": upgrade,
                "error": f"{type(exc).__name__}: {exc}",
            }
        )
    finally:
        conn.close()


def _consume(
    sock: socket.socket | nb.UpgradedConn,
    core: ReaderCore,
    rdy: int,
    args: argparse.Namespace,
    total,
    stop_ns,
) -> tuple[str, int, int, int]:
    """RDY, then read/parse/FIN until a stop condition: (reason, end ns, non-fatal errors,
    heartbeats). Returns "count" as soon as the shared total reaches --count."""
    monotonic_ns = time.monotonic_ns
    t0 = monotonic_ns()
    deadline = t0 + int(args.runfor * 1e9)
    idle_ns = int(args.idle_timeout * 1e9)
    last_msg = t0
    limit = args.count
    non_fatal = heartbeats = 0
    # (sock is the socket, or an nb.UpgradedConn with the same methods and semantics.)
    # Blocking socket: try a non-blocking read first (under load there is always data, so one
    # syscall per chunk) and poll only when the socket is empty, to notice stop conditions.
    sock.settimeout(None)
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    wait = poll.poll
    dontwait = socket.MSG_DONTWAIT
    recv_into, sendall = sock.recv_into, sock.sendall
    sendall(b"RDY %d\n" % rdy)
    # a handshake leftover (never expected) is parsed before the first recv
    fin = core.received(0) if core.have else None
    if fin:
        sendall(fin)
    while True:
        try:
            n = recv_into(core.space(), 0, dontwait)
        except BlockingIOError:
            n = -1
            if wait(50):
                try:
                    n = recv_into(core.space(), 0, dontwait)
                except BlockingIOError:
                    pass
        now = monotonic_ns()
        if n == 0:
            raise nb.ProtocolError("connection closed by nsqd")
        if n > 0:
            before = core.msgs
            fin = core.received(n)
            if fin:
                sendall(fin)
                last_msg = now
                if limit:
                    with total.get_lock():
                        total.value += core.msgs - before
                        reached = total.value >= limit
                    if reached:
                        with stop_ns.get_lock():
                            if not stop_ns.value:
                                stop_ns.value = now
                        return "count", now, non_fatal, heartbeats
            if core.others:
                for ft, data in core.others:
                    if ft == nb.FRAME_RESPONSE:
                        if data == nb.HEARTBEAT:
                            sendall(b"NOP\n")
                            heartbeats += 1
                        else:
                            nb.log(TOOL, f"response: {data[:100]!r}")
                    elif data.startswith(nb.NON_FATAL_ERRORS):
                        non_fatal += 1
                    else:
                        raise nb.ProtocolError(data.decode(errors="replace"))
                core.others.clear()
        if now >= deadline:
            return "runfor", deadline, non_fatal, heartbeats
        if limit and stop_ns.value:
            return "count", stop_ns.value, non_fatal, heartbeats
        if idle_ns and now - last_msg >= idle_ns:
            return "idle", last_msg, non_fatal, heartbeats


def fanout_worker(
    idx: int, args: argparse.Namespace, channels: list[str], ready_q, start_ev, result_q, total, stop_ns
) -> None:
    """--channels: one connection per channel in ``channels``, all polled by this process;
    each is consumed as :func:`_consume` does one (parse in bulk, one write of FINs per read)."""
    conns: list = []
    try:
        for ch in channels:
            conn, reader, rdy, _ = subscribe(idx, args, ch)
            conns.append((conn, ReaderCore(max(1 << 18, 4 * (args.size + 64)), bytes(reader.buf)), rdy))
    except Exception as exc:
        ready_q.put((idx, f"{type(exc).__name__}: {exc}"))
        for conn, _, _ in conns:
            conn.close()
        return
    ready_q.put((idx, None))
    start_ev.wait()
    cores = [core for _, core, _ in conns]
    try:
        reason, t_end, errs, hbs = _consume_many(conns, args, total, stop_ns)
        error = None
    except Exception as exc:
        reason, t_end, errs, hbs = "error", time.monotonic_ns(), 0, 0
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for conn, _, _ in conns:
            conn.close()
    result_q.put(
        {
            "idx": idx,
            "msgs": sum(c.msgs for c in cores),
            "body_bytes": sum(c.body_bytes for c in cores),
            "per_channel": dict(zip(channels, (c.msgs for c in cores), strict=True)),
            "t_end": t_end,
            "reason": reason,
            "non_fatal": errs,
            "heartbeats": hbs,
            "upgrade": "",
            "error": error,
        }
    )


def _consume_many(conns: list, args: argparse.Namespace, total, stop_ns) -> tuple[str, int, int, int]:
    """:func:`_consume` over several plain sockets at once, polled."""
    monotonic_ns = time.monotonic_ns
    t0 = monotonic_ns()
    deadline = t0 + int(args.runfor * 1e9)
    idle_ns = int(args.idle_timeout * 1e9)
    last_msg = t0
    limit = args.count
    non_fatal = heartbeats = 0
    poll = select.poll()
    by_fd = {}
    for conn, core, rdy in conns:
        conn.settimeout(None)
        poll.register(conn, select.POLLIN)
        by_fd[conn.fileno()] = (conn, core)
        conn.sendall(b"RDY %d\n" % rdy)
        fin = core.received(0) if core.have else None
        if fin:
            conn.sendall(fin)
    wait = poll.poll
    dontwait = socket.MSG_DONTWAIT
    while True:
        events = wait(50)
        now = monotonic_ns()
        got = 0
        for fd, _ in events:
            conn, core = by_fd[fd]
            try:
                n = conn.recv_into(core.space(), 0, dontwait)
            except BlockingIOError:
                continue
            if n == 0:
                raise nb.ProtocolError("connection closed by nsqd")
            before = core.msgs
            fin = core.received(n)
            if fin:
                conn.sendall(fin)
                got += core.msgs - before
            if core.others:
                for ft, data in core.others:
                    if ft == nb.FRAME_RESPONSE:
                        if data == nb.HEARTBEAT:
                            conn.sendall(b"NOP\n")
                            heartbeats += 1
                        else:
                            nb.log(TOOL, f"response: {data[:100]!r}")
                    elif data.startswith(nb.NON_FATAL_ERRORS):
                        non_fatal += 1
                    else:
                        raise nb.ProtocolError(data.decode(errors="replace"))
                core.others.clear()
        if got:
            last_msg = now
            if limit:
                with total.get_lock():
                    total.value += got
                    reached = total.value >= limit
                if reached:
                    with stop_ns.get_lock():
                        if not stop_ns.value:
                            stop_ns.value = now
                    return "count", now, non_fatal, heartbeats
        if now >= deadline:
            return "runfor", deadline, non_fatal, heartbeats
        if limit and stop_ns.value:
            return "count", stop_ns.value, non_fatal, heartbeats
        if idle_ns and now - last_msg >= idle_ns:
            return "idle", last_msg, non_fatal, heartbeats


def parse_bench(args: argparse.Namespace) -> int:
    """Time ReaderCore on a canned stream of message frames fed in --parse-chunk slices."""
    import struct

    n = args.parse_msgs
    body = b"x" * args.size
    frames = []
    for i in range(min(n, 10_000)):
        data = struct.pack(">qH", time.time_ns(), 1) + b"%016x" % i + body
        frames.append(struct.pack(">Ii", len(data) + 4, nb.FRAME_MESSAGE) + data)
    block = b"".join(frames)
    reps = -(-n // len(frames))
    stream = memoryview(block * reps)
    total_msgs = len(frames) * reps
    chunk = args.parse_chunk
    core = ReaderCore(max(1 << 20, 4 * chunk))
    fin_bytes = 0
    t0 = time.perf_counter_ns()
    off, end = 0, len(stream)
    while off < end:
        space = core.space()
        k = min(chunk, end - off, len(space))
        space[:k] = stream[off : off + k]
        off += k
        fin = core.received(k)
        if fin:
            fin_bytes += len(fin)
    dt = time.perf_counter_ns() - t0
    assert core.msgs == total_msgs, (core.msgs, total_msgs)
    assert fin_bytes == total_msgs * 21
    rate = total_msgs / (dt / 1e9)
    nb.log(
        TOOL,
        f"parse-bench: {total_msgs} msgs of {args.size}B in {args.parse_chunk}B chunks: "
        f"{nb.go_duration(dt)} - {rate:.0f} msgs/s - {dt / 1000 / total_msgs:.3f}us/msg "
        f"(parse + FIN build, no sockets)",
    )
    if args.json:
        import json

        print(
            json.dumps(
                {
                    "tool": "bench_reader_parse",
                    "msgs": total_msgs,
                    "size": args.size,
                    "chunk": chunk,
                    "duration_s": dt / 1e9,
                    "msgs_per_s": rate,
                }
            )
        )
    return 0


def run(args: argparse.Namespace) -> int:
    ctx = nb.mp_context()
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    start_ev = ctx.Event()
    total = ctx.Value("q", 0)
    stop_ns = ctx.Value("q", 0)
    if args.channels:
        names = [f"{args.channel}{i}" for i in range(args.channels)]
        shares = [names[i :: args.procs] for i in range(min(args.procs, args.channels))]
        procs = [
            ctx.Process(
                target=fanout_worker,
                daemon=True,
                args=(i, args, share, ready_q, start_ev, result_q, total, stop_ns),
            )
            for i, share in enumerate(shares)
        ]
    else:
        procs = [
            ctx.Process(
                target=sub_worker, daemon=True, args=(i, args, ready_q, start_ev, result_q, total, stop_ns)
            )
            for i in range(args.procs)
        ]
    for p in procs:
        p.start()
    errors: list[str] = []
    for _ in procs:
        try:
            idx, err = ready_q.get(timeout=30 + args.channels * 0.1)
        except queue.Empty:
            errors.append("timed out waiting for consumers to connect")
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
            results.append(result_q.get(timeout=args.runfor + 60))
        except queue.Empty:
            errors.append("timed out waiting for consumer results")
            break
    for p in procs:
        p.join(timeout=5)
    results.sort(key=lambda r: r["idx"])
    total_msgs = sum(r["msgs"] for r in results)
    reasons = sorted({r["reason"] for r in results})
    if stop_ns.value:
        end = stop_ns.value
    elif results:
        end = max(r["t_end"] for r in results)
    else:
        end = time.monotonic_ns()
    for r in results:
        if r["error"]:
            errors.append(f"proc {r['idx']}: {r['error']}")
    for e in errors:
        nb.log(TOOL, f"ERROR: {e}")
    if args.count and total_msgs < args.count:
        nb.log(TOOL, f"received {total_msgs} of --count {args.count} (stopped by: {', '.join(reasons)})")
    upgrade = next((r["upgrade"] for r in results if r.get("upgrade")), "")
    if upgrade:
        nb.log(TOOL, f"upgrade: {upgrade}")
    extra = {}
    if args.channels:
        per_channel = {k: v for r in results for k, v in r.get("per_channel", {}).items()}
        extra["channels"] = args.channels
        extra["per_channel_min"] = min(per_channel.values(), default=0)
        extra["per_channel_max"] = max(per_channel.values(), default=0)
        nb.log(
            TOOL,
            f"{args.channels} channels: {extra['per_channel_min']}..{extra['per_channel_max']} messages each",
        )
    nb.report(
        TOOL,
        end - start,
        total_msgs,
        args.size,
        args.json,
        procs=args.procs,
        rdy=args.rdy,
        topic=args.topic,
        channel=args.channel,
        body_bytes=sum(r["body_bytes"] for r in results),
        stop_reasons=reasons,
        non_fatal_errors=sum(r["non_fatal"] for r in results),
        heartbeats=sum(r["heartbeats"] for r in results),
        per_proc=[
            {
                "idx": r["idx"],
                "msgs": r["msgs"],
                "reason": r["reason"],
                "duration_s": (r["t_end"] - start) / 1e9,
            }
            for r in results
        ],
        upgrade=nb.upgrade_name(args),
        negotiated=upgrade,
        errors=errors,
        **extra,
    )
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    args = build_args(argv)
    if args.parse_bench:
        return parse_bench(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
