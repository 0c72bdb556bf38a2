#!/usr/bin/env python3
"""bench_large: large messages (1 MiB by default) through nsqd with NSQ's own Go load
generators, ours and Go's nsqd taking turns (issue 31).

For every ``--mem-queue-size`` given (100 and 0 by default) and ``--rounds`` times, each
``--daemon`` in turn (A B A B …) is started on free loopback ports with a temp data path and
that memory queue size, then:

1. PUB: ``bench_writer --size --batch-size --runfor`` (MPUBs of ``--batch-size``; the topic
   has no channel yet, so everything waits in the topic: memory, then its DiskQueue)
2. SUB: ``bench_reader --size --rdy --runfor=--reader-runfor`` (its SUB creates the channel;
   the reader FINs each message and stops after its run time)

recording each tool's MB/s, nsqd's CPU seconds during each phase (per message, from
/proc/PID/stat), the messages left in the channel after the reader (0 means it ran dry: the
reader's MB/s is then bounded by what was written, not by the daemon), and nsqd's peak RSS
(VmHWM) over the whole run. The table gives each cell's median over the rounds and the ratio
to the last daemon (Go's, by convention), with the 1-minute load average before each run.
A daemon is ``LABEL=CMD``; CMD may start with environment assignments
(``pure=NSQPY_PURE_PYTHON=1 .venv/bin/nsqd``).

    .venv/bin/python bench/bench_large.py --daemon ours=.venv/bin/nsqd \\
        --daemon go=/tmp/gonsq/bin/nsqd --rounds 3
    .venv/bin/python bench/bench_large.py --mem-queue-size 0 --reader-runfor 2s --json

The Go tools come from the NSQ 1.3.0 release tarball (``bin/bench_writer``,
``bin/bench_reader``); ``--writer``/``--reader`` name them (default: /tmp/gonsq/bin).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nsqbench as nb  # noqa: E402
from compare import wait_quiet  # noqa: E402
from run import Daemon, proc_cpu_seconds, proc_peak_rss_mb  # noqa: E402

GO_BIN = Path("/tmp/gonsq/bin")
_RESULT = re.compile(r"duration: (\S+) - ([0-9.]+)mb/s - ([0-9.]+)ops/s")


def executable(cmd: str, workdir: Path, label: str) -> str:
    """A path for Daemon's nsqd_bin: the command itself, or a script running it via env."""
    parts = shlex.split(cmd)
    if len(parts) == 1 and "=" not in parts[0]:
        return parts[0]
    path = workdir / f"nsqd-{label}"
    path.write_text("#!/bin/sh\nexec env " + " ".join(map(shlex.quote, parts)) + ' "$@"\n')
    path.chmod(0o755)
    return str(path)


