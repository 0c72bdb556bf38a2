#!/usr/bin/env python3
"""What a kill -9 loses: NSQ's durability gap, measured on any nsqd (ours, the Go one).

The scenario of nsqio/nsq #510: nsqd with ``--mem-queue-size=0 --sync-every=1
--msg-timeout=60s``; 3,000 messages MPUB'd and 50 DPUB'd (20 s delay), all acknowledged; a
consumer takes 300 (RDY 300), FINs 100, REQs 50 with a 20 s delay and holds 150 (nsqd sends
150 more meanwhile, never read: counted with the queued ones); then ``kill -9`` and a
restart on the same data path (``--restart-with`` another binary to see what it makes of
the directory), and a consumer drains the channel for ``--drain`` seconds. Prints what was
lost, by kind, and what came back early or again. Standalone (no nsqpy imports).

    python bench/bench_crash.py --nsqd-bin .venv/bin/nsqd
    python bench/bench_crash.py --nsqd-bin $GONSQ/bin/nsqd
    python bench/bench_crash.py --nsqd-bin .venv/bin/nsqd --restart-with $GONSQ/bin/nsqd
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Conn:
    """A bare protocol V2 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.r = reader
        self.w = writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"  V2")
        return cls(r, w)

    def send(self, line: bytes, body: bytes | None = None) -> None:
        self.w.write(line + b"\n" + (struct.pack(">i", len(body)) + body if body is not None else b""))

    async def frame(self, timeout: float = 30) -> tuple[int, bytes]:
        while True:
            size, ftype = struct.unpack(">ii", await asyncio.wait_for(self.r.readexactly(8), timeout))
            data = await asyncio.wait_for(self.r.readexactly(size - 4), timeout)
            if ftype == 0 and data == b"_heartbeat_":
                self.send(b"NOP")
                continue
            return ftype, data

    async def ok(self) -> None:
        frame = await self.frame()
        assert frame == (0, b"OK"), frame

    async def message(self, timeout: float) -> tuple[bytes, int, bytes]:
        """(id, attempts, body) of the next message."""
        while True:
            ftype, data = await self.frame(timeout)
            if ftype == 2:
                return data[10:26], struct.unpack_from(">H", data, 8)[0], data[26:]

    async def sub(self, topic: str, channel: str, rdy: int) -> None:
        self.send(b"IDENTIFY", json.dumps({"msg_timeout": 60000}).encode())
        await self.frame()
        self.send(b"SUB %s %s" % (topic.encode(), channel.encode()))
        await self.ok()
        self.send(b"RDY %d" % rdy)


def start(binary: str, data: str, tcp: int, http: int, log) -> subprocess.Popen[bytes]:
    cmd = [
        binary,
        f"--tcp-address=127.0.0.1:{tcp}",
        f"--http-address=127.0.0.1:{http}",
        f"--data-path={data}",
        "--mem-queue-size=0",
        "--sync-every=1",
        "--msg-timeout=60s",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 15
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/ping", timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"{binary} did not start") from None
            time.sleep(0.05)


def post(http: int, path: str) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{http}{path}", method="POST")
    urllib.request.urlopen(req, timeout=5).close()


async def scenario(args: argparse.Namespace, data: str, log) -> int:
    """Returns how many acknowledged, never FIN'd messages were lost."""
    delay_ms = int(args.delay * 1000)
    tcp, http = free_port(), free_port()
    p = start(args.nsqd_bin, data, tcp, http, log)
    try:
        post(http, "/topic/create?topic=t")
        post(http, "/channel/create?topic=t&channel=c")
        pub = await Conn.open(tcp)
        queued = [b"q%05d" % i for i in range(3000)]
        for i in range(0, len(queued), 100):
            part = queued[i : i + 100]
            pub.send(
                b"MPUB t",
                struct.pack(">i", len(part)) + b"".join(struct.pack(">i", len(b)) + b for b in part),
            )
            await pub.ok()
        dpub = [b"d%03d" % i for i in range(50)]
        due_at: dict[bytes, float] = {}  # the earliest a deferred message may come
        for b in dpub:
            due_at[b] = time.monotonic() + args.delay
            pub.send(b"DPUB t %d" % delay_ms, b)
            await pub.ok()
        c = await Conn.open(tcp)
        await c.sub("t", "c", 300)
        got = [await c.message(30) for _ in range(300)]
        fin, req, held = got[:100], got[100:150], got[150:]
        for mid, _, _ in fin:
            c.send(b"FIN " + mid)
        for mid, _, b in req:
            due_at[b] = time.monotonic() + args.delay
            c.send(b"REQ %s %d" % (mid, delay_ms))
        c.send(b"FIN " + b"0" * 16)  # answered (E_FIN_FAILED) after the FINs and REQs
        while (await c.frame())[0] != 1:
            pass  # the messages sent meanwhile
        p.send_signal(signal.SIGKILL)
        p.wait()
        c.w.close()
        pub.w.close()
        p = start(args.restart_with or args.nsqd_bin, data, tcp, http, log)
        back: dict[bytes, int] = {}
        early = 0
        c = await Conn.open(tcp)
        await c.sub("t", "c", 500)
        end = time.monotonic() + args.drain
        while time.monotonic() < end:
            try:
                mid, attempts, body = await c.message(0.5)
            except TimeoutError:
                continue
            if time.monotonic() < due_at.get(body, 0.0) - 0.01:
                early += 1
            back[body] = max(back.get(body, 0), attempts)
            c.send(b"FIN " + mid)
        c.w.close()
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()

    def lost(bodies: set[bytes]) -> int:
        return len(bodies - back.keys())

    finished = {b for _, _, b in fin}
    in_flight = {b for _, _, b in held}
    requeued = {b for _, _, b in req}
    never = set(queued) - finished - in_flight - requeued
    total = lost(in_flight) + lost(requeued) + lost(set(dpub)) + lost(never)
    counted = sum(1 for b in in_flight if back.get(b, 0) >= 2)
    print(
        f"lost after the restart: in flight {lost(in_flight)}/150, REQ'd with a delay {lost(requeued)}/50, "
        f"DPUB'd {lost(set(dpub))}/50, queued {lost(never)}/2700; total {total} of 2950 acknowledged and "
        f"never FIN'd"
    )
    print(
        f"also: FIN'd delivered again {len(finished & back.keys())}/100, deferred delivered before due "
        f"{early}, in-flight ones back with the lost delivery counted {counted}/150"
    )
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nsqd-bin", required=True, help="the nsqd to kill")
    ap.add_argument(
        "--restart-with", default="", help="the nsqd to restart on its directory (default: the same)"
    )
    ap.add_argument("--delay", type=float, default=20.0, help="seconds of the DPUB and REQ delays")
    ap.add_argument(
        "--drain", type=float, default=25.0, help="seconds to drain after the restart (> --delay)"
    )
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="nsqcrash-")
    try:
        with open(data + ".log", "ab") as log:
            lost = asyncio.run(scenario(args, data, log))
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
