#!/usr/bin/env python3
"""bench_peek: how fast nsqd answers GET /channel/peek and /topic/peek on a deep disk queue.

Starts our nsqd (the console script, or --nsqd-bin) on free ports with --mem-queue-size=0
and a --data-path on disk, so every message sits in a DiskQueue. It makes topic
``peek_bench`` with channel ``ch`` and topic ``peek_bench_backlog`` with no channel, fills
each with --count messages of --size bytes (MPUB batches over raw TCP, --pipeline MPUBs
outstanding; each body starts with its sequence number), waits until the channel holds them
all, then times --requests GETs of each of:

* ``/channel/peek?topic=peek_bench&channel=ch&n=10`` and ``n=1000``
* ``/topic/peek?topic=peek_bench_backlog&n=10`` and ``n=1000`` (a topic's channel-less backlog)

on one keep-alive connection (time from sending the request to the last byte of the
answer), and prints first/min/median/p95/max in ms, the answer's size and nsqd's CPU per
request. Every answer must hold the first n messages in order, and the depths (channel:
depth, in flight, deferred; topic: depth) must be the same before and after: a peek changes
nothing. Exits non-zero otherwise. The issue's target: n=10 on 1,000,000 messages under 50 ms.

    .venv/bin/python bench/bench_peek.py                      # 1,000,000 messages per queue
    .venv/bin/python bench/bench_peek.py --count 100000 --requests 20 --json
    .venv/bin/python bench/bench_peek.py --smoke              # a few seconds, for CI

Standard library only on the client side (raw protocol V2 and http.client), as the other
tools; nsqd is started with run.py's Daemon class.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nsqbench as nb  # noqa: E402
from run import Daemon, default_nsqd_bin, http_post, proc_cpu_seconds  # noqa: E402

TOOL = "bench_peek"
TOPIC = "peek_bench"
CHANNEL = "ch"
BACKLOG = "peek_bench_backlog"
TARGET_MS = 50.0
SEQ_DIGITS = 10


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    d = p.add_argument_group("daemon")
    d.add_argument("--nsqd-bin", default=None, help="nsqd executable (default: the venv's nsqd)")
    d.add_argument(
        "--data-path", default=None, help="nsqd --data-path (default: a temp dir on disk, removed after)"
    )
    d.add_argument(
        "--nsqd-arg", action="append", default=[], metavar="ARG", help="extra argument for nsqd (repeatable)"
    )
    d.add_argument("--startup-timeout", type=nb.parse_duration, default=20.0)
    d.add_argument("--stop-timeout", type=nb.parse_duration, default=60.0)
    w = p.add_argument_group("load")
    w.add_argument(
        "--count", type=int, default=None, help="messages in each queue (1,000,000; --smoke: 2000)"
    )
    w.add_argument("--size", type=int, default=100, help="message body size (bytes)")
    w.add_argument("--batch-size", type=int, default=200, help="messages per MPUB")
    w.add_argument("--pipeline", type=int, default=8, help="MPUBs outstanding while filling")
    w.add_argument("--requests", type=int, default=50, help="GETs timed per endpoint and n")
    w.add_argument(
        "--cold-requests",
        type=int,
        default=5,
        help="GETs timed per endpoint and n right after evicting the queues' files from the page "
        "cache (posix_fadvise DONTNEED; 0: none)",
    )
    w.add_argument(
        "--fill-timeout",
        type=nb.parse_duration,
        default=600.0,
        help="fail when the channel does not hold every message by then",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny fast run (for CI): --count 2000 unless given, 5 requests, 2 cold ones",
    )
    p.add_argument("--json", action="store_true", help="also print one JSON summary line")
    args = p.parse_args(nb.go_flags(argv))
    if args.count is None:
        args.count = 2000 if args.smoke else 1_000_000
    if args.smoke:
        args.requests = min(args.requests, 5)
        args.cold_requests = min(args.cold_requests, 2)
    if args.count < 1 or args.batch_size < 1 or args.pipeline < 1 or args.requests < 1:
        p.error("--count, --batch-size, --pipeline and --requests must be >= 1")
    if args.cold_requests < 0:
        p.error("--cold-requests must be >= 0")
    if args.size < SEQ_DIGITS:
        p.error(f"--size must be >= {SEQ_DIGITS} (each body starts with its sequence number)")
    args.mem_queue_size = 0  # every message through the DiskQueue: what is measured
    return args


# ------------------------------------------------------------------------- filling


def body(i: int, size: int) -> bytes:
    return b"%0*d" % (SEQ_DIGITS, i) + b"x" * (size - SEQ_DIGITS)


def fill(tcp: str, topic: str, count: int, size: int, batch_size: int, pipeline: int) -> float:
    """MPUB ``count`` numbered bodies to ``topic``, ``pipeline`` MPUBs outstanding; seconds."""
    sock = nb.connect(tcp, timeout=60.0)
    reader = nb.FrameReader(sock)
    t0 = time.monotonic()
    try:
        nb.handshake_identify(sock, reader, nb.client_fields(TOOL))
        outstanding = 0
        for start in range(0, count, batch_size):
            bodies = [body(i, size) for i in range(start, min(start + batch_size, count))]
            sock.sendall(nb.mpub_cmd(topic, bodies))
            outstanding += 1
            if outstanding >= pipeline:
                reader.expect_ok(f"MPUB {topic}")
                outstanding -= 1
        for _ in range(outstanding):
            reader.expect_ok(f"MPUB {topic}")
    finally:
        sock.close()
    return time.monotonic() - t0


# ------------------------------------------------------------------------- nsqd's HTTP API


class HTTP:
    """One keep-alive connection to nsqd's HTTP API."""

    def __init__(self, addr: str) -> None:
        host, port = nb.parse_addr(addr)
        self.conn = http.client.HTTPConnection(host, port, timeout=60.0)

    def get(self, path: str) -> tuple[int, bytes, int]:
        """(status, body, ns from sending the request to the answer's last byte)."""
        t0 = time.perf_counter_ns()
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, data, time.perf_counter_ns() - t0

    def json(self, path: str) -> Any:
        status, data, _ = self.get(path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {data[:200]!r}")
        return json.loads(data)

    def close(self) -> None:
        self.conn.close()


def depths(api: HTTP) -> dict[str, int]:
    """The numbers a peek must not change: the channel's depth, in flight and deferred, and
    each topic's depth."""
    doc = api.json("/stats?format=json")
    out: dict[str, int] = {}
    for t in doc.get("topics") or []:
        if t["topic_name"] not in (TOPIC, BACKLOG):
            continue
        out[f"{t['topic_name']} depth"] = t["depth"]
        for c in t.get("channels") or []:
            if c["channel_name"] == CHANNEL:
                for k in ("depth", "in_flight_count", "deferred_count"):
                    out[f"{t['topic_name']}/{CHANNEL} {k}"] = c[k]
    return out


def wait_for_channel(api: HTTP, count: int, timeout: float) -> float:
    """Wait until the channel holds ``count`` (the topic's pump moves them); seconds."""
    t0 = time.monotonic()
    while True:
        d = depths(api)
        if d.get(f"{TOPIC}/{CHANNEL} depth") == count and d.get(f"{TOPIC} depth") == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"the channel does not hold {count} messages after {timeout:.0f}s: {d}")
        time.sleep(0.2)


