#!/usr/bin/env python3
"""bench_to_nsq: how fast the ``nsq_to_nsq`` console script republishes from one topic to another.

Starts an nsqd on free ports (as run.py does; ``--separate`` starts a second one as the
destination), fills ``--topic`` with ``--count`` messages of ``--size`` bytes through
bench_writer.py (MPUB), waits until they all sit in the ``nsq_to_nsq`` channel, then runs
``nsq_to_nsq --topic=<topic> --destination-topic=<topic>_out`` and polls the destination's
/stats until every message arrived. Prints the Go-style result line for the drain (from the
first republished message to the last: nsq_to_nsq's start-up is left out, and reported
apart), the CPU seconds of nsq_to_nsq and of the daemon(s), and the load average before and
after (the machine may be shared). Then SIGTERM: nsq_to_nsq must exit 0, the source channel
must be empty and the destination must hold exactly --count messages.
``--profile out.json`` records nsq_to_nsq with py-spy (speedscope format) during the drain.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nsqbench as nb  # noqa: E402
from run import Daemon, default_nsqd_bin, proc_cpu_seconds  # noqa: E402

TOOL = "bench_to_nsq"


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1_000_000, help="messages to republish")
    p.add_argument("--size", type=int, default=100, help="message body size (bytes)")
    p.add_argument("--topic", default="to_nsq_bench")
    p.add_argument("--max-in-flight", type=int, default=2500, help="nsq_to_nsq --max-in-flight")
    p.add_argument(
        "--tool-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for nsq_to_nsq (repeatable), e.g. --tool-arg=--mode=round-robin",
    )
    p.add_argument(
        "--separate",
        action="store_true",
        help="republish to a second nsqd (default: another topic on the same one)",
    )
    p.add_argument("--writer-procs", type=int, default=1, help="bench_writer --procs for the fill")
    p.add_argument("--timeout", type=nb.parse_duration, default=300.0, help="cap on the drain")
    p.add_argument(
        "--profile",
        default="",
        metavar="FILE",
        help="record nsq_to_nsq with py-spy into FILE (speedscope JSON)",
    )
    d = p.add_argument_group("daemon")
    d.add_argument("--nsqd-bin", default=None, help="nsqd executable (default: the venv's nsqd)")
    d.add_argument("--mem-queue-size", type=int, default=2_000_000, help="nsqd --mem-queue-size")
    d.add_argument("--nsqd-arg", action="append", default=[], metavar="ARG")
    d.add_argument("--startup-timeout", type=nb.parse_duration, default=20.0)
    d.add_argument("--stop-timeout", type=nb.parse_duration, default=60.0)
    p.add_argument("--smoke", action="store_true", help="20k messages, for a quick check")
    p.add_argument("--json", action="store_true", help="also print one JSON summary line")
    args = p.parse_args(nb.go_flags(argv))
    if args.smoke:
        args.count = min(args.count, 20_000)
    args.nsqd_bin = args.nsqd_bin or default_nsqd_bin()
    args.data_path = None
    if not args.nsqd_bin:
        p.error("no nsqd found (give --nsqd-bin)")
    return args


def http(addr: str, method: str, path: str, body: bytes | None = None) -> bytes:
    req = urllib.request.Request(f"http://{addr}{path}", data=body, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return bytes(resp.read())


def topic_stats(addr: str, topic: str) -> dict | None:
    doc = json.loads(http(addr, "GET", f"/stats?format=json&topic={topic}&include_clients=false"))
    for t in doc.get("topics") or []:
        if t["topic_name"] == topic:
            return t
    return None


def channel_depth(addr: str, topic: str, channel: str) -> tuple[int, int]:
    t = topic_stats(addr, topic)
    for c in (t or {}).get("channels") or []:
        if c["channel_name"] == channel:
            return c["depth"], c["in_flight_count"] + c["deferred_count"]
    return -1, -1


def message_count(addr: str, topic: str) -> int:
    t = topic_stats(addr, topic)
    return -1 if t is None else int(t["message_count"])


def loadavg() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


def fill(args: argparse.Namespace, tcp: str) -> None:
    cmd = [
        sys.executable,
        str(BENCH / "bench_writer.py"),
        f"--nsqd-tcp-address={tcp}",
        f"--topic={args.topic}",
        f"--count={args.count}",
        f"--size={args.size}",
        "--batch-size=200",
        f"--procs={args.writer_procs}",
        "--runfor=10m",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    sys.stderr.write(res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"bench_writer failed ({res.returncode})")


def run(args: argparse.Namespace, workdir: Path) -> int:
    src = Daemon(args, workdir / "src")  # (its data dir, and so the workdir, is made here)
    daemons = [src]
    dst = src
    if args.separate:
        dst = Daemon(args, workdir / "dst")
        daemons.append(dst)
    out_topic = f"{args.topic}_out"
    failures: list[str] = []
    tool: subprocess.Popen | None = None
    spy: subprocess.Popen | None = None
    try:
        for d in daemons:
            d.start()
        http(src.http, "POST", f"/topic/create?topic={args.topic}")
        http(src.http, "POST", f"/channel/create?topic={args.topic}&channel=nsq_to_nsq")
        nb.log(TOOL, f"filling {args.topic} with {args.count} x {args.size} B")
        fill(args, src.tcp)
        while channel_depth(src.http, args.topic, "nsq_to_nsq")[0] < args.count:
            time.sleep(0.1)
        load_before = loadavg()
        cpu_d0 = [proc_cpu_seconds(d.pid) or 0.0 for d in daemons if d.pid]
        argv = [
            str(Path(sys.executable).with_name("nsq_to_nsq")),
            f"--topic={args.topic}",
            f"--destination-topic={out_topic}",
            f"--nsqd-tcp-address={src.tcp}",
            f"--destination-nsqd-tcp-address={dst.tcp}",
            f"--max-in-flight={args.max_in_flight}",
            "--status-every=0",
            *args.tool_arg,
        ]
        nb.log(TOOL, "running " + " ".join(argv[1:]))
        err_path = workdir / "nsq_to_nsq.stderr"
        t_start = time.monotonic()
        tool = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(err_path, "wb")
        )
        if args.profile:
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("py-spy")),
                    "record",
                    "--pid",
                    str(tool.pid),
                    "--format",
                    "speedscope",
                    "-o",
                    args.profile,
                    "--rate",
                    "200",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        t_first = None
        done = 0
        while True:
            done = message_count(dst.http, out_topic)
            now = time.monotonic()
            if done > 0 and t_first is None:
                t_first = now
                first_count = done
            if done >= args.count:
                break
            if tool.poll() is not None:
                failures.append(f"nsq_to_nsq exited early with {tool.returncode}")
                break
            if now - t_start > args.timeout:
                failures.append(f"only {done} of {args.count} republished after {args.timeout:.0f}s")
                break
            time.sleep(0.05)
        t_end = time.monotonic()
        cpu_tool = proc_cpu_seconds(tool.pid) or 0.0
        cpu_d1 = [proc_cpu_seconds(d.pid) or 0.0 for d in daemons if d.pid]
        load_after = loadavg()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        tool.send_signal(signal.SIGTERM)
        code = tool.wait(args.stop_timeout)
        err = err_path.read_text(errors="replace")
        if code != 0:
            failures.append(f"nsq_to_nsq exited {code} on SIGTERM")
        summary = [ln for ln in err.splitlines() if "messages received" in ln]
        depth, pending = channel_depth(src.http, args.topic, "nsq_to_nsq")
        final = message_count(dst.http, out_topic)
        if (depth, pending) != (0, 0):
            failures.append(f"source channel not empty: depth {depth}, in flight/deferred {pending}")
        if final != args.count:
            failures.append(f"destination has {final} messages, not {args.count}")
        steady = (t_end - t_first) if t_first else 0.0
        steady_msgs = done - first_count if t_first else 0
        nb.log(TOOL, f"startup (launch to first republished message): {(t_first or t_end) - t_start:.2f}s")
        data = nb.report(TOOL, int(steady * 1e9), steady_msgs, args.size, False)
        total = t_end - t_start
        data.update(
            count=args.count,
            separate=args.separate,
            max_in_flight=args.max_in_flight,
            tool_args=args.tool_arg,
            wall_with_startup_s=total,
            ops_per_s_with_startup=args.count / total if total else 0.0,
            nsq_to_nsq_cpu_s=cpu_tool,
            nsq_to_nsq_us_per_msg=cpu_tool / args.count * 1e6,
            nsqd_cpu_s=[b - a for a, b in zip(cpu_d0, cpu_d1, strict=True)],
            loadavg_before=load_before,
            loadavg_after=load_after,
            cpus=os.cpu_count(),
            summary=summary[-1].split("INFO: ", 1)[-1] if summary else "",
            errors=failures,
        )
        print(
            f"{'republished':>24}: {args.count} x {args.size} B "
            f"({'to a second nsqd' if args.separate else 'same nsqd, another topic'})"
        )
        print(f"{'drain (steady)':>24}: {steady:.2f}s  {data['ops_per_s']:,.0f} msgs/s")
        print(f"{'with start-up':>24}: {total:.2f}s  {data['ops_per_s_with_startup']:,.0f} msgs/s")
        print(f"{'nsq_to_nsq CPU':>24}: {cpu_tool:.2f}s  ({data['nsq_to_nsq_us_per_msg']:.2f} us/msg)")
        print(f"{'nsqd CPU':>24}: " + ", ".join(f"{c:.2f}s" for c in data["nsqd_cpu_s"]))
        print(f"{'load average':>24}: {load_before} before, {load_after} after ({os.cpu_count()} CPUs)")
        print(f"{'nsq_to_nsq summary':>24}: {data['summary']}")
        for f in failures:
            print(f"{'FAILED':>24}: {f}")
        if args.json:
            print(json.dumps(data))
        return 1 if failures else 0
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        if tool is not None and tool.poll() is None:
            tool.kill()
            tool.wait()
        for d in daemons:
            if not d.stop():
                print(f"nsqd: {d.exit_note}\n{d.log_tail()}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_to_nsq.") as tmp:
        return run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
