#!/usr/bin/env python3
"""bench_idle: what many idle consumer connections cost nsqd, and whether the others notice.

Starts an nsqd (the venv's, or --nsqd-bin) with the open-file limit raised (``ulimit -n``:
the soft limit goes up to the hard one, for this script, the daemon and the holder), then:

1. idle RSS of the fresh daemon (nothing connected: the start-up is awaited in its log), then
   after a first TCP connection and after a first HTTP request (our nsqd loads its TCP
   protocol and its HTTP server with them);
2. --conns consumer connections, each ``IDENTIFY``, ``SUB idle <channel>``, ``RDY 1``, held
   by a child process that answers heartbeats; --channels spreads them over channels;
3. RSS with them (growth per connection: measured before any message flowed, so memory a
   throughput run freed does not hide it), the daemon's CPU while they sit idle;
4. a throughput run with them held (bench_writer and bench_reader at the same time on topic
   ``busy``, as ``run.py --mode concurrent``), then, once they closed, one without them.

Stdlib only, raw TCP protocol V2 (like the other tools), so it can load the Go nsqd too.

    .venv/bin/python bench/bench_idle.py --conns 10000
    .venv/bin/python bench/bench_idle.py --conns 10000 --nsqd-bin /path/to/go/nsqd --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import selectors
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nsqbench as nb  # noqa: E402
from run import Daemon, default_nsqd_bin, finish_tool, http_ping, proc_cpu_seconds, start_tool  # noqa: E402

TOOL = "bench_idle"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def raise_nofile(want: int) -> int:
    """ulimit -n: the soft limit up to what is wanted (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(max(soft, want), hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def holder(addr: str, conns: int, channels: int, ready, stop) -> None:
    """Open and subscribe the idle consumers, then answer heartbeats until told to stop."""
    host, port = nb.parse_addr(addr)
    socks: list[socket.socket] = []
    try:
        identify = nb.identify_cmd(nb.client_fields("idle"))
        for i in range(conns):
            s = socket.create_connection((host, port), timeout=30)
            s.sendall(nb.MAGIC_V2 + identify + f"SUB idle ch{i % channels}\n".encode() + b"RDY 1\n")
            socks.append(s)
            # one at a time: on this VM's loopback, connecting while earlier connections'
            # answers are unread takes ~7 ms a connect (whichever nsqd)
            _expect_oks([s])
    except Exception as exc:
        ready.send(f"{type(exc).__name__} after {len(socks)} connections: {exc}")
        return
    ready.send(None)
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    heartbeats = 0
    while not stop.is_set():
        for key, _ in sel.select(0.2):
            s = key.fileobj
            try:
                data = s.recv(65536)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            if nb.HEARTBEAT in data:
                s.sendall(b"NOP\n")  # type: ignore[union-attr]
                heartbeats += 1
    for s in socks:
        s.close()


def _expect_oks(socks: list[socket.socket]) -> None:
    """Each connection answered IDENTIFY and SUB with two OK responses."""
    for s in socks:
        got = b""
        while got.count(b"OK") < 2:
            chunk = s.recv(4096)
            if not chunk:
                raise nb.ProtocolError("connection closed by nsqd")
            if b"E_" in chunk:
                raise nb.ProtocolError(chunk.decode(errors="replace"))
            got += chunk


def throughput(tcp: str, runfor: float, topic: str, writer_procs: int) -> dict:
    common = [f"--nsqd-tcp-address={tcp}", f"--topic={topic}", f"--runfor={runfor}"]
    reader = start_tool("bench_reader", [*common, "--channel=ch"])
    writer = start_tool("bench_writer", [*common, f"--procs={writer_procs}"])
    _, w = finish_tool("bench_writer", writer, runfor + 120)
    _, r = finish_tool("bench_reader", reader, runfor + 120)
    return {"pub": w.get("ops_per_s", 0.0), "sub": r.get("ops_per_s", 0.0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/bench_idle.py", description=__doc__.splitlines()[0])
    p.add_argument("--nsqd-bin", default=None)
    p.add_argument("--conns", type=int, default=10000)
    p.add_argument("--channels", type=int, default=1, help="spread the idle consumers over N channels")
    p.add_argument(
        "--idle-for",
        type=nb.parse_duration,
        default=5.0,
        help="measure the daemon's CPU over this long with the connections idle",
    )
    p.add_argument("--runfor", type=nb.parse_duration, default=5.0, help="each throughput run")
    p.add_argument("--writer-procs", type=int, default=1)
    p.add_argument("--mem-queue-size", type=int, default=10000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(nb.go_flags(argv))
    limit = raise_nofile(args.conns + 1000)
    if limit < args.conns + 100:
        print(
            f"{TOOL}: the open-file limit is {limit}: too low for {args.conns} connections", file=sys.stderr
        )
        return 2
    args.nsqd_bin = args.nsqd_bin or default_nsqd_bin()
    args.startup_timeout, args.stop_timeout, args.data_path = 20.0, 30.0, None
    args.nsqd_arg = []
    workdir = Path(tempfile.mkdtemp(prefix="nsqidle-"))
    daemon = Daemon(args, workdir)
    # no probing connection: our nsqd loads its TCP protocol with the first connection and
    # its HTTP server with the first HTTP request
    daemon.probe_http = daemon.probe_tcp = False
    daemon.start()
    assert daemon.pid is not None
    out: dict = {"conns": args.conns, "channels": args.channels, "nsqd": args.nsqd_bin, "nofile": limit}
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    ready_r, ready_w = ctx.Pipe(duplex=False)
    proc = None
    try:
        time.sleep(1.0)
        out["rss_idle_mib"] = rss_mib(daemon.pid)
        with socket.create_connection(nb.parse_addr(daemon.tcp), timeout=10) as s:
            s.sendall(nb.MAGIC_V2 + b"NOP\n")
        time.sleep(0.5)
        out["rss_first_conn_mib"] = rss_mib(daemon.pid)
        if not http_ping(*nb.parse_addr(daemon.http), timeout=30):
            raise RuntimeError("GET /ping failed")
        time.sleep(0.5)
        out["rss_first_http_mib"] = rss_before = rss_mib(daemon.pid)
        t0 = time.monotonic()
        proc = ctx.Process(target=holder, args=(daemon.tcp, args.conns, args.channels, ready_w, stop))
        proc.start()
        if not ready_r.poll(600):
            raise RuntimeError("the idle connections did not come up within 600s")
        err = ready_r.recv()
        if err:
            raise RuntimeError(err)
        out["connect_s"] = time.monotonic() - t0
        time.sleep(1.0)
        rss_held = rss_mib(daemon.pid)
        out["rss_before_conns_mib"] = rss_before
        out["rss_with_conns_mib"] = rss_held
        out["kib_per_conn"] = (rss_held - rss_before) * 1024 / args.conns
        cpu0 = proc_cpu_seconds(daemon.pid)
        time.sleep(args.idle_for)
        cpu1 = proc_cpu_seconds(daemon.pid)
        out["idle_cpu"] = (cpu1 - cpu0) / args.idle_for if cpu0 is not None and cpu1 is not None else None
        out["with_conns"] = throughput(daemon.tcp, args.runfor, "busy", args.writer_procs)
        out["rss_after_mib"] = rss_mib(daemon.pid)
        stop.set()
        proc.join(60)
        time.sleep(1.0)
        out["before"] = throughput(daemon.tcp, args.runfor, "busy", args.writer_procs)
    finally:
        stop.set()
        if proc is not None:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    b, w = out["before"], out["with_conns"]
    print(f"== {TOOL}: {args.conns} idle consumers on {args.channels} channel(s), nsqd {args.nsqd_bin}")
    print(
        f"   idle RSS {out['rss_idle_mib']:.1f} MiB; after a first TCP connection "
        f"{out['rss_first_conn_mib']:.1f} MiB, after a first HTTP request "
        f"{out['rss_first_http_mib']:.1f} MiB"
    )
    print(
        f"   before the connections {rss_before:.1f} MiB, "
        f"with them {out['rss_with_conns_mib']:.1f} MiB: {out['kib_per_conn']:.1f} KiB per connection "
        f"(connected in {out['connect_s']:.1f}s)"
    )
    if out["idle_cpu"] is not None:
        print(f"   nsqd CPU with them idle: {out['idle_cpu'] * 100:.1f}%")
    print(
        f"   concurrent PUB/SUB with them: {w['pub']:.0f} / {w['sub']:.0f} msgs/s; without them "
        f"(after they closed): {b['pub']:.0f} / {b['sub']:.0f} msgs/s"
    )
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
