#!/usr/bin/env python3
"""Soak: nsqd under steady publish and consume with random consumer churn, for a long time,
sampling its RSS and open file descriptors every ``--interval`` seconds.

Starts the ``nsqd`` console script (free ports, a temp ``--data-path``; extra flags after
``--``), then in this process (asyncio, our client library):

- ``--producers`` Producers publish ``--rate`` messages/s in all to topic ``soak``: PUB,
  with every 10th publish an MPUB of 10 and every 50th a DPUB (100 ms), plus an HTTP /pub
  every second; each body is a unique decimal number, and this process keeps one bit per
  number for "acknowledged" and one per channel for "received" (bitmaps, so its own memory
  does not grow with the message count the way sets of bodies would);
- channels ``a`` and ``b`` each have ``--consumers`` Consumers that FIN what they get; every
  ``--churn`` seconds (on average) a random one is closed, and a new one takes its place
  (sometimes abruptly: its connections are aborted, so its in-flight messages time out and
  are redelivered); an ``#ephemeral`` channel's consumer comes and goes too;
- every ``--interval`` s: nsqd's RSS (``/proc/<pid>/status``), its fd count
  (``/proc/<pid>/fd``), its task count is not visible from outside, so /stats depths and
  counts stand in (depth, in-flight, clients), and this process's rates.

At the end publishing stops, the consumers drain both channels, and the script checks that
every acknowledged message reached each channel at least once. It prints a table of the
samples and a summary: RSS and fds at the start (after ``--warmup``) and end, the RSS slope
in MiB/hour fitted over the samples after warm-up, published/consumed counts and loss.

    nice -n 19 .venv/bin/python bench/soak.py --duration 1800            # the 30-minute soak
    .venv/bin/python bench/soak.py --duration 20 --interval 2 --warmup 4   # a quick look
    .venv/bin/python bench/soak.py --duration 1800 -- --mem-queue-size=1000   # extra nsqd flags

Exits 1 if a message was lost, nsqd died, or the RSS slope exceeds ``--max-rss-slope``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
_ADDR = re.compile(r"^nsqd (TCP|HTTP) address: (\S+)")


def start_nsqd(data: Path, extra: list[str]) -> tuple[subprocess.Popen, str, str]:
    log = open(data / "nsqd.log", "wb")
    p = subprocess.Popen(
        [
            str(BIN / "nsqd"),
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={data}",
            *extra,
        ],
        stdin=subprocess.DEVNULL,
        stdout=open(data / "nsqd.out", "wb"),
        stderr=log,
    )
    deadline = time.monotonic() + 20
    addrs: dict[str, str] = {}
    while len(addrs) < 2:
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise RuntimeError("nsqd did not start:\n" + (data / "nsqd.log").read_text(errors="replace"))
        for line in (data / "nsqd.out").read_text(errors="replace").splitlines():
            m = _ADDR.match(line)
            if m:
                addrs[m[1]] = m[2]
        time.sleep(0.05)
    return p, addrs["TCP"], addrs["HTTP"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def http_json(url: str, data: bytes | None = None) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else {}


class Bits:
    """A growable bitmap of message numbers."""

    def __init__(self) -> None:
        self.b = bytearray()
        self.count = 0

    def add(self, n: int) -> None:
        i, m = n >> 3, 1 << (n & 7)
        if i >= len(self.b):
            self.b.extend(bytes(i - len(self.b) + 4096))
        if not self.b[i] & m:
            self.b[i] |= m
            self.count += 1

    def missing_from(self, other: Bits) -> int:
        """How many numbers of self are not in other."""
        a = int.from_bytes(self.b, "little")
        g = int.from_bytes(other.b, "little")
        return (a & ~g).bit_count()


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) in value per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return 0.0 if den == 0 else sum((t - mx) * (v - my) for t, v in points) / den * 3600


class Soak:
    def __init__(self, a: argparse.Namespace, tcp: str, http: str, pid: int) -> None:
        self.a = a
        self.tcp = tcp
        self.http = http
        self.pid = pid
        self.rng = random.Random(a.seed)
        self.ids = itertools.count()
        self.acked = Bits()
        self.got: dict[str, Bits] = {"a": Bits(), "b": Bits()}
        self._pools: dict[str, list[tuple[asyncio.Event, asyncio.Task[None]]]] = {}
        self.consumer_errors = 0
        self.received = 0
        self.publish_errors = 0
        self.churns = 0
        self.aborts = 0
        self.stop_publishing = asyncio.Event()
        self.samples: list[dict] = []

    async def producer(self, k: int) -> None:
        from nsqpy.client import Producer

        per_s = self.a.rate / self.a.producers
        seq = 0
        loop = asyncio.get_running_loop()
        async with Producer([self.tcp], timeout=10) as p:
            next_at = loop.time()
            while not self.stop_publishing.is_set():
                seq += 1
                try:
                    if seq % 10 == 0:
                        ids = [next(self.ids) for _ in range(10)]
                        next_at += 10 / per_s
                        await p.publish_many("soak", [b"%d" % n for n in ids])
                        for n in ids:
                            self.acked.add(n)
                    else:
                        n = next(self.ids)
                        next_at += 1 / per_s
                        await p.publish("soak", b"%d" % n, defer=0.1 if seq % 50 == 1 else None)
                        self.acked.add(n)
                except Exception:
                    self.publish_errors += 1
                delay = next_at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -5:
                    next_at = loop.time()  # fell behind: do not burst to catch up

    async def http_publisher(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop_publishing.is_set():
            n = next(self.ids)
            try:
                await loop.run_in_executor(None, http_json, f"http://{self.http}/pub?topic=soak", b"%d" % n)
                self.acked.add(n)
            except Exception:
                self.publish_errors += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_publishing.wait(), 1.0)

    async def consumer(self, channel: str, stop: asyncio.Event) -> None:
        from nsqpy.client import Consumer

        c = Consumer(
            "soak", channel, nsqd_tcp_addresses=[self.tcp], max_in_flight=self.rng.choice([1, 10, 200])
        )
        got = self.got.get(channel)
        abort = False
        try:
            await c.start()
            it = c.__aiter__()
            while not stop.is_set():
                try:
                    msg = await asyncio.wait_for(it.__anext__(), 0.5)
                except TimeoutError:
                    continue
                except StopAsyncIteration:
                    break
                self.received += 1
                if got is not None:
                    got.add(int(msg.body))
                msg.finish()
            abort = getattr(stop, "abort", False)
        except Exception as e:
            self.consumer_errors += 1
            print(f"consumer {channel}: {e!r}", file=sys.stderr, flush=True)
        finally:
            if abort:
                # vanish without CLS: what is in flight times out and goes to the others
                for conn in list(c.connections.values()):
                    conn.abort()
                self.aborts += 1
            await c.close(drain_timeout=5)

    async def churn(self) -> None:
        """Keep ``--consumers`` per channel running; replace a random one now and then."""
        pools: dict[str, list[tuple[asyncio.Event, asyncio.Task[None]]]] = {
            "a": [],
            "b": [],
            "e#ephemeral": [],
        }
        self._pools = pools

        def spawn(ch: str) -> None:
            ev = asyncio.Event()
            pools[ch].append((ev, asyncio.create_task(self.consumer(ch, ev))))

        for ch in ("a", "b"):
            for _ in range(self.a.consumers):
                spawn(ch)
        while not self.stop_publishing.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_publishing.wait(), self.rng.expovariate(1 / self.a.churn))
            if self.stop_publishing.is_set():
                break
            ch = self.rng.choice(["a", "b", "e#ephemeral"])
            if pools[ch] and (ch != "e#ephemeral" or self.rng.random() < 0.5):
                ev, task = pools[ch].pop(self.rng.randrange(len(pools[ch])))
                ev.abort = self.rng.random() < 0.3  # type: ignore[attr-defined]
                ev.set()
                await task
                self.churns += 1
            if ch != "e#ephemeral" or not pools[ch]:
                spawn(ch)

    async def drain(self) -> None:
        """Let the consumers finish the backlog (until both channels are empty and quiet)."""
        deadline = time.monotonic() + self.a.drain_timeout
        while time.monotonic() < deadline:
            doc = await asyncio.get_running_loop().run_in_executor(
                None, http_json, f"http://{self.http}/stats?format=json&topic=soak"
            )
            chans = {c["channel_name"]: c for t in doc.get("topics", []) for c in t["channels"]}
            busy = sum(
                chans[c]["depth"] + chans[c]["in_flight_count"] + chans[c]["deferred_count"]
                for c in ("a", "b")
                if c in chans
            )
            if busy == 0 and not any(self.acked.missing_from(self.got[c]) for c in ("a", "b")):
                return
            await asyncio.sleep(0.5)

    async def sampler(self, t0: float, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        last_recv = 0
        last_acked = 0
        last_t = loop.time()
        while True:
            now = loop.time()
            try:
                doc = await loop.run_in_executor(None, http_json, f"http://{self.http}/stats?format=json")
            except Exception as e:
                doc = {"error": str(e)}
            topics = {t["topic_name"]: t for t in doc.get("topics", [])}
            t = topics.get("soak", {})
            chans = {c["channel_name"]: c for c in t.get("channels", [])}
            dt = now - last_t
            s = {
                "t": round(now - t0, 1),
                "rss_mib": round(rss_kib(self.pid) / 1024, 1),
                "fds": fd_count(self.pid),
                "pub_per_s": round((self.acked.count - last_acked) / dt) if dt > 0.5 else 0,
                "recv_per_s": round((self.received - last_recv) / dt) if dt > 0.5 else 0,
                "clients": sum(len(c.get("clients", [])) for c in chans.values()),
                "channels": len(chans),
                "depth": sum(c.get("depth", 0) for c in chans.values()) + t.get("depth", 0),
                "in_flight": sum(c.get("in_flight_count", 0) for c in chans.values()),
                "churns": self.churns,
            }
            last_recv, last_acked, last_t = self.received, self.acked.count, now
            self.samples.append(s)
            print("  ".join(f"{k}={v}" for k, v in s.items()), flush=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.a.interval)
            if stop.is_set():
                return


async def run(a: argparse.Namespace, tcp: str, http: str, proc: subprocess.Popen) -> int:
    s = Soak(a, tcp, http, proc.pid)
    # the channels exist before the first publish, so each gets every message (a consumer's
    # start() only begins connecting)
    http_json(f"http://{http}/topic/create?topic=soak", b"")
    for ch in ("a", "b"):
        http_json(f"http://{http}/channel/create?topic=soak&channel={ch}", b"")
    t0 = asyncio.get_running_loop().time()
    stop_sampling = asyncio.Event()
    sampler = asyncio.create_task(s.sampler(t0, stop_sampling))
    churn = asyncio.create_task(s.churn())
    pubs = [asyncio.create_task(s.producer(k)) for k in range(a.producers)]
    pubs.append(asyncio.create_task(s.http_publisher()))
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(asyncio.gather(*pubs)), a.duration)
    s.stop_publishing.set()
    await asyncio.gather(*pubs, return_exceptions=True)
    await churn
    # keep one consumer per channel for the drain
    drainers = {}
    for ch in ("a", "b"):
        ev = asyncio.Event()
        drainers[ch] = (ev, asyncio.create_task(s.consumer(ch, ev)))
    await s.drain()
    stop_sampling.set()
    await sampler
    for ev, _ in [*(x for pool in s._pools.values() for x in pool), *drainers.values()]:
        ev.set()
    await asyncio.gather(
        *(t for pool in s._pools.values() for _, t in pool),
        *(t for _, t in drainers.values()),
        return_exceptions=True,
    )

    warm = [x for x in s.samples if x["t"] >= a.warmup] or s.samples
    rss_slope = slope_per_hour([(x["t"], x["rss_mib"]) for x in warm])
    fd_slope = slope_per_hour([(x["t"], x["fds"]) for x in warm])
    lost = {ch: s.acked.missing_from(s.got[ch]) for ch in ("a", "b")}
    alive = proc.poll() is None
    summary = {
        "duration_s": a.duration,
        "samples": len(s.samples),
        "rss_mib_start": warm[0]["rss_mib"],
        "rss_mib_end": warm[-1]["rss_mib"],
        "rss_mib_min": min(x["rss_mib"] for x in warm),
        "rss_mib_max": max(x["rss_mib"] for x in warm),
        "rss_slope_mib_per_h": round(rss_slope, 2),
        "fds_start": warm[0]["fds"],
        "fds_end": warm[-1]["fds"],
        "fds_min": min(x["fds"] for x in warm),
        "fds_max": max(x["fds"] for x in warm),
        "fd_slope_per_h": round(fd_slope, 2),
        "published_acked": s.acked.count,
        "publish_errors": s.publish_errors,
        "received": s.received,
        "churns": s.churns,
        "aborted_consumers": s.aborts,
        "consumer_errors": s.consumer_errors,
        "lost": lost,
        "nsqd_alive": alive,
    }
    print(json.dumps(summary, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": summary, "samples": s.samples}, indent=1))
    bad = not alive or any(lost.values()) or abs(rss_slope) > a.max_rss_slope
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of load (1800)")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples (10)")
    ap.add_argument("--warmup", type=float, default=120.0, help="samples before this are not fitted (120)")
    ap.add_argument("--rate", type=float, default=2000.0, help="messages/s published in all (2000)")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=3, help="per channel (3)")
    ap.add_argument("--churn", type=float, default=5.0, help="mean seconds between consumer swaps (5)")
    ap.add_argument("--drain-timeout", type=float, default=120.0)
    ap.add_argument("--max-rss-slope", type=float, default=20.0, help="MiB/hour allowed after warm-up (20)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="", help="write the samples and summary to this file")
    ap.add_argument("nsqd_args", nargs="*", help="extra nsqd flags (after --)")
    a = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="nsqpy-soak-"))
    proc, tcp, http = start_nsqd(data, ["--msg-timeout=5s", *a.nsqd_args])
    print(f"nsqd pid {proc.pid} tcp {tcp} http {http} data {data}", flush=True)
    try:
        code = asyncio.run(run(a, tcp, http, proc))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(data, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
