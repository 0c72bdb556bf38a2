#!/usr/bin/env python3
"""Compare nsqd builds (or ours and the Go nsqd) under the same load, alternating runs.

Runs ``bench/run.py --json`` with the same arguments against each daemon in turn, --rounds
times (A B A B …, so a change in the machine's load hits both alike), and prints for every
phase the median of each daemon, the ratio to the first one and the host's 1-minute load
average before each run: msgs/s with nsqd's CPU (PUB, SUB, and DLV, the deliveries summed
over a fan-out's channels), p99 for the latency phase, the publisher's MPUB round trip
p50/p99 (RTT, fan-out), bytes per queued channel copy (MEM) and nsqd's CPU-seconds per 1M
messages published and consumed (CPU). ``--bench rss`` and ``--bench large`` run
bench_rss.py (memory in real use) and bench_large.py (1 MiB messages) the same way instead.
A daemon is ``LABEL=CMD``:
CMD is anything run.py takes as --nsqd-bin (an executable taking nsqd's flags); an
environment assignment may come first (``pure=NSQPY_PURE_PYTHON=1 .venv/bin/nsqd``, run
through ``env``).

    .venv/bin/python bench/compare.py --daemon ours=.venv/bin/nsqd --daemon go=/usr/local/bin/nsqd \\
        --rounds 3 -- --runfor 5 --no-latency --mem-queue-size 100000000
    .venv/bin/python bench/compare.py --daemon c=.venv/bin/nsqd \\
        --daemon "pure=NSQPY_PURE_PYTHON=1 .venv/bin/nsqd" -- --mode concurrent --runfor 5
    .venv/bin/python bench/compare.py --daemon ours=.venv/bin/nsqd --daemon go=/tmp/gonsq/bin/nsqd \\
        -- --mode fanout --channels 20,100 --runfor 5 --mem-queue-size 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def wrapper(cmd: str, workdir: Path, label: str) -> str:
    """An executable for run.py's --nsqd-bin: the command itself, or a script around it."""
    parts = shlex.split(cmd)
    if len(parts) == 1 and "=" not in parts[0]:
        return parts[0]
    path = workdir / f"nsqd-{label}"
    path.write_text("#!/bin/sh\nexec env " + " ".join(shlex.quote(p) for p in parts) + ' "$@"\n')
    path.chmod(0o755)
    return str(path)


def cpu_busy(seconds: float = 1.0) -> float:
    """The share of the machine's CPU time in use over ``seconds`` (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields[:8])

    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def wait_quiet(limit: float, patience: float) -> float:
    """Wait (up to ``patience`` seconds) until the machine is less than ``limit`` busy;
    returns the last reading."""
    deadline = time.monotonic() + patience
    busy = cpu_busy()
    while busy > limit and time.monotonic() < deadline:
        time.sleep(2.0)
        busy = cpu_busy()
    return busy


def cells_of(row: dict) -> list[tuple[str, dict]]:
    """The figures compare.py reports from one run.py row: (label, values) pairs; the label
    is the row's test, and RTT for a fan-out publisher's round trips."""
    test = row["test"]
    if test == "LAT":
        return [(test, {"value": row.get("p99_ms")})]
    if test == "MEM":
        return [(test, {"value": row.get("bytes_per_copy")})]
    if test == "CPU":
        return [(test, {"value": row.get("cpu_s_per_M")})]
    out = [(test, {"value": row.get("ops_per_s") or None, "cpu": row.get("nsqd_cpu")})]
    if row.get("rtt_p99_ms") is not None:
        out.append(("RTT", {"value": row["rtt_p99_ms"], "p50": row.get("rtt_p50_ms")}))
    return out


def fmt_cell(label: str, vals: list[dict]) -> tuple[str, float | None]:
    """A table cell of the medians of one daemon's runs, and the median compared."""
    med = med_of(vals, "value")
    if med is None:
        return "-", None
    if label == "LAT":
        return f"p99 {med:.3f}ms", med
    if label == "RTT":
        return f"p50 {med_of(vals, 'p50') or 0:.2f} p99 {med:.2f}ms", med
    if label == "MEM":
        return f"{med:.0f} B/copy", med
    if label == "CPU":
        return f"{med:.{3 if med < 10 else 1 if med < 100 else 0}f} CPU-s/1M", med
    cell = f"{med / 1000:.0f}k" if med >= 10_000 else f"{med:.0f}"
    cpu = med_of(vals, "cpu")
    if cpu is not None:
        cell += f" ({cpu * 100:.0f}%)"
    return cell, med


def med_of(vals: list[dict], key: str) -> float | None:
    xs = [v[key] for v in vals if v.get(key) is not None]
    return statistics.median(xs) if xs else None


