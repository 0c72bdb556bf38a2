#!/usr/bin/env python3
"""bench_client: throughput of OUR client library (nsqpy.client) through an nsqd.

Two phases on one topic, as a user of the library would write them:

* PUB: ``Producer.publish_many`` (MPUB, --batch-size × --size bytes) from --pipeline
  concurrent tasks, for --runfor or until --count messages; this also fills the topic.
* SUB: a ``Consumer`` (--max-in-flight) reads back everything published, FINing each
  message (``async for msg in consumer: msg.finish()``, or ``Consumer.run(handler)`` with
  --style run); stops when every message was read.

The client runs in this process (on uvloop when installed); nsqd is a separate process,
started on free ports with a temp --data-path (as run.py does) unless --nsqd-tcp-address
is given. Unlike the other tools this one imports nsqpy: it measures the library, not nsqd.
Exits non-zero on errors, or if the consumer read back fewer or more messages than written.

--tls, --snappy, --deflate (--deflate-level) make both phases' connections upgrade through
the library's ConnectionConfig (tls_v1, snappy, deflate…): with --tls the started nsqd gets
a throwaway CA-signed certificate (bench/certs.py) that the client verifies. The run fails
if nsqd did not agree to what was asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nsqbench as nb  # noqa: E402
from run import Daemon, default_nsqd_bin, proc_cpu_seconds  # noqa: E402

from nsqpy.client import Connection, ConnectionConfig, Consumer, Message, Producer  # noqa: E402

TOOL = "bench_client"


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    d = p.add_argument_group("daemon")
    d.add_argument(
        "--nsqd-tcp-address", default="", help="use a running nsqd (default: start one on free ports)"
    )
    d.add_argument(
        "--nsqd-http-address",
        default="",
        help="with --nsqd-tcp-address: its HTTP address, to check the channel after",
    )
    d.add_argument("--nsqd-bin", default=None, help="nsqd executable (default: the venv's nsqd)")
    d.add_argument(
        "--mem-queue-size",
        type=int,
        default=1_000_000,
        help="nsqd --mem-queue-size when started here (big: messages stay in memory)",
    )
    d.add_argument(
        "--disk", action="store_true", help="--mem-queue-size=0: every message goes through the disk queue"
    )
    d.add_argument("--data-path", default=None, help="nsqd --data-path (default: a temp dir)")
    d.add_argument(
        "--nsqd-arg", action="append", default=[], metavar="ARG", help="extra argument for nsqd (repeatable)"
    )
    d.add_argument("--startup-timeout", type=nb.parse_duration, default=20.0)
    d.add_argument("--stop-timeout", type=nb.parse_duration, default=30.0)
    w = p.add_argument_group("load")
    w.add_argument("--topic", default="client_bench")
    w.add_argument("--channel", default="ch")
    w.add_argument(
        "--runfor",
        type=nb.parse_duration,
        default=10.0,
        help="publish for this long (the consumer then reads everything back)",
    )
    w.add_argument(
        "--count",
        type=int,
        default=0,
        help="publish this many messages instead (rounded up to whole batches)",
    )
    w.add_argument("--size", type=int, default=100, help="message body size (bytes)")
    w.add_argument("--batch-size", type=int, default=200, help="messages per MPUB")
    w.add_argument(
        "--pipeline",
        type=int,
        default=4,
        help="concurrent publishing tasks (MPUBs in flight on the connection)",
    )
    w.add_argument("--max-in-flight", type=int, default=2500, help="consumer max_in_flight")
    w.add_argument(
        "--style",
        choices=("iter", "run"),
        default="iter",
        help="consume with `async for` (iter) or Consumer.run(handler) (run)",
    )
    w.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="with --style run: handler concurrency (0: the library's default)",
    )
    w.add_argument("--reader-runfor", type=nb.parse_duration, default=120.0, help="cap on the consume phase")
    w.add_argument(
        "--idle-timeout",
        type=nb.parse_duration,
        default=5.0,
        help="fail the consume phase after this long without a message",
    )
    nb.add_upgrade_args(p)
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    p.add_argument("--smoke", action="store_true", help="tiny fast run (for CI)")
    p.add_argument("--json", action="store_true", help="also print one JSON summary line")
    args = p.parse_args(nb.go_flags(argv))
    nb.check_upgrade_args(p, args)
    if args.size < 1 or args.batch_size < 1 or args.pipeline < 1 or args.max_in_flight < 1:
        p.error("--size, --batch-size, --pipeline and --max-in-flight must be >= 1")
    if args.disk:
        args.mem_queue_size = 0
    if args.smoke:
        args.runfor = min(args.runfor, 1.0)
        args.count = args.count or 20_000
        args.reader_runfor = min(args.reader_runfor, 30.0)
        args.idle_timeout = min(args.idle_timeout, 5.0)
    return args


# ------------------------------------------------------------------------- phases


def client_config(args: argparse.Namespace, ca_file: str) -> ConnectionConfig:
    """The library's configuration for --tls/--snappy/--deflate (the defaults without them)."""
    if not nb.upgrade_wanted(args):
        return ConnectionConfig()
    ca = args.tls_root_ca_file or ca_file
    return ConnectionConfig(
        tls_v1=args.tls,
        tls_root_ca_file=ca if args.tls and not args.tls_insecure_skip_verify else "",
        tls_insecure_skip_verify=args.tls and (args.tls_insecure_skip_verify or not ca),
        snappy=args.snappy,
        deflate=args.deflate,
        deflate_level=args.deflate_level,
    )