def run_tool(cmd: list[str], timeout: float) -> dict[str, float]:
    """Run a Go bench tool; its result line as {seconds, mbps, ops}."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    text = proc.stdout + proc.stderr
    m = _RESULT.search(text)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({proc.returncode}): {text.strip()[-500:]}")
    secs = nb.parse_duration(m.group(1))
    return {"seconds": secs, "mbps": float(m.group(2)), "ops": float(m.group(3))}


def channel_depth(http_addr: str, topic: str, channel: str) -> int | None:
    host, port = nb.parse_addr(http_addr)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", f"/stats?format=json&topic={topic}")
        data = json.loads(conn.getresponse().read())
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    data = data.get("data", data)  # NSQ < 1.0 wrapped it
    for t in data.get("topics") or []:
        if t.get("topic_name") == topic:
            for c in t.get("channels") or []:
                if c.get("channel_name") == channel:
                    return int(c.get("depth", 0)) + int(c.get("in_flight_count", 0))
    return None


def one_run(args: argparse.Namespace, nsqd_bin: str, mem: int, workdir: Path) -> dict[str, object]:
    dargs = argparse.Namespace(
        nsqd_bin=nsqd_bin,
        data_path=None,
        mem_queue_size=mem,
        nsqd_arg=list(args.nsqd_arg),
        startup_timeout=20.0,
        stop_timeout=60.0,
    )
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    daemon = Daemon(dargs, run_dir)
    load = os.getloadavg()[0]
    row: dict[str, object] = {"mem_queue_size": mem, "load": load}
    try:
        daemon.start()
        pid = daemon.pid
        assert pid is not None
        size = f"--size={args.size}"
        tcp = f"--nsqd-tcp-address={daemon.tcp}"
        cpu0 = proc_cpu_seconds(pid) or 0.0
        pub = run_tool(
            [args.writer, tcp, size, f"--batch-size={args.batch_size}", f"--runfor={args.runfor}s"],
            args.runfor + 120,
        )
        cpu1 = proc_cpu_seconds(pid) or 0.0
        sub = run_tool(
            [args.reader, tcp, size, f"--rdy={args.rdy}", f"--runfor={args.reader_runfor}s"],
            args.reader_runfor + 120,
        )
        cpu2 = proc_cpu_seconds(pid) or 0.0
        left = channel_depth(daemon.http, "sub_bench", "ch")
        pub_n = pub["ops"] * pub["seconds"]
        sub_n = sub["ops"] * sub["seconds"]
        row.update(
            pub_mbps=pub["mbps"],
            sub_mbps=sub["mbps"],
            pub_msgs=round(pub_n),
            sub_msgs=round(sub_n),
            left=left,
            pub_cpu=cpu1 - cpu0,
            sub_cpu=cpu2 - cpu1,
            pub_cpu_per_msg=(cpu1 - cpu0) / pub_n if pub_n else None,
            sub_cpu_per_msg=(cpu2 - cpu1) / sub_n if sub_n else None,
            peak_rss_mib=proc_peak_rss_mb(pid),
        )
    finally:
        if daemon.proc is not None and not daemon.stop():
            row["exit"] = daemon.exit_note
        shutil.rmtree(run_dir, ignore_errors=True)
    return row


CELLS = (
    ("pub_mbps", "PUB MB/s", "%.0f"),
    ("sub_mbps", "SUB MB/s", "%.0f"),
    ("peak_rss_mib", "peak RSS MiB", "%.0f"),
    ("pub_cpu_per_msg", "PUB CPU ms/msg", "%.3f"),
    ("sub_cpu_per_msg", "SUB CPU ms/msg", "%.3f"),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/bench_large.py", description=__doc__.splitlines()[0])
    p.add_argument("--daemon", action="append", metavar="LABEL=CMD", help="repeatable; default ours and Go's")
    p.add_argument("--mem-queue-size", type=int, action="append", help="repeatable (default 100 and 0)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--runfor", type=nb.parse_duration, default=4.0, help="writer run time")
    p.add_argument(
        "--reader-runfor",
        type=nb.parse_duration,
        default=2.0,
        help="reader run time: shorter than a drain takes, so its MB/s is the daemon's (a reader "
        "that runs dry reports what was written over its whole run time)",
    )
    p.add_argument("--rdy", type=int, default=50)
    p.add_argument("--writer", default=str(GO_BIN / "bench_writer"))
    p.add_argument("--reader", default=str(GO_BIN / "bench_reader"))
    p.add_argument(
        "--nsqd-arg", action="append", default=[], metavar="ARG", help="extra nsqd flag (repeatable)"
    )
    p.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    p.add_argument(
        "--quiet-below",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="before each run, wait until the machine's CPU is less than this busy (0.15 = 15%%)",
    )
    p.add_argument("--quiet-wait", type=float, default=120.0, help="longest wait for --quiet-below, seconds")
    p.add_argument("--json", action="store_true", help="print every run as one JSON line too")
    args = p.parse_args(nb.go_flags(argv))
    daemons = args.daemon or [
        f"ours={Path(sys.executable).with_name('nsqd')}",
        f"go={GO_BIN / 'nsqd'}",
    ]
    mems = args.mem_queue_size or [100, 0]
    workdir = Path(tempfile.mkdtemp(prefix="bench-large-"))
    labels = []
    bins = {}
    for spec in daemons:
        label, _, cmd = spec.partition("=")
        labels.append(label)
        bins[label] = executable(cmd, workdir, label)
    runs: dict[tuple[int, str], list[dict[str, object]]] = {}
    failed = False
    try:
        for mem in mems:
            for r in range(args.rounds):
                for label in labels:
                    busy = wait_quiet(args.quiet_below, args.quiet_wait) if args.quiet_below else None
                    try:
                        row = one_run(args, bins[label], mem, workdir)
                    except Exception as e:
                        print(f"# {label} mem={mem} round {r + 1}: FAILED {e}", flush=True)
                        failed = True
                        continue
                    row["daemon"] = label
                    row["busy_before"] = busy
                    runs.setdefault((mem, label), []).append(row)
                    print(
                        "# %s mem=%d round %d (load %.2f): PUB %.0f MB/s, SUB %.0f MB/s (left %s), "
                        "peak RSS %.0f MiB, CPU %.2f s / %.2f s"
                        % (
                            label,
                            mem,
                            r + 1,
                            row["load"],
                            row["pub_mbps"],
                            row["sub_mbps"],
                            row["left"],
                            row["peak_rss_mib"] or 0,
                            row["pub_cpu"],
                            row["sub_cpu"],
                        ),
                        flush=True,
                    )
                    if args.json:
                        print(json.dumps(row), flush=True)
                    time.sleep(args.pause)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ref = labels[-1]
    print(f"\nmedians of {args.rounds}; ratio to {ref}")
    print("| mem-queue-size | " + " | ".join(name for _, name, _ in CELLS) + " | daemon | load |")
    print("|---" * (len(CELLS) + 3) + "|")
    for mem in mems:
        for label in labels:
            rows = runs.get((mem, label), [])
            if not rows:
                continue
            cells = []
            for key, _, spec in CELLS:
                vals = [float(x[key]) for x in rows if x.get(key) is not None]  # type: ignore[arg-type]
                refs = [float(x[key]) for x in runs.get((mem, ref), []) if x.get(key) is not None]  # type: ignore[arg-type]
                if not vals:
                    cells.append("-")
                    continue
                med = statistics.median(vals)
                text = spec % (med * 1000 if "per_msg" in key else med)
                if label != ref and refs and statistics.median(refs):
                    text += " (%.2f×)" % (med / statistics.median(refs))
                cells.append(text)
            loads = [float(x["load"]) for x in rows]  # type: ignore[arg-type]
            print(f"| {mem} | " + " | ".join(cells) + f" | {label} | {min(loads):.1f}–{max(loads):.1f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