def delegate(args: argparse.Namespace) -> int:
    """``--bench rss|large``: the script that measures those rows, given the same daemons
    (alternating, ``--rounds`` of each, medians and ratios in its own table)."""
    script = {"rss": "bench_rss.py", "large": "bench_large.py"}[args.bench]
    cmd = [sys.executable, str(BENCH / script), "--rounds", str(args.rounds)]
    for spec in args.daemon:
        cmd += ["--daemon", spec]
    if args.bench == "large":
        cmd += ["--pause", str(args.pause)]
        if args.quiet_below:
            cmd += ["--quiet-below", str(args.quiet_below), "--quiet-wait", str(args.quiet_wait)]
    if args.json:
        cmd.append("--json")
    cmd += args.run_args
    print("# " + shlex.join(cmd), flush=True)
    return subprocess.run(cmd).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/compare.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--daemon",
        action="append",
        required=True,
        metavar="LABEL=CMD",
        help="a daemon to compare (repeat; the first is the reference)",
    )
    p.add_argument("--rounds", type=int, default=3, help="runs per daemon (median reported)")
    p.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    p.add_argument(
        "--quiet-below",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="before each run, wait until the machine's CPU is less than this busy "
        "(0.15 = 15%%; other processes' load skews latency most)",
    )
    p.add_argument(
        "--quiet-wait", type=float, default=300.0, help="longest wait for --quiet-below, in seconds"
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON line too")
    p.add_argument(
        "--bench",
        choices=("run", "rss", "large"),
        default="run",
        help="run: run.py's rows (default); rss: bench_rss.py (memory in real use); large: "
        "bench_large.py (1 MiB messages with NSQ's bench_writer/bench_reader) - the same "
        "daemons, rounds and alternation, the arguments after -- going to that script",
    )
    p.add_argument("run_args", nargs="*", help="arguments for run.py (after --)")
    args = p.parse_args(argv)
    if args.bench != "run":
        return delegate(args)
    workdir = Path(tempfile.mkdtemp(prefix="nsqcompare-"))
    daemons: list[tuple[str, str]] = []
    for spec in args.daemon:
        label, sep, cmd = spec.partition("=")
        if not sep or not cmd:
            p.error(f"--daemon {spec!r}: expected LABEL=CMD")
        daemons.append((label, wrapper(cmd, workdir, label)))
    # results[label][(phase, cell label)] -> the values of each run
    results: dict[str, dict[tuple[str, str], list[dict]]] = {label: {} for label, _ in daemons}
    loads: dict[str, list[float]] = {label: [] for label, _ in daemons}
    failures: list[str] = []
    for rnd in range(args.rounds):
        for label, exe in daemons:
            busy = wait_quiet(args.quiet_below, args.quiet_wait) if args.quiet_below else None
            load = os.getloadavg()[0]
            loads[label].append(load)
            cmd = [sys.executable, str(BENCH / "run.py"), f"--nsqd-bin={exe}", "--json", *args.run_args]
            print(
                f"# round {rnd + 1}/{args.rounds} {label}: load {load:.2f}"
                + (f", cpu busy {busy * 100:.0f}% before" if busy is not None else ""),
                flush=True,
            )
            proc = subprocess.run(cmd, capture_output=True, text=True)
            summary = None
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    try:
                        summary = json.loads(line)
                    except ValueError:
                        pass
            if summary is None or proc.returncode != 0:
                failures.append(f"{label} round {rnd + 1}: run.py exited {proc.returncode}")
                sys.stdout.write(proc.stdout[-3000:] + proc.stderr[-2000:])
            if summary is None:
                continue
            for row in summary["rows"]:
                for cell, vals in cells_of(row):
                    results[label].setdefault((row["phase"], cell), []).append(vals)
                if row["test"] == "LAT":
                    print(f"#   latency p50 {row.get('p50_ms')} p99 {row.get('p99_ms')} ms")
                elif row["test"] in ("MEM", "CPU"):
                    text, _ = fmt_cell(row["test"], [cells_of(row)[0][1]])
                    print(f"#   {row['phase']} {row['test']}: {text}")
                else:
                    cpu = row.get("nsqd_cpu")
                    print(
                        f"#   {row['phase']} {row['test']}: {row['ops_per_s']:.0f} msgs/s"
                        + (f", nsqd cpu {cpu * 100:.0f}%" if cpu is not None else "")
                        + (
                            f", MPUB round trip p50 {row['rtt_p50_ms']:.2f} p99 {row['rtt_p99_ms']:.2f} ms"
                            if row.get("rtt_p99_ms") is not None
                            else ""
                        )
                    )
            time.sleep(args.pause)
    ref = daemons[0][0]
    keys = list(results[ref])
    for label, _ in daemons[1:]:
        keys += [k for k in results[label] if k not in keys]
    print(f"\n== medians of {args.rounds} alternating run(s): run.py {' '.join(args.run_args)}")
    out: dict = {"run_args": args.run_args, "rounds": args.rounds, "daemons": {}}
    for label, exe in daemons:
        print(f"   {label}: {exe}  (load before runs: {', '.join(f'{x:.2f}' for x in loads[label])})")
        out["daemons"][label] = {"bin": exe, "loads": loads[label], "phases": {}}
    print(f"{'phase':<11} {'test':<4} " + " ".join(f"{label:>30}" for label, _ in daemons))
    for key in keys:
        cells = []
        base = None
        for label, _ in daemons:
            vals = results[label].get(key, [])
            cell, med = fmt_cell(key[1], vals)
            if label == ref:
                base = med
            elif med is not None and base:
                cell += f" {med / base:.2f}x"
            cells.append(cell)
            out["daemons"][label]["phases"][f"{key[0]} {key[1]}"] = {
                "median": med,
                "all": [v.get("value") for v in vals],
            }
        print(f"{key[0]:<11} {key[1]:<4} " + " ".join(f"{c:>30}" for c in cells))
    print(
        "   (medians; msgs/s with nsqd's CPU in brackets; RTT the publisher's MPUB round trip;"
        " MEM bytes per queued channel copy; CPU nsqd's CPU-seconds per 1M messages published"
        " and consumed; ratio to the first daemon)"
    )
    for f in failures:
        print(f"FAILED: {f}")
    if args.json:
        out["failures"] = failures
        print(json.dumps(out))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
