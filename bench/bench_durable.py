#!/usr/bin/env python3
"""Acknowledged-PUB rate with concurrent publishers, each waiting for its OK before the next.

Meant for nsqd's crash-safe mode (``--mem-queue-size=0 --sync-every=1``), where every OK
means "written and fsynced": it measures how well the daemon commits concurrent publishes
together. Standalone (no nsqpy imports), so it can drive the Go nsqd too.

    python bench/bench_durable.py --nsqd-tcp-address=127.0.0.1:4150 --publishers=16 --runfor=10
    python bench/bench_durable.py --start --publishers=16      # starts its own nsqd
    python bench/bench_durable.py --daemon ours=.venv/bin/nsqd --daemon go=$GONSQ/bin/nsqd \\
        --rounds 3 --runfor 5                                   # side by side, taking turns
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any


async def publisher(
    host: str, port: int, topic: str, size: int, stop_at: float, counts: list[int], k: int
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"  V2")
    body = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
    frame = b"PUB " + topic.encode() + b"\n" + struct.pack(">i", len(body)) + body
    try:
        while time.monotonic() < stop_at:
            writer.write(frame)
            head = await reader.readexactly(8)
            size_, ftype = struct.unpack(">ii", head)
            data = await reader.readexactly(size_ - 4)
            if ftype == 0 and data == b"_heartbeat_":
                writer.write(b"NOP\n")
                head = await reader.readexactly(8)
                size_, ftype = struct.unpack(">ii", head)
                data = await reader.readexactly(size_ - 4)
            if ftype != 0 or data != b"OK":
                raise RuntimeError(f"unexpected frame {ftype} {data!r}")
            counts[k] += 1
    finally:
        writer.close()


async def run(args: argparse.Namespace, address: str) -> float:
    host, _, port = address.rpartition(":")
    counts = [0] * args.publishers
    start = time.monotonic()
    stop_at = start + args.runfor
    await asyncio.gather(
        *(
            publisher(host, int(port), args.topic, args.size, stop_at, counts, k)
            for k in range(args.publishers)
        )
    )
    elapsed = time.monotonic() - start
    total = sum(counts)
    rate = total / elapsed
    print(
        f"publishers={args.publishers} acked={total} duration={elapsed:.3f}s "
        f"rate={rate:.1f} acked PUB/s ({rate / args.publishers:.1f} per publisher)"
    )
    return rate


def run_loop(main: Any) -> Any:
    """The load on uvloop when it is installed: the publishers' own overhead is not what is
    measured."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_nsqd(binary: str, args: argparse.Namespace, data: str) -> tuple[subprocess.Popen[bytes], str]:
    """Any nsqd (ours, the Go one) on free loopback ports, in the mode the flags say; with
    --channel, the topic and that channel are created first (publishes then go to the
    channel's queue)."""
    tcp, http = free_port(), free_port()
    cmd = [
        binary,
        f"--tcp-address=127.0.0.1:{tcp}",
        f"--http-address=127.0.0.1:{http}",
        f"--data-path={data}",
        f"--mem-queue-size={args.mem_queue_size}",
        f"--sync-every={args.sync_every}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/ping", timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"{binary} did not start") from None
            time.sleep(0.05)
    if args.channel:
        for path in (
            f"/topic/create?topic={args.topic}",
            f"/channel/create?topic={args.topic}&channel={args.channel}",
        ):
            req = urllib.request.Request(f"http://127.0.0.1:{http}{path}", method="POST")
            urllib.request.urlopen(req, timeout=5).close()
    return proc, f"127.0.0.1:{tcp}"


def run_daemon(binary: str, args: argparse.Namespace) -> float:
    data = tempfile.mkdtemp(prefix="nsqdurable-")
    proc, address = start_nsqd(binary, args, data)
    try:
        return run_loop(run(args, address))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    ap.add_argument("--start", action="store_true", help="start our nsqd in crash-safe mode on a temp dir")
    ap.add_argument(
        "--daemon",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="start this nsqd (repeatable: they take turns, --rounds times; ratios to the first)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="with --daemon")
    ap.add_argument("--mem-queue-size", type=int, default=0, help="with --start/--daemon")
    ap.add_argument("--sync-every", type=int, default=1, help="with --start/--daemon")
    ap.add_argument("--channel", default="", help="with --start/--daemon: create this channel first")
    ap.add_argument("--publishers", type=int, default=16)
    ap.add_argument("--runfor", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--topic", default="durable_bench")
    args = ap.parse_args()
    if args.start:
        args.daemon = ["ours=" + (shutil.which("nsqd", path=os.path.dirname(sys.executable)) or "nsqd")]
    if not args.daemon:
        run_loop(run(args, args.nsqd_tcp_address))
        return 0
    daemons = [d.partition("=")[::2] for d in args.daemon]
    rates: dict[str, list[float]] = {label: [] for label, _ in daemons}
    for _ in range(args.rounds):
        for label, binary in daemons:
            print(f"{label}: ", end="", flush=True)
            rates[label].append(run_daemon(binary, args))
    if len(daemons) > 1 or args.rounds > 1:
        first_label = daemons[0][0]
        first = statistics.median(rates[first_label])
        for label, _ in daemons:
            med = statistics.median(rates[label])
            print(
                f"{label}: median {med:.1f} acked PUB/s over {args.rounds} run(s) "
                f"({first_label} = {first / med:.2f}x this)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
