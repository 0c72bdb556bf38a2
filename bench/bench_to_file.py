#!/usr/bin/env python3
"""bench_to_file: how fast the ``nsq_to_file`` console script drains a topic to files.

Starts an nsqd on free ports (bench/run.py's Daemon, --mem-queue-size big enough to keep
every message in memory), publishes --count messages of --size bytes (each body carries
its sequence number, then printable filler that varies, so --gzip has real work), then
runs ``nsq_to_file`` (the installed console script, as a user would) on that topic and
times it until nsqd reports the channel empty (depth 0, nothing in flight: every message
written, synced and FINished). Then SIGTERM, and a check that the output files hold every
message exactly once (decompressed with --gzip). Prints the rate from the process start
and from its subscription, CPU seconds of nsq_to_file and nsqd, and the load average.

  .venv/bin/python bench/bench_to_file.py                      # 1M x 100 B, --max-in-flight=2500
                                                               # (--sync-interval=1s)
  .venv/bin/python bench/bench_to_file.py --gzip
  .venv/bin/python bench/bench_to_file.py --arg=--rotate-size=50000000 --arg=--work-dir=/tmp/w
  .venv/bin/python bench/bench_to_file.py --nsq-to-file /path/to/go/nsq_to_file   # Go's, same load
  .venv/bin/python bench/bench_to_file.py --smoke
  .venv/bin/python bench/bench_to_file.py --profile out.svg    # py-spy flame graph of nsq_to_file
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nsqbench as nb  # noqa: E402
from run import Daemon, default_nsqd_bin, proc_cpu_seconds  # noqa: E402

from nsqpy.client import Producer  # noqa: E402

TOOL = "bench_to_file"


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1_000_000, help="messages to publish and drain")
    p.add_argument("--size", type=int, default=100, help="message body size (bytes, >= 12)")
    p.add_argument("--max-in-flight", type=int, default=2500, help="nsq_to_file --max-in-flight")
    p.add_argument("--gzip", action="store_true", help="nsq_to_file --gzip")
    p.add_argument(
        "--sync-interval",
        default="1s",
        help="nsq_to_file --sync-interval: the last messages (fewer than 85%% of "
        "RDY in flight) wait for this tick before their FIN, as in Go",
    )
    p.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for nsq_to_file (repeatable)",
    )
    p.add_argument(
        "--nsq-to-file",
        default=str(Path(sys.executable).parent / "nsq_to_file"),
        help="the nsq_to_file executable (default: the venv's console script)",
    )
    p.add_argument("--topic", default="to_file_bench")
    p.add_argument("--channel", default="nsq_to_file")
    p.add_argument("--nsqd-bin", default=None, help="nsqd executable (default: the venv's nsqd)")
    p.add_argument("--nsqd-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--data-path", default=None)
    p.add_argument("--startup-timeout", type=nb.parse_duration, default=20.0)
    p.add_argument("--stop-timeout", type=nb.parse_duration, default=30.0)
    p.add_argument(
        "--timeout", type=nb.parse_duration, default=600.0, help="give up draining after this long"
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (files, logs)")
    p.add_argument(
        "--profile",
        default="",
        metavar="SVG",
        help="record nsq_to_file with py-spy into this flame graph (.svg) or collapsed stacks (.txt)",
    )
    p.add_argument("--smoke", action="store_true", help="20k messages (a few seconds)")
    p.add_argument("--json", action="store_true", help="also print one JSON summary line")
    args = p.parse_args(argv)
    if args.smoke:
        args.count = min(args.count, 20_000)
    if args.size < 12:
        p.error("--size must be >= 12 (the body starts with its sequence number)")
    args.nsqd_bin = args.nsqd_bin or default_nsqd_bin()
    args.mem_queue_size = max(args.count * 2, 10_000)
    return args


def bodies(count: int, size: int) -> list[bytes]:
    """``%010d `` then a slice of printable filler (different for each message)."""
    rng = random.Random(42)
    filler = bytes(rng.randrange(33, 127) for _ in range(size + 4096))
    width = size - 11
    return [b"%010d " % i + filler[i % 4096 : i % 4096 + width] for i in range(count)]


async def publish(tcp: str, topic: str, msgs: list[bytes]) -> float:
    """MPUB everything (200 per command, 8 in flight); the rate in msgs/s."""
    batches = [msgs[i : i + 200] for i in range(0, len(msgs), 200)]
    t0 = time.monotonic()
    async with Producer(tcp) as producer:
        await producer.ping(timeout=10.0)
        it = iter(batches)

        async def worker() -> None:
            for b in it:
                await producer.publish_many(topic, b)

        await asyncio.gather(*(worker() for _ in range(8)))
    return len(msgs) / (time.monotonic() - t0)


def channel(http: str, topic: str, name: str) -> dict[str, Any] | None:
    with urllib.request.urlopen(f"http://{http}/stats?format=json&topic={topic}", timeout=10) as r:
        data = json.loads(r.read())
    for t in data.get("topics") or []:
        if t["topic_name"] == topic:
            for c in t.get("channels") or []:
                if c["channel_name"] == name:
                    return dict(c)
    return None


def read_output(out_dir: Path) -> list[bytes]:
    lines: list[bytes] = []
    for f in sorted(out_dir.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            if f.name.endswith(".gz"):
                data = gzip.decompress(data)
            lines.extend(data.splitlines())
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_to_file."))
    out_dir = work / "out"
    out_dir.mkdir()
    daemon = Daemon(args, work)
    failures: list[str] = []
    result: dict[str, Any] = {
        "count": args.count,
        "size": args.size,
        "gzip": args.gzip,
        "max_in_flight": args.max_in_flight,
        "args": args.arg,
    }
    proc: subprocess.Popen[bytes] | None = None
    spy: subprocess.Popen[bytes] | None = None
    try:
        daemon.start()
        msgs = bodies(args.count, args.size)
        result["pub_rate"] = round(asyncio.run(publish(daemon.tcp, args.topic, msgs)))
        print(f"# published {args.count} x {args.size} B at {result['pub_rate']:,} msgs/s", flush=True)
        time.sleep(1.0)  # let the machine settle after publishing
        result["loadavg_before"] = os.getloadavg()
        cmd = [
            args.nsq_to_file,
            f"--nsqd-tcp-address={daemon.tcp}",
            f"--topic={args.topic}",
            f"--channel={args.channel}",
            f"--output-dir={out_dir}",
            f"--max-in-flight={args.max_in_flight}",
            f"--sync-interval={args.sync_interval}",
            *(["--gzip"] if args.gzip else []),
            *args.arg,
        ]
        print("# " + " ".join(cmd), flush=True)
        nsqd_cpu0 = proc_cpu_seconds(daemon.proc.pid) if daemon.proc else None
        log_path = work / "nsq_to_file.log"
        with open(log_path, "wb") as logf:
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
        if args.profile:
            fmt = ["--format", "raw"] if args.profile.endswith(".txt") else []
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "-o",
                    args.profile,
                    "--pid",
                    str(proc.pid),
                    "--rate",
                    "250",
                    *fmt,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        t_sub = None
        t_sent = None
        t_end = None
        deadline = t0 + args.timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                failures.append(f"nsq_to_file exited early with {proc.returncode}")
                break
            c = channel(daemon.http, args.topic, args.channel)
            now = time.monotonic()
            if c is not None and t_sub is None and c.get("client_count"):
                t_sub = now
            if c is not None and t_sent is None and c["depth"] == 0 and c["message_count"] >= args.count:
                t_sent = now
            if (
                c is not None
                and c["depth"] == 0
                and c["in_flight_count"] == 0
                and c["deferred_count"] == 0
                and c["message_count"] >= args.count
            ):
                t_end = now
                break
            time.sleep(0.02)
        cpu = proc_cpu_seconds(proc.pid)
        nsqd_cpu1 = proc_cpu_seconds(daemon.proc.pid) if daemon.proc else None
        result["loadavg_after"] = os.getloadavg()
        if t_end is None:
            failures.append("the channel was not drained in time")
        else:
            result["seconds"] = round(t_end - t0, 3)
            result["rate"] = round(args.count / (t_end - t0))
            if t_sub is not None:
                result["rate_from_sub"] = round(args.count / (t_end - t_sub))
            if t_sent is not None and t_sub is not None:
                result["rate_delivered"] = round(args.count / max(t_sent - t_sub, 1e-3))
        result["nsq_to_file_cpu_s"] = cpu
        if nsqd_cpu0 is not None and nsqd_cpu1 is not None:
            result["nsqd_cpu_s"] = round(nsqd_cpu1 - nsqd_cpu0, 2)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(args.stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if code != 0:
            failures.append(f"nsq_to_file exited {code} after SIGTERM")
        lines = read_output(out_dir)
        seqs = sorted(int(x[:10]) for x in lines)
        if seqs != list(range(args.count)):
            failures.append(
                f"output holds {len(lines)} lines, {len(set(seqs))} distinct, {args.count} expected"
            )
        by_seq = {int(x[:10]): x for x in lines}
        if any(by_seq.get(i) != msgs[i] for i in range(0, args.count, max(1, args.count // 1000))):
            failures.append("some lines differ from the published bodies")
        tail = log_path.read_text(errors="replace").splitlines()
        result["summary"] = next((x for x in reversed(tail) if "exiting:" in x), "")
        result["files"] = sum(1 for f in out_dir.rglob("*") if f.is_file())
        result["bytes"] = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        daemon.stop()
        if args.keep:
            print(f"# kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    la = result.get("loadavg_before")
    print(
        f"[{TOOL}] {args.count} x {args.size} B, --max-in-flight={args.max_in_flight}"
        f"{' --gzip' if args.gzip else ''} {' '.join(args.arg)}"
    )
    if "rate" in result:
        print(
            f"[{TOOL}] drained in {result['seconds']}s: {result['rate']:,} msgs/s from start, "
            f"{result.get('rate_from_sub', 0):,} msgs/s from subscription "
            f"({result.get('rate_delivered', 0):,} msgs/s until all were delivered); "
            f"cpu nsq_to_file {result['nsq_to_file_cpu_s']:.2f}s, nsqd {result.get('nsqd_cpu_s', '?')}s; "
            f"{result['files']} files, {result['bytes']:,} bytes; "
            f"load average before {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}"
            if la
            else ""
        )
    print(f"[{TOOL}] {result.get('summary', '')}")
    for f in failures:
        print(f"[{TOOL}] FAILED: {f}")
    if args.json:
        print(json.dumps({**result, "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
