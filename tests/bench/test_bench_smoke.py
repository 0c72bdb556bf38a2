"""The bench suite still works: bench/run.py --smoke against our nsqd console script.

Checks that the tools run end to end and that every message written in the sequential
phase was read back; it makes no claim about speed (benchmarks, not tests, do that).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NSQD = Path(sys.executable).with_name("nsqd")


def run_bench(script: str, *args: str, timeout: float) -> tuple[str, str]:
    """Run ``bench/<script>`` with our nsqd's flags as given; it must exit 0. Returns its
    stdout and, for failure messages, both of its outputs."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, output
    return proc.stdout, output


@pytest.mark.timeout(300)
def test_bench_run_smoke() -> None:
    stdout, output = run_bench("run.py", "--smoke", "--json", f"--nsqd-bin={NSQD}", timeout=280)
    assert "== nsqpy bench summary" in stdout, output
    assert "RESULT: OK" in stdout, output

    summary = json.loads([ln for ln in stdout.splitlines() if ln.startswith('{"target"')][-1])
    assert summary["failures"] == []
    rows = {(r["phase"], r["test"]): r for r in summary["rows"]}
    assert set(rows) == {
        ("sequential", "PUB"),
        ("sequential", "SUB"),
        ("sequential", "CPU"),
        ("concurrent", "PUB"),
        ("concurrent", "SUB"),
        ("concurrent", "CPU"),
        ("latency", "LAT"),
    }
    assert all(r["rc"] == 0 and r["msgs"] > 0 for r in rows.values()), summary["rows"]
    written = rows[("sequential", "PUB")]["msgs"]
    assert rows[("sequential", "SUB")]["msgs"] == written
    assert rows[("latency", "LAT")]["p99_ms"] is not None


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("flags", "negotiated"),
    [
        pytest.param(
            ["--tls", "--snappy"],
            ("TLS TLSv1.", "snappy"),
            id="tls-snappy",
        ),
        pytest.param(["--deflate"], ("deflate(6)",), id="deflate"),
    ],
)
def test_bench_run_smoke_upgraded(flags: list[str], negotiated: tuple[str, ...]) -> None:
    """run.py --smoke through the connection upgrades: every tool connection negotiates them
    (the tools fail otherwise), and the sequential phase reads back exactly what it wrote."""
    stdout, output = run_bench("run.py", "--smoke", "--json", f"--nsqd-bin={NSQD}", *flags, timeout=100)
    assert "RESULT: OK" in stdout, output
    assert "   upgrade=" + "+".join(f.removeprefix("--") for f in flags) in stdout, output

    summary = json.loads([ln for ln in stdout.splitlines() if ln.startswith('{"target"')][-1])
    assert summary["failures"] == []
    assert summary["upgrade"] == "+".join(
        "deflate(6)" if f == "--deflate" else f.removeprefix("--") for f in flags
    )
    rows = {(r["phase"], r["test"]): r for r in summary["rows"]}
    assert set(rows) == {
        ("sequential", "PUB"),
        ("sequential", "SUB"),
        ("sequential", "CPU"),
        ("concurrent", "PUB"),
        ("concurrent", "SUB"),
        ("concurrent", "CPU"),
        ("latency", "LAT"),
    }
    for r in rows.values():
        assert r["rc"] == 0 and r["msgs"] > 0, summary["rows"]
        if r["test"] == "CPU":  # nsqd's CPU per message of a phase, no tool of its own
            continue
        for part in negotiated:  # what the tool reports it negotiated with nsqd
            assert part in r["upgrade"], summary["rows"]
    written = rows[("sequential", "PUB")]["msgs"]
    assert rows[("sequential", "SUB")]["msgs"] == written
    assert rows[("concurrent", "SUB")]["msgs"] == rows[("concurrent", "PUB")]["msgs"]


