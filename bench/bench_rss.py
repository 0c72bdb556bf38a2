#!/usr/bin/env python3
"""bench_rss: an nsqd's memory in real use (issue 31).

Every real nsqd is pinged, scraped and used. This starts a daemon (ours or Go's, given by
path) on free loopback ports with a temp ``--data-path`` and reads its VmRSS (from
``/proc/PID/status``) after each stage:

1. ``start``: the listeners are up (their log lines), nothing has connected yet
2. ``ping``: ``GET /ping``
3. ``stats``: ``GET /stats?format=json``
4. ``metrics``: ``GET /metrics`` (the Go nsqd has none: it answers 404, measured all the same)
5. ``clients``: one producer (IDENTIFY, ``PUB``) and one consumer (IDENTIFY, ``SUB``,
   ``RDY 1``, the message received and ``FIN``ed), both left connected
6. ``idle``: 5 s later (``--idle``), the two clients still connected

and the peak (VmHWM) at the end. ``--daemon LABEL=PATH`` (repeatable; ``PATH`` may be a
command line with arguments or a ``VAR=value`` prefix) starts each in turn, ``--rounds``
times alternating (A B A B …); the table shows each stage's median over the rounds (and
min–max with more than one). Stdlib only, raw TCP protocol V2 and ``http.client``.

A Python daemon compiles whatever module has no up-to-date ``.pyc`` (an installed one has
them all), which costs memory that real use does not pay: each daemon first goes through
the stages once unmeasured (``--warmup``), with ``PYTHONDONTWRITEBYTECODE`` dropped from its
environment so that run leaves the bytecode behind.

    .venv/bin/python bench/bench_rss.py
    .venv/bin/python bench/bench_rss.py --daemon ours=.venv/bin/nsqd \\
        --daemon go=/tmp/gonsq/bin/nsqd --rounds 3 --json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("start", "ping", "stats", "metrics", "clients", "idle")
_I32 = struct.Struct(">i")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def split_command(spec: str) -> tuple[dict[str, str], list[str]]:
    """``"A=1 B=2 /path/nsqd --flag"`` → ({"A": "1", "B": "2"}, ["/path/nsqd", "--flag"])."""
    words = shlex.split(spec)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith(("/", ".")):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not words:
        raise ValueError(f"no command in {spec!r}")
    return env, words


def http_get(port: int, path: str, timeout: float) -> tuple[int, int]:
    """One request on a fresh connection (as curl or a scraper): (status, body length)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, len(resp.read())
    finally:
        conn.close()