def negotiated(conn: Connection) -> str:
    """What a connection upgraded to, as the other tools print it."""
    tls = f"TLS {conn.tls_version} {conn.tls_cipher}" if conn.tls_version else ""
    return ", ".join(p for p in (tls, conn.compression) if p)


def check_negotiated(args: argparse.Namespace, conn: Connection, phase: str) -> str:
    """``negotiated(conn)``; raises if nsqd declined an upgrade that was asked for."""
    if args.tls and not conn.tls_version:
        raise RuntimeError(f"{phase}: nsqd did not agree to TLS (--tls-cert/--tls-key?)")
    want = "snappy" if args.snappy else "deflate" if args.deflate else None
    if conn.compression != want:
        raise RuntimeError(f"{phase}: nsqd agreed to compression {conn.compression}, not {want}")
    return negotiated(conn)


async def publish(args: argparse.Namespace, tcp: str, topic: str, cfg: ConnectionConfig) -> dict[str, Any]:
    """--pipeline tasks each awaiting publish_many in a loop, until --runfor or --count."""
    batch = [b"\x00" * args.size] * args.batch_size
    batches = -(-args.count // args.batch_size) if args.count else 0
    claimed = 0
    done = 0

    async with Producer(tcp, config=cfg) as producer:
        await producer.ping(timeout=10.0)
        (conn,) = producer.connections.values()
        upgrade = check_negotiated(args, conn, "PUB")
        loop = asyncio.get_running_loop()
        cpu0 = os.times()
        t0 = time.monotonic_ns()
        stop_at = loop.time() + args.runfor

        async def worker() -> None:
            nonlocal claimed, done
            while True:
                if batches:
                    if claimed >= batches:
                        return
                elif loop.time() >= stop_at:
                    return
                claimed += 1
                await producer.publish_many(topic, batch)
                done += 1

        await asyncio.gather(*(worker() for _ in range(args.pipeline)))
        t1 = time.monotonic_ns()
        cpu1 = os.times()
    return {"msgs": done * args.batch_size, "ns": t1 - t0, **cpu_used(cpu0, cpu1), "negotiated": upgrade}


async def consume(
    args: argparse.Namespace, tcp: str, topic: str, expected: int, cfg: ConnectionConfig
) -> dict[str, Any]:
    """Read back ``expected`` messages, FIN each; time from start to the last one."""
    consumer = Consumer(
        topic,
        args.channel,
        nsqd_tcp_addresses=tcp,
        max_in_flight=args.max_in_flight,
        drain_timeout=10.0,
        config=cfg,
    )
    got = 0
    done = asyncio.Event()
    last = time.monotonic()
    reason = "count"

    async def handler(msg: Message) -> None:  # Consumer.run FINs when it returns
        nonlocal got
        got += 1
        if got >= expected:
            done.set()

    async def iterate() -> None:
        nonlocal got
        async for msg in consumer:
            msg.finish()
            got += 1
            if got >= expected:
                break
        done.set()

    async def watchdog() -> None:
        nonlocal reason, last
        seen = -1
        t_end = time.monotonic() + args.reader_runfor
        while not done.is_set():
            await asyncio.sleep(0.2)
            now = time.monotonic()
            if got != seen:
                seen, last = got, now
            elif now - last > args.idle_timeout:
                reason = "idle"
                done.set()
            if now > t_end:
                reason = "runfor"
                done.set()

    cpu0 = os.times()
    t0 = time.monotonic_ns()
    await consumer.start()
    if args.style == "iter":
        work = asyncio.ensure_future(iterate())
    else:
        work = asyncio.ensure_future(consumer.run(handler, concurrency=args.concurrency or None))
    dog = asyncio.ensure_future(watchdog())
    await done.wait()
    t1 = time.monotonic_ns()
    cpu1 = os.times()
    stats = consumer.stats()
    conns = list(consumer.connections.values())
    upgrade = check_negotiated(args, conns[0], "SUB") if conns else "?"
    await consumer.close()
    for t in (work, dog):
        t.cancel()
    await asyncio.gather(work, dog, return_exceptions=True)
    return {
        "msgs": got,
        "ns": t1 - t0,
        **cpu_used(cpu0, cpu1),
        "stop": reason,
        "finished": stats.messages_finished,
        "requeued": stats.messages_requeued,
        "negotiated": upgrade,
    }


def cpu_used(t0: os.times_result, t1: os.times_result) -> dict[str, float]:
    """This process's CPU seconds between two os.times(): user (Python) and system (kernel)."""
    return {"client_user_s": t1.user - t0.user, "client_sys_s": t1.system - t0.system}


def channel_stats(http: str, topic: str, channel: str) -> dict[str, Any] | None:
    url = f"http://{http}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.loads(r.read())
    data = data.get("data", data)  # pre-1.0 envelope
    for t in data.get("topics") or []:
        if t["topic_name"] == topic:
            for c in t.get("channels") or []:
                if c["channel_name"] == channel:
                    return dict(c)
    return None


# ------------------------------------------------------------------------- driver


def result(test: str, duration_ns: int, msgs: int, size: int) -> None:
    """The Go-format result line (as the other tools print it), on stdout."""
    stamp = datetime.now().strftime("%Y/%m/%d %H:%M:%S")
    print(f"{test}: [{TOOL}] {stamp} {nb.result_line(duration_ns, msgs, size)}", flush=True)


def row(test: str, res: dict[str, Any], size: int, nsqd_cpu_s: float | None) -> dict[str, Any]:
    secs = res["ns"] / 1e9 if res["ns"] > 0 else 0.0
    msgs = res["msgs"]
    out = {
        "test": test,
        "msgs": msgs,
        "duration_s": secs,
        "ops_per_s": msgs / secs if secs else 0.0,
        "mb_per_s": msgs * size / secs / 1024 / 1024 if secs else 0.0,
        "client_cpu": (res["client_user_s"] + res["client_sys_s"]) / secs if secs else None,
        # CPU per message is what the library costs, however busy the machine was
        "client_us_per_msg": (res["client_user_s"] + res["client_sys_s"]) * 1e6 / msgs if msgs else None,
        "nsqd_cpu": nsqd_cpu_s / secs if secs and nsqd_cpu_s is not None else None,
    }
    out.update({k: v for k, v in res.items() if k not in ("msgs", "ns")})
    return out


async def bench(
    args: argparse.Namespace,
    tcp: str,
    http: str,
    pid: int | None,
    topic: str,
    failures: list[str],
    cfg: ConnectionConfig,
) -> list[dict[str, Any]]:
    def cpu() -> float | None:
        return proc_cpu_seconds(pid) if pid else None

    def delta(c0: float | None) -> float | None:
        c1 = cpu()
        return c1 - c0 if c0 is not None and c1 is not None else None

    rows = []
    c0 = cpu()
    pub = await publish(args, tcp, topic, cfg)
    result("PUB", pub["ns"], pub["msgs"], args.size)
    rows.append(row("PUB", pub, args.size, delta(c0)))
    if not pub["msgs"]:
        failures.append("PUB: nothing published")
        return rows

    c0 = cpu()
    sub = await consume(args, tcp, topic, pub["msgs"], cfg)
    result("SUB", sub["ns"], sub["msgs"], args.size)
    rows.append(row("SUB", sub, args.size, delta(c0)))
    if sub["msgs"] != pub["msgs"]:
        failures.append(f"SUB: read {sub['msgs']} of {pub['msgs']} messages (stop={sub['stop']})")
    if http:
        st = channel_stats(http, topic, args.channel)
        if st is None:
            failures.append("SUB: channel missing from nsqd stats")
        elif st["depth"] or st["in_flight_count"] or st["requeue_count"] or st["timeout_count"]:
            keys = ("depth", "in_flight_count", "requeue_count", "timeout_count")
            failures.append("SUB: channel not cleanly FINed: " + ", ".join(f"{k}={st[k]}" for k in keys))
    return rows


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_summary(
    args: argparse.Namespace, target: str, loop_name: str, rows: list[dict[str, Any]], failures: list[str]
) -> None:
    print()
    print(f"== nsqpy client bench: {target} (client loop: {loop_name})")
    print(
        f"   size={args.size}B batch={args.batch_size} pipeline={args.pipeline} "
        f"max_in_flight={args.max_in_flight} style={args.style}"
        f"{'' if args.nsqd_tcp_address else f' mem-queue-size={args.mem_queue_size}'}"
        f"{' (smoke)' if args.smoke else ''}"
    )
    if nb.upgrade_wanted(args):
        got = sorted({r.get("negotiated", "?") for r in rows})
        print(f"   upgrade={nb.upgrade_name(args)}, negotiated: {' / '.join(got) or '-'}")
    print(
        f"{'test':<4} {'msgs':>10} {'msgs/s':>12} {'MB/s':>9} {'secs':>7} "
        f"{'client cpu':>10} {'us/msg':>7} {'nsqd cpu':>9}"
    )
    for r in rows:

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v * 100:.0f}%"

        print(
            f"{r['test']:<4} {r['msgs']:>10} {r['ops_per_s']:>12.1f} {r['mb_per_s']:>9.3f} "
            f"{r['duration_s']:>7.2f} {pct(r['client_cpu']):>10} "
            f"{fmt(r['client_us_per_msg'], '.2f'):>7} {pct(r['nsqd_cpu']):>9}"
        )
    for f in failures:
        print(f"FAILED: {f}")
    print("RESULT: " + ("FAIL" if failures else "OK"), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_args(argv)
    loop_name = "asyncio"
    if not args.no_uvloop:
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            loop_name = "uvloop"
        except ImportError:
            pass
    failures: list[str] = []
    rows: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="nsqclientbench-"))
    daemon: Daemon | None = None
    topic = args.topic
    try:
        if args.nsqd_tcp_address:
            tcp, http, pid = args.nsqd_tcp_address, args.nsqd_http_address, None
            target = f"running nsqd at {tcp}"
            topic += "_" + secrets.token_hex(3)  # old messages in the daemon are not counted
        else:
            args.nsqd_bin = args.nsqd_bin or default_nsqd_bin()
            if not args.nsqd_bin:
                print("FAILED: no nsqd found (use --nsqd-bin or --nsqd-tcp-address)", file=sys.stderr)
                return 2
            daemon = Daemon(args, workdir)
            daemon.start()
            tcp, http, pid = daemon.tcp, daemon.http, daemon.pid
            target = args.nsqd_bin
            print(f"# nsqd pid {pid} tcp {tcp} http {http} data {daemon.data}", flush=True)
        cfg = client_config(args, daemon.tls_ca if daemon is not None else "")
        rows = asyncio.run(bench(args, tcp, http, pid, topic, failures, cfg))
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
        target = args.nsqd_tcp_address or str(args.nsqd_bin)
    finally:
        if daemon is not None and not daemon.stop():
            failures.append(f"nsqd shutdown: {daemon.exit_note}")
            print(daemon.log_tail(), file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    print_summary(args, target, loop_name, rows, failures)
    if args.json:
        print(
            json.dumps(
                {
                    "tool": TOOL,
                    "target": target,
                    "loop": loop_name,
                    "rows": rows,
                    "upgrade": nb.upgrade_name(args),
                    "failures": failures,
                    "pid": os.getpid(),
                }
            )
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