@pytest.mark.timeout(120)
def test_bench_run_with_channel_settings() -> None:
    """run.py --channel-config: the readers' channel is made with those settings before each
    phase (a max_age of an hour expires nothing: every message written is read back); a
    setting nsqd refuses fails the run with nsqd's message."""
    cfg = '{"max_age":"1h","max_attempts":5,"dead_letter_topic":"dlq"}'
    stdout, output = run_bench(
        "run.py",
        "--smoke",
        "--no-latency",
        "--json",
        f"--nsqd-bin={NSQD}",
        f"--channel-config={cfg}",
        timeout=100,
    )
    assert "RESULT: OK" in stdout, output
    assert f"# channel sub_bench/ch created with settings {cfg}" in stdout, output
    assert f" channel-config={cfg}" in stdout, output
    summary = json.loads([ln for ln in stdout.splitlines() if ln.startswith('{"target"')][-1])
    rows = {(r["phase"], r["test"]): r for r in summary["rows"]}
    assert rows[("sequential", "SUB")]["msgs"] == rows[("sequential", "PUB")]["msgs"] > 0

    bad = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--smoke",
            "--no-latency",
            f"--nsqd-bin={NSQD}",
            '--channel-config={"max_age":"soon"}',
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert bad.returncode != 0
    assert (
        'FAILED: POST /channel/config?topic=sub_bench&channel=ch: 400 {"message":"invalid max_age'
        in bad.stdout
    )
    for arg in ("--channel-config=[1]", "--channel-config=nope"):
        usage = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "run.py"), arg], cwd=ROOT, capture_output=True, text=True
        )
        assert usage.returncode == 2 and "--channel-config" in usage.stderr