class Frames:
    """Blocking reader of NSQ V2 frames: (type, data)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def read(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 8:
                size, ftype = struct.unpack_from(">Ii", self.buf)
                if len(self.buf) >= 4 + size:
                    data = bytes(self.buf[8 : 4 + size])
                    del self.buf[: 4 + size]
                    if ftype == 0 and data == b"_heartbeat_":
                        self.sock.sendall(b"NOP\n")
                        continue
                    return ftype, data
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed by nsqd")
            self.buf += chunk

    def ok(self, what: str) -> None:
        ftype, data = self.read()
        if ftype != 0 or data != b"OK":
            raise RuntimeError(f"{what}: frame type {ftype} {data[:200]!r}")


def connect(port: int, name: str, timeout: float) -> tuple[socket.socket, Frames]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    frames = Frames(sock)
    body = json.dumps({"client_id": name, "hostname": "bench_rss", "user_agent": "bench_rss/0.1"}).encode()
    sock.sendall(b"  V2IDENTIFY\n" + _I32.pack(len(body)) + body)
    frames.ok("IDENTIFY")
    return sock, frames


def clients(port: int, timeout: float) -> list[socket.socket]:
    """A producer and a consumer, as an application has them: left connected."""
    prod, pframes = connect(port, "producer", timeout)
    body = b"hello from bench_rss"
    prod.sendall(b"PUB rss\n" + _I32.pack(len(body)) + body)
    pframes.ok("PUB")
    cons, cframes = connect(port, "consumer", timeout)
    cons.sendall(b"SUB rss ch\n")
    cframes.ok("SUB")
    cons.sendall(b"RDY 1\n")
    ftype, data = cframes.read()
    if ftype != 2 or not data.endswith(body):
        raise RuntimeError(f"consumer: expected the message, got frame type {ftype} {data[:200]!r}")
    cons.sendall(b"FIN " + data[10:26] + b"\n")
    # FIN has no answer: a PUB's OK on the producer after it shows nsqd got this far
    prod.sendall(b"PUB rss\n" + _I32.pack(len(body)) + body)
    pframes.ok("PUB")
    return [prod, cons]


def wait_for_log(proc: subprocess.Popen[bytes], log: Path, lines: tuple[str, ...], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        if all(line in text for line in lines):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"nsqd exited during start-up with code {proc.returncode}:\n{text[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nsqd did not log {lines} within {timeout}s:\n{text[-2000:]}")
        time.sleep(0.02)


def one_run(spec: str, args: argparse.Namespace) -> dict[str, float]:
    """Start the daemon, go through the stages, stop it: MiB at each stage and the peak."""
    env, cmd = split_command(spec)
    tcp, http = free_port(), free_port()
    rss: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench_rss-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        log_path = Path(tmp) / "nsqd.log"
        cmd += [
            f"--tcp-address=127.0.0.1:{tcp}",
            f"--http-address=127.0.0.1:{http}",
            f"--data-path={data}",
        ]
        with open(log_path, "wb") as log:
            base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            proc = subprocess.Popen(
                cmd,
                env={**base, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        socks: list[socket.socket] = []
        try:
            wait_for_log(proc, log_path, ("TCP: listening on", "HTTP: listening on"), args.timeout)
            time.sleep(args.settle)

            def mark(stage: str) -> None:
                time.sleep(args.settle)
                rss[stage] = proc_status_kib(proc.pid, "VmRSS") / 1024

            mark("start")
            for stage, path in (("ping", "/ping"), ("stats", "/stats?format=json"), ("metrics", "/metrics")):
                status, _ = http_get(http, path, args.timeout)
                if stage != "metrics" and status != 200:
                    raise RuntimeError(f"GET {path}: {status}")
                mark(stage)
            socks = clients(tcp, args.timeout)
            mark("clients")
            time.sleep(args.idle)
            mark("idle")
            rss["peak"] = proc_status_kib(proc.pid, "VmHWM") / 1024
        finally:
            for s in socks:
                s.close()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return rss


def default_nsqd() -> str:
    return shutil.which("nsqd", path=os.path.dirname(sys.executable)) or "nsqd"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/bench_rss.py", description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--daemon",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a daemon to measure (repeatable; default: ours=the venv's nsqd)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="runs of each daemon, alternating")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds idle with the clients connected")
    ap.add_argument("--settle", type=float, default=0.2, help="seconds before each reading")
    ap.add_argument("--timeout", type=float, default=20.0, help="start-up, request and stop timeout")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each daemon first")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line too")
    args = ap.parse_args(argv)
    daemons = [d.partition("=")[::2] for d in (args.daemon or ["ours=" + default_nsqd()])]
    for label, spec in daemons:
        if not label or not spec:
            ap.error(f"--daemon wants LABEL=PATH, got {label}={spec}")
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _ in daemons}
    for _ in range(args.warmup):
        for _label, spec in daemons:
            one_run(spec, argparse.Namespace(**{**vars(args), "idle": 0.0, "settle": 0.0}))
    for r in range(args.rounds):
        for label, spec in daemons:
            rss = one_run(spec, args)
            runs[label].append(rss)
            line = " ".join(f"{k}={v:.1f}" for k, v in rss.items())
            print(f"# round {r + 1} {label}: {line} MiB", file=sys.stderr, flush=True)
    cols = [*STAGES, "peak"]
    width = max(8, *(len(label) for label, _ in daemons))
    print(f"{'VmRSS MiB':<{width}} " + " ".join(f"{c:>11}" for c in cols))
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for label, _ in daemons:
        cells, summary[label] = [], {}
        for c in cols:
            vals = [run[c] for run in runs[label]]
            med = statistics.median(vals)
            summary[label][c] = {"median": med, "min": min(vals), "max": max(vals)}
            cell = f"{med:.1f}" if len(vals) == 1 else f"{med:.1f}({max(vals) - min(vals):.1f})"
            cells.append(f"{cell:>11}")
        print(f"{label:<{width}} " + " ".join(cells))
    if args.rounds > 1:
        print("(median over the rounds; the spread max-min in brackets)")
    if args.json:
        print(json.dumps({"stages": cols, "rounds": args.rounds, "idle_s": args.idle, "rss_mib": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
