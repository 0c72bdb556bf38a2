#!/usr/bin/env python3
"""Profile nsqd with py-spy under the bench load: writer phase, then reader phase.

Starts an nsqd (the venv's, or --nsqd-bin) on free ports, attaches ``py-spy record`` to it
for each phase (bench_writer filling a topic, then bench_reader draining it, or both at once
with --concurrent) and prints the top functions of each profile by own ("self") and
cumulative ("total") share of the samples. The raw collapsed stacks are kept with
--keep-data (load them in speedscope or flamegraph.pl).

    .venv/bin/python bench/profile.py --mem-queue-size 100000000 --runfor 5
    .venv/bin/python bench/profile.py --mem-queue-size 10000 --top 25
    NSQPY_PURE_PYTHON=1 .venv/bin/python bench/profile.py   # the pure-Python hot paths

py-spy needs ptrace rights on the daemon (root, or kernel.yama.ptrace_scope=0).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nsqbench as nb  # noqa: E402
from run import Daemon, default_nsqd_bin, finish_tool, start_tool  # noqa: E402


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/profile.py", description=__doc__.splitlines()[0])
    p.add_argument("--nsqd-bin", default=None, help="nsqd executable (default: the venv's nsqd)")
    p.add_argument("--py-spy", default=None, help="py-spy executable (default: the venv's)")
    p.add_argument("--mem-queue-size", type=int, default=1_000_000)
    p.add_argument("--nsqd-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--runfor", type=nb.parse_duration, default=5.0)
    p.add_argument("--writer-procs", type=int, default=1)
    p.add_argument("--reader-procs", type=int, default=1)
    p.add_argument("--concurrent", action="store_true", help="one profile of PUB and SUB at once")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=15, help="functions to print per profile")
    p.add_argument("--keep-data", action="store_true", help="keep the temp dir (raw profiles)")
    args = p.parse_args(nb.go_flags(argv))
    args.startup_timeout = 20.0
    args.stop_timeout = 30.0
    args.data_path = None
    return args


def spy(args: argparse.Namespace, pid: int, out: Path, seconds: float) -> subprocess.Popen:
    exe = args.py_spy or str(Path(sys.executable).with_name("py-spy"))
    cmd = [
        exe,
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(args.rate),
        "--format",
        "raw",
        "--function",
        "--nonblocking",
        "--duration",
        str(max(1, round(seconds))),
        "--output",
        str(out),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def top_lines(path: Path, n: int) -> str:
    """The top functions of a collapsed-stack profile by self and total share."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        samples += k
        frames = stack.split(";")
        # py-spy prefixes the thread ("process 123:"/"thread 0x…"): not a function
        frames = [f for f in frames if "(" in f]
        if not frames:
            continue
        own[frames[-1]] += k
        for f in set(frames):
            total[f] += k
    if not samples:
        return "  (no samples)"
    rows = [f"  {'self':>6} {'total':>6}  function ({samples} samples)"]
    for f, k in own.most_common(n):
        rows.append(f"  {100 * k / samples:5.1f}% {100 * total[f] / samples:5.1f}%  {f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = build_args(argv)
    args.nsqd_bin = args.nsqd_bin or default_nsqd_bin()
    workdir = Path(tempfile.mkdtemp(prefix="nsqprofile-"))
    daemon = Daemon(args, workdir)
    daemon.start()
    assert daemon.pid is not None
    common = [f"--nsqd-tcp-address={daemon.tcp}", "--topic=profile", f"--runfor={args.runfor}"]
    phases: list[tuple[str, Path]] = []
    try:
        if args.concurrent:
            out = workdir / "concurrent.txt"
            reader = start_tool("bench_reader", [*common, "--channel=ch", f"--procs={args.reader_procs}"])
            writer = start_tool("bench_writer", [*common, f"--procs={args.writer_procs}"])
            time.sleep(1.0)  # connections and handshakes out of the profile
            s = spy(args, daemon.pid, out, args.runfor - 1.5)
            finish_tool("bench_writer", writer, args.runfor + 120)
            finish_tool("bench_reader", reader, args.runfor + 120)
            s.wait()
            phases.append(("PUB+SUB concurrent", out))
        else:
            out = workdir / "pub.txt"
            writer = start_tool("bench_writer", [*common, f"--procs={args.writer_procs}"])
            time.sleep(0.5)
            s = spy(args, daemon.pid, out, args.runfor - 1.0)
            _rc, w = finish_tool("bench_writer", writer, args.runfor + 120)
            s.wait()
            phases.append(("PUB (bench_writer)", out))
            written = w.get("msgs", 0)
            out = workdir / "sub.txt"
            reader = start_tool(
                "bench_reader",
                [
                    *common,
                    "--channel=ch",
                    f"--count={written}",
                    "--runfor=120s",
                    "--idle-timeout=5s",
                    f"--procs={args.reader_procs}",
                ],
            )
            time.sleep(0.5)
            # the reader drains what the writer published: profile about as long
            s = spy(args, daemon.pid, out, max(1.0, args.runfor - 1.0))
            finish_tool("bench_reader", reader, 240)
            s.wait()
            phases.append(("SUB (bench_reader)", out))
    finally:
        daemon.stop()
    for title, path in phases:
        print(f"\n== py-spy: {title}, nsqd {args.nsqd_bin}, mem-queue-size {args.mem_queue_size}")
        print(top_lines(path, args.top) if path.exists() else "  (no profile written)")
    if args.keep_data:
        print(f"# kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