@pytest.mark.timeout(200)
def test_bench_run_fanout_smoke() -> None:
    """run.py --mode fanout: one topic with N channels, each read by its own consumer while
    bench_writer publishes (deliveries summed over channels, the publisher's MPUB round
    trips), then the memory per queued copy on a fresh nsqd with N channels and no consumers."""
    stdout, output = run_bench(
        "run.py",
        "--mode=fanout",
        "--channels=2,5",
        "--runfor=1",
        "--fanout-fill=5000",
        "--json",
        f"--nsqd-bin={NSQD}",
        timeout=180,
    )
    assert "RESULT: OK" in stdout, output
    summary = json.loads([ln for ln in stdout.splitlines() if ln.startswith('{"target"')][-1])
    assert summary["failures"] == []
    rows = {(r["phase"], r["test"]): r for r in summary["rows"]}
    assert set(rows) == {(f"fanout-{n}", t) for n in (2, 5) for t in ("PUB", "DLV", "MEM")}
    for n in (2, 5):
        pub, dlv, mem = (rows[(f"fanout-{n}", t)] for t in ("PUB", "DLV", "MEM"))
        assert pub["rc"] == 0 and pub["msgs"] > 0 and pub["ops_per_s"] > 0, pub
        assert 0 < pub["rtt_p50_ms"] <= pub["rtt_p99_ms"], pub
        assert pub["cpu_s"] > 0 and pub["nsqd_cpu"] is not None, pub
        # every channel got messages, and no consumer more than was published
        assert dlv["rc"] == 0 and dlv["channels"] == n and dlv["ops_per_s"] > 0, dlv
        assert 0 < dlv["per_channel_min"] <= dlv["per_channel_max"] <= pub["msgs"], dlv
        assert dlv["msgs"] <= n * pub["msgs"] and dlv["cpu_s_per_M"] > 0, dlv
        # the fill: whole batches of 200, every channel holding all of them
        assert mem["published"] == 200 * -(-5000 // n // 200), mem
        assert mem["msgs"] == n * mem["published"] and mem["bytes_per_copy"] is not None, mem


@pytest.mark.timeout(200)
def test_bench_run_cpu_per_message_smoke() -> None:
    """With --count, the concurrent reader drains everything the writer publishes, and both
    modes report nsqd's CPU-seconds per 1M messages published and consumed (CPU rows)."""
    stdout, output = run_bench(
        "run.py", "--mode=all", "--count=20000", "--no-latency", "--json", f"--nsqd-bin={NSQD}", timeout=180
    )
    assert "RESULT: OK" in stdout, output
    summary = json.loads([ln for ln in stdout.splitlines() if ln.startswith('{"target"')][-1])
    rows = {(r["phase"], r["test"]): r for r in summary["rows"]}
    for phase in ("sequential", "concurrent"):
        cpu = rows[(phase, "CPU")]
        assert cpu["msgs"] == 20000 and cpu["cpu_s_per_M"] > 0, cpu
        assert rows[(phase, "SUB")]["msgs"] == rows[(phase, "PUB")]["msgs"] == 20000
    assert "CPU-s per 1M msgs" in stdout, output


@pytest.mark.timeout(200)
def test_bench_client_smoke() -> None:
    """bench_client.py (our client library through our nsqd) prints both figures."""
    stdout, output = run_bench("bench_client.py", "--smoke", "--json", f"--nsqd-bin={NSQD}", timeout=180)
    assert "RESULT: OK" in stdout, output
    for test in ("PUB", "SUB"):  # the Go-style result line: msgs/s and MB/s
        line = [ln for ln in stdout.splitlines() if ln.startswith(f"{test}: [bench_client]")]
        assert line and "mb/s" in line[0] and "ops/s" in line[0], output
    summary = json.loads([ln for ln in stdout.splitlines() if ln.startswith('{"tool"')][-1])
    assert summary["failures"] == []
    rows = {r["test"]: r for r in summary["rows"]}
    assert set(rows) == {"PUB", "SUB"}
    assert rows["PUB"]["msgs"] > 0 and rows["SUB"]["msgs"] == rows["PUB"]["msgs"]
    assert all(r["ops_per_s"] > 0 and r["mb_per_s"] > 0 for r in rows.values())


@pytest.mark.timeout(120)
def test_bench_durable_smoke() -> None:
    """bench_durable.py starts our nsqd in the crash-safe mode with a channel and reports the
    acknowledged PUB rate of its publishers."""
    stdout, output = run_bench(
        "bench_durable.py",
        f"--daemon=ours={NSQD}",
        "--channel=c",
        "--publishers=4",
        "--runfor=1",
        timeout=100,
    )
    acked = re.search(r"publishers=4 acked=(\d+) ", stdout)
    assert acked and int(acked.group(1)) > 0, output


@pytest.mark.timeout(120)
def test_bench_crash_smoke() -> None:
    """bench_crash.py kills our nsqd in the crash-safe mode mid-scenario: nothing
    acknowledged and unfinished is lost (it exits 1 otherwise)."""
    stdout, output = run_bench("bench_crash.py", f"--nsqd-bin={NSQD}", "--delay=1", "--drain=3", timeout=100)
    assert "total 0 of 2950 acknowledged and never FIN'd" in stdout, output
    assert "deferred delivered before due 0" in stdout, output


@pytest.mark.timeout(120)
def test_bench_peek_smoke() -> None:
    """bench_peek.py fills a channel and a channel-less topic on disk (a small --count) and
    times /channel/peek and /topic/peek: every answer holds the first n messages in order,
    and the depths are the same after the peeks as before (it exits 1 otherwise)."""
    stdout, output = run_bench(
        "bench_peek.py", "--smoke", "--count=3000", "--json", f"--nsqd-bin={NSQD}", timeout=100
    )
    assert "RESULT: OK" in stdout, output
    assert "depths before and after: unchanged" in stdout, output
    assert "target: /channel/peek n=10 on 3000 disk messages under 50 ms (warm cache)" in stdout, output
    summary = json.loads([ln for ln in stdout.splitlines() if ln.startswith('{"tool"')][-1])
    assert summary["failures"] == [] and summary["count"] == 3000
    rows = {(r["endpoint"], r["n"], r["cache"]): r for r in summary["rows"]}
    assert set(rows) == {
        (endpoint, n, cache)
        for endpoint in ("/channel/peek", "/topic/peek")
        for n in (10, 1000)
        for cache in ("warm", "cold")
    }
    for (_, n, cache), r in rows.items():
        assert r["requests"] == (5 if cache == "warm" else 2), r
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["p95_ms"] <= r["max_ms"], r
        assert r["bytes"] > (30_000 if n == 1000 else 100), r
