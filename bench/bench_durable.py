#!/usr/bin/env python3
"""Acknowledged-PUB rate with concurrent publishers, each waiting for its OK before the next.

Meant for nsqd's crash-safe mode (``--mem-queue-size=0 --sync-every=1``), where every OK
means "written and fsynced": it measures how well the daemon commits concurrent publishes
together. Standalone (no nsqpy imports), so it can drive the Go nsqd too.

    python bench/bench_durable.py --nsqd-tcp-address=127.0.0.1:4150 --publishers=16 --runfor=10
    python bench/bench_durable.py --start --publishers=16      # starts its own nsqd
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
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


def run_loop(main: Any) -> None:
    """The load on uvloop when it is installed: the publishers' own overhead is not what is
    measured."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def start_nsqd(args: argparse.Namespace, data: str) -> tuple[subprocess.Popen[bytes], str]:
    nsqd = shutil.which("nsqd", path=os.path.dirname(sys.executable)) or "nsqd"
    cmd = [
        nsqd,
        "--tcp-address=127.0.0.1:0",
        "--http-address=",
        f"--data-path={data}",
        f"--mem-queue-size={args.mem_queue_size}",
        f"--sync-every={args.sync_every}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    m = re.search(r"TCP address: (\S+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"nsqd did not start: {line!r}")
    return proc, m.group(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    ap.add_argument("--start", action="store_true", help="start our nsqd in crash-safe mode on a temp dir")
    ap.add_argument("--mem-queue-size", type=int, default=0, help="with --start")
    ap.add_argument("--sync-every", type=int, default=1, help="with --start")
    ap.add_argument("--publishers", type=int, default=16)
    ap.add_argument("--runfor", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--topic", default="durable_bench")
    args = ap.parse_args()
    if not args.start:
        run_loop(run(args, args.nsqd_tcp_address))
        return 0
    data = tempfile.mkdtemp(prefix="nsqdurable-")
    proc, address = start_nsqd(args, data)
    try:
        run_loop(run(args, address))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