def nearest_rank(sorted_values: list[float], q: float) -> float:
    k = max(1, -(-len(sorted_values) * q // 1))  # ceil(len * q), at least 1
    return sorted_values[int(k) - 1]


def evict(path: Path) -> None:
    """Drop the files under ``path`` from the page cache (written back first): the next read
    of them goes to the disk. Only these files, and no root needed (posix_fadvise)."""
    for root, _, files in os.walk(path):
        for f in files:
            try:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


def measure(
    api: HTTP,
    path: str,
    n: int,
    count: int,
    requests: int,
    pid: int | None,
    failures: list[str],
    cold: Path | None = None,
) -> dict[str, Any] | None:
    """Time ``requests`` GETs of ``path`` (with ``cold``, each right after the files under it
    left the page cache); check that the answers hold messages 0..n-1 and the depth."""
    want = [b"%0*d" % (SEQ_DIGITS, i) for i in range(min(n, count))]
    times: list[float] = []
    size = 0
    cpu0 = proc_cpu_seconds(pid) if pid and cold is None else None
    for k in range(requests):
        if cold is not None:
            evict(cold)
        status, data, ns = api.get(path)
        if status != 200:
            failures.append(f"GET {path}: {status} {data[:200]!r}")
            break
        times.append(ns / 1e6)
        size = len(data)
        if k == 0 or k == requests - 1:  # parsing is not timed; first and last are checked
            doc = json.loads(data)
            got = [base64.b64decode(m["body_base64"])[:SEQ_DIGITS] for m in doc["messages"]]
            if got != want:
                failures.append(f"GET {path}: messages {got[:3]}… not the first {n} in order")
                break
            if doc["depth"] != count:
                failures.append(f"GET {path}: depth {doc['depth']}, not {count}")
    cpu1 = proc_cpu_seconds(pid) if cpu0 is not None and pid else None
    if not times:
        return None
    s = sorted(times)
    return {
        "endpoint": path.split("?")[0],
        "n": n,
        "cache": "warm" if cold is None else "cold",
        "requests": len(times),
        "first_ms": times[0],
        "min_ms": s[0],
        "median_ms": statistics.median(s),
        "p95_ms": nearest_rank(s, 0.95),
        "max_ms": s[-1],
        "bytes": size,
        "nsqd_cpu_ms": (cpu1 - cpu0) * 1000 / len(times) if cpu0 is not None and cpu1 is not None else None,
    }


def du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


# ------------------------------------------------------------------------- driver


def bench(args: argparse.Namespace, daemon: Daemon, failures: list[str]) -> tuple[list[dict[str, Any]], dict]:
    tcp, http_addr, pid = daemon.tcp, daemon.http, daemon.pid
    for path in (
        f"/topic/create?topic={TOPIC}",
        f"/channel/create?topic={TOPIC}&channel={CHANNEL}",
        f"/topic/create?topic={BACKLOG}",
    ):
        status, data = http_post(http_addr, path)
        if status != 200:
            raise RuntimeError(f"POST {path}: {status} {data!r}")
    info: dict[str, Any] = {}
    api = HTTP(http_addr)
    try:
        for topic in (TOPIC, BACKLOG):
            secs = fill(tcp, topic, args.count, args.size, args.batch_size, args.pipeline)
            info[f"fill_{topic}_s"] = secs
            print(f"# filled {topic}: {args.count} x {args.size} B in {secs:.1f}s", flush=True)
        info["channel_wait_s"] = wait_for_channel(api, args.count, args.fill_timeout)
        info["data_bytes"] = du(daemon.data)
        print(
            f"# channel {TOPIC}/{CHANNEL} holds {args.count} (waited {info['channel_wait_s']:.1f}s); "
            f"data path {daemon.data}: {info['data_bytes'] / 2**20:.0f} MiB",
            flush=True,
        )
        before = depths(api)
        q = [{"topic": TOPIC, "channel": CHANNEL, "n": n} for n in (10, 1000)]
        paths = [(f"/channel/peek?{urlencode(p)}", p["n"]) for p in q]
        paths += [(f"/topic/peek?{urlencode({'topic': BACKLOG, 'n': n})}", n) for n in (10, 1000)]
        measured = [measure(api, path, n, args.count, args.requests, pid, failures) for path, n in paths]
        if args.cold_requests:
            measured += [
                measure(api, path, n, args.count, args.cold_requests, pid, failures, cold=daemon.data)
                for path, n in paths
            ]
        rows = [r for r in measured if r is not None]
        after = depths(api)
        info["depths_before"], info["depths_after"] = before, after
        if before != after:
            failures.append(f"depths changed by peeking: before {before}, after {after}")
        expected = {
            f"{TOPIC} depth": 0,
            f"{TOPIC}/{CHANNEL} depth": args.count,
            f"{TOPIC}/{CHANNEL} in_flight_count": 0,
            f"{TOPIC}/{CHANNEL} deferred_count": 0,
            f"{BACKLOG} depth": args.count,
        }
        if after != expected:
            failures.append(f"depths after: {after}, expected {expected}")
    finally:
        api.close()
    return rows, info


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def print_summary(
    args: argparse.Namespace, target: str, rows: list[dict[str, Any]], info: dict, failures: list[str]
) -> None:
    print()
    print(f"== nsqpy peek bench: {target}")
    print(
        f"   {args.count} messages x {args.size} B per queue, --mem-queue-size=0 (disk), "
        f"{args.requests} requests each, one keep-alive connection{' (smoke)' if args.smoke else ''}"
    )
    head = (
        f"{'endpoint':<14} {'n':>5} {'cache':>5} {'first':>8} {'min':>8} {'median':>8} {'p95':>8} {'max':>8}"
    )
    print(head + f" {'bytes':>8} {'nsqd cpu':>9}")
    print(f"{'':<14} {'':>5} {'':>5} {'ms':>8} {'ms':>8} {'ms':>8} {'ms':>8} {'ms':>8} {'':>8} {'ms/req':>9}")
    for r in rows:
        print(
            f"{r['endpoint']:<14} {r['n']:>5} {r['cache']:>5} {fmt(r['first_ms']):>8} {fmt(r['min_ms']):>8} "
            f"{fmt(r['median_ms']):>8} {fmt(r['p95_ms']):>8} {fmt(r['max_ms']):>8} {r['bytes']:>8} "
            f"{fmt(r['nsqd_cpu_ms']):>9}"
        )
    if "depths_after" in info:
        same = "unchanged" if info["depths_before"] == info["depths_after"] else "CHANGED"
        print(f"depths before and after: {same} {info['depths_after']}")
    for r in rows:
        if r["endpoint"] == "/channel/peek" and r["n"] == 10:
            verdict = "met" if r["max_ms"] < TARGET_MS else "MISSED"
            print(
                f"target: /channel/peek n=10 on {args.count} disk messages under {TARGET_MS:.0f} ms "
                f"({r['cache']} cache): {verdict} (max {r['max_ms']:.2f} ms of {r['requests']})"
            )
    for f in failures:
        print(f"FAILED: {f}")
    print("RESULT: " + ("FAIL" if failures else "OK"), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_args(argv)
    failures: list[str] = []
    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    workdir = Path(tempfile.mkdtemp(prefix="nsqpeekbench-"))
    args.nsqd_bin = args.nsqd_bin or default_nsqd_bin()
    if not args.nsqd_bin:
        print("FAILED: no nsqd found (use --nsqd-bin)", file=sys.stderr)
        return 2
    daemon = Daemon(args, workdir)
    target = args.nsqd_bin
    try:
        daemon.start()
        print(f"# nsqd pid {daemon.pid} tcp {daemon.tcp} http {daemon.http} data {daemon.data}", flush=True)
        rows, info = bench(args, daemon, failures)
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        if not daemon.stop():
            failures.append(f"nsqd shutdown: {daemon.exit_note}")
            print(daemon.log_tail(), file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    print_summary(args, target, rows, info, failures)
    if args.json:
        print(
            json.dumps(
                {"tool": TOOL, "target": target, "count": args.count, "rows": rows, "failures": failures}
                | {k: v for k, v in info.items() if not k.startswith("depths")}
            )
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
