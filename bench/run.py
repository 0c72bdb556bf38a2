#!/usr/bin/env python3
"""Start an nsqd, run the bench tools against it, print a summary, stop it.

Like nsqio/nsq's bench.sh / bench.py: bench_writer fills a topic, then bench_reader drains
it ("sequential"); --mode concurrent runs both at once on another topic (--mode all does
both); then bench_latency measures end-to-end latency at a fixed rate. --mode fanout
publishes to one topic with --channels N channels, each drained by its own consumer, and
measures the deliveries summed over channels, the publisher's MPUB round trip and (on a fresh
nsqd) the memory per queued channel copy. Every throughput row also gives nsqd's
CPU-seconds per 1M messages (from /proc/PID/stat). The daemon is our
`nsqd` console script by default, any binary with --nsqd-bin (e.g. the Go nsqd), or an
already running one with --no-start. Exits non-zero if the daemon or any tool failed,
or if messages went missing. --smoke runs everything for about a second, for CI.
--tls, --snappy and --deflate make every tool connection upgrade (for --tls the daemon gets
a throwaway CA-signed certificate, made in the temp dir by bench/certs.py).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import nsqbench as nb  # noqa: E402


def default_nsqd_bin() -> str | None:
    here = Path(sys.executable).with_name("nsqd")
    if here.exists():
        return str(here)
    return shutil.which("nsqd")


def build_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.splitlines()[0])
    d = p.add_argument_group("daemon")
    d.add_argument("--nsqd-bin", default=None, help="nsqd executable (default: the venv's nsqd)")
    d.add_argument("--no-start", action="store_true", help="use a running nsqd at --nsqd-tcp-address")
    d.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150", help="with --no-start")
    d.add_argument("--mem-queue-size", type=int, default=1_000_000, help="nsqd --mem-queue-size")
    d.add_argument("--data-path", default=None, help="nsqd --data-path (default: a temp dir, removed after)")
    d.add_argument(
        "--nsqd-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for nsqd (repeatable), e.g. --nsqd-arg=--max-rdy-count=10000",
    )
    d.add_argument("--startup-timeout", type=nb.parse_duration, default=20.0)
    d.add_argument(
        "--stop-timeout",
        type=nb.parse_duration,
        default=30.0,
        help="wait this long after SIGTERM before SIGKILL",
    )
    d.add_argument("--keep-data", action="store_true", help="keep the temp dir (data and nsqd.log)")
    w = p.add_argument_group("load")
    w.add_argument(
        "--mode",
        choices=("sequential", "concurrent", "all", "latency", "fanout"),
        default="sequential",
        help="throughput phases to run: sequential, concurrent, all (both), "
        "latency (none: only the latency test), fanout (--channels; no latency test unless asked)",
    )
    w.add_argument(
        "--runfor", type=nb.parse_duration, default=10.0, help="writer run time (and concurrent reader)"
    )
    w.add_argument(
        "--reader-runfor",
        type=nb.parse_duration,
        default=60.0,
        help="sequential reader cap; it normally stops once everything written was read",
    )
    w.add_argument(
        "--idle-timeout",
        type=nb.parse_duration,
        default=5.0,
        help="sequential reader stops after this long without messages",
    )
    w.add_argument("--size", type=int, default=100)
    w.add_argument("--batch-size", type=int, default=200)
    w.add_argument("--pipeline", type=int, default=4)
    w.add_argument("--writer-procs", type=int, default=1)
    w.add_argument("--reader-procs", type=int, default=1)
    w.add_argument("--rdy", type=int, default=2500)
    w.add_argument("--count", type=int, default=0, help="writer message limit (0: none)")
    w.add_argument(
        "--channel-config",
        default=None,
        metavar="JSON",
        help="create the readers' channel before each phase and POST this JSON object to "
        "nsqd's /channel/config (queue settings, an nsqpy addition), e.g. "
        """'{"max_age":"1h"}'; '{}' only creates the channel (any nsqd takes that)""",
    )
    fan = p.add_argument_group("fan-out (--mode fanout)")
    fan.add_argument(
        "--channels",
        default="20,100",
        metavar="N[,N…]",
        help="channel counts to run, one phase each (20,100): N channels on one topic, each "
        "drained by its own consumer (bench_reader --channels N over --reader-procs processes) "
        "while bench_writer publishes for --runfor",
    )
    fan.add_argument(
        "--fanout-fill",
        type=int,
        default=2_000_000,
        metavar="COPIES",
        help="memory per queued copy: on a fresh nsqd, publish COPIES/N messages to a topic "
        "with N channels and no consumers; RSS growth / COPIES (0: skip)",
    )
    fan.add_argument(
        "--fanout-mem-queue-size",
        type=int,
        default=0,
        metavar="N",
        help="that nsqd's --mem-queue-size (0: the messages per channel, just enough to keep "
        "them all in memory; a Go nsqd allocates every queue's buffer at this size and sets "
        "its GC's goal from it)",
    )
    lat = p.add_argument_group("latency")
    lat.add_argument("--no-latency", action="store_true")
    lat.add_argument("--latency-rate", type=float, default=10000.0)
    lat.add_argument("--latency-runfor", type=nb.parse_duration, default=None, help="default: --runfor")
    lat.add_argument("--latency-size", type=int, default=None, help="default: --size")
    lat.add_argument(
        "--latency-buffering",
        choices=("off", "default"),
        default="off",
        help="the latency consumer's output buffering: off (IDENTIFY -1, every "
        "message flushed at once) or nsqd's default (16 KiB / 250 ms)",
    )
    up = p.add_argument_group("connection upgrades (every tool connection)")
    up.add_argument(
        "--tls",
        action="store_true",
        help="TLS: start nsqd with a throwaway CA-signed certificate "
        "(--tls-cert/--tls-key) and verify it against that CA in the tools",
    )
    up.add_argument(
        "--tls-root-ca-file",
        default="",
        help="with --no-start --tls: CA to verify the running nsqd with (default: no verification)",
    )
    up.add_argument("--snappy", action="store_true", help="snappy compression")
    up.add_argument("--deflate", action="store_true", help="deflate compression")
    up.add_argument(
        "--deflate-level",
        type=int,
        default=6,
        help="deflate level in [1,9] (6); above 6 the started nsqd gets --max-deflate-level to match",
    )
    p.add_argument(
        "--smoke", action="store_true", help="short run of every test (1s, small counts, mode all) for CI"
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line too")
    args = p.parse_args(nb.go_flags(argv))
    nb.check_upgrade_args(p, args)
    if args.channel_config is not None:
        try:
            doc = json.loads(args.channel_config)
        except ValueError as e:
            p.error(f"--channel-config: not JSON: {e}")
        if not isinstance(doc, dict):
            p.error("--channel-config: a JSON object of settings")
        if args.no_start:
            p.error("--channel-config needs the nsqd run.py starts (its HTTP address)")
    if args.smoke:
        args.mode = "all"
        args.runfor = 1.0
        args.reader_runfor = min(args.reader_runfor, 20.0)
        args.idle_timeout = min(args.idle_timeout, 3.0)
        args.count = args.count or 20_000
        args.latency_rate = min(args.latency_rate, 1000.0)
        args.latency_runfor = 1.0
    try:
        args.channels = [int(x) for x in str(args.channels).split(",") if x.strip()]
    except ValueError:
        p.error("--channels: channel counts separated by commas, e.g. 20,100")
    if not args.channels or min(args.channels) < 1:
        p.error("--channels: counts >= 1")
    if args.mode == "fanout" and args.no_start:
        p.error("--mode fanout needs the nsqd run.py starts (its HTTP address, its RSS)")
    if args.mode == "fanout" and nb.upgrade_wanted(args):
        p.error("--mode fanout runs over plain TCP (no --tls, --snappy, --deflate)")
    if args.latency_runfor is None:
        args.latency_runfor = args.runfor
    if args.latency_size is None:
        args.latency_size = max(args.size, 8)
    return args


# ------------------------------------------------------------------------- the daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (Linux only): [0] is the state,
    [1] the parent pid, [11:15] utime, stime, cutime, cstime in clock ticks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 14 else None


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process from /proc (Linux only)."""
    fields = _proc_stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int | None = None) -> float | None:
    """CPU seconds (user + system, reaped children included) of ``root`` (this process)
    and all its descendants, e.g. a JVM with its Python workers, and nsqd. Unlike wall time
    it does not grow when the machine is shared (steal time); None off Linux."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for name in pids:
        fields = _proc_stat(name)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
            ticks[int(name)] = sum(int(x) for x in fields[11:15])
    total, todo = 0, [os.getpid() if root is None else root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def steal_ticks() -> tuple[int, int] | None:
    """(steal, all) CPU ticks of the machine so far, from /proc/stat (None off Linux)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def proc_peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def http_ping(host: str, port: int, timeout: float = 2.0) -> bool:
    """GET /ping answered 200."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/ping")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def proc_rss_mb(pid: int) -> float | None:
    """Resident set size of a process now, MiB (Linux only)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def http_get_json(addr: str, path: str, timeout: float = 30.0) -> dict:
    """GET a JSON document from nsqd's HTTP API (Go's 1.x and ours answer alike)."""
    host, port = nb.parse_addr(addr)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status} {body[:200]!r}")
        doc = json.loads(body)
        return doc.get("data", doc) if isinstance(doc, dict) else {}
    finally:
        conn.close()


def topic_depths(addr: str, topic: str) -> tuple[int, dict[str, int]]:
    """A topic's depth and its channels' depths, from /stats."""
    doc = http_get_json(addr, f"/stats?format=json&topic={topic}&include_clients=false")
    for t in doc.get("topics") or []:
        if t.get("topic_name") == topic:
            return t.get("depth", 0), {c["channel_name"]: c.get("depth", 0) for c in t.get("channels") or []}
    return 0, {}


def http_post(addr: str, path: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, bytes]:
    """POST to nsqd's HTTP API: (status, body)."""
    host, port = nb.parse_addr(addr)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Daemon:
    """An nsqd child process on free loopback ports, logging to a file."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args = args
        self.tcp = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.data = Path(args.data_path) if args.data_path else workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "nsqd.log"
        self.proc: subprocess.Popen | None = None
        self.exit_note = ""
        self.peak_rss: float | None = None
        self.tls_dir = workdir / "tls"
        self.tls_ca = ""
        #: connect to the HTTP listener too when waiting for the start-up (our nsqd then
        #: loads its HTTP server: a bench of the idle daemon's memory leaves it alone)
        self.probe_http = True
        #: False: wait for the listeners' log lines instead of connecting (our nsqd loads its
        #: TCP protocol with the first connection: an idle daemon's memory is measured before)
        self.probe_tcp = True

    def start(self) -> None:
        cmd = [
            self.args.nsqd_bin,
            f"--tcp-address={self.tcp}",
            f"--http-address={self.http}",
            f"--data-path={self.data}",
            f"--mem-queue-size={self.args.mem_queue_size}",
        ]
        # (bench_client.py reuses this class with options of its own, without these flags)
        if getattr(self.args, "tls", False):
            try:
                from certs import make_server_pki

                pki = make_server_pki(self.tls_dir)
            except ImportError as exc:
                raise RuntimeError(f"--tls needs the cryptography package ({exc})") from exc
            # the HTTPS listener comes with a certificate: on a free port, not 0.0.0.0:4152
            cmd += [
                f"--tls-cert={pki.server_cert}",
                f"--tls-key={pki.server_key}",
                "--https-address=127.0.0.1:0",
            ]
            self.tls_ca = pki.ca_cert
        level = getattr(self.args, "deflate_level", 6)
        if getattr(self.args, "deflate", False) and level > 6:  # nsqd's default maximum
            cmd.append(f"--max-deflate-level={level}")
        cmd += self.args.nsqd_arg
        print("# starting " + " ".join(cmd), flush=True)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.args.startup_timeout
        # both listeners up means startup work is over, so it does not count against phase
        # one; the HTTP one must answer /ping (our nsqd starts its HTTP server with the first
        # connection: that start is start-up work too)
        if not self.probe_tcp:
            self._wait_for_log(("TCP: listening on", "HTTP: listening on"), deadline)
        probes = [self.tcp] if self.probe_tcp else []
        if self.probe_http:
            probes.append(self.http)
        for addr in probes:
            host, port = nb.parse_addr(addr)
            while True:
                if self.proc.poll() is not None:
                    code = self.proc.returncode
                    raise RuntimeError(f"nsqd exited during startup with code {code}")
                try:
                    if addr == self.tcp:
                        with socket.create_connection((host, port), timeout=0.5):
                            break
                    elif http_ping(host, port):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nsqd did not listen on {addr} within {self.args.startup_timeout}s")
                time.sleep(0.05)

    def _wait_for_log(self, lines: tuple[str, ...], deadline: float) -> None:
        """Wait until the daemon's log has each of ``lines`` (ours and Go's nsqd log both)."""
        assert self.proc is not None
        while True:
            text = self.log_path.read_text(errors="replace")
            if all(line in text for line in lines):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"nsqd exited during startup with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nsqd did not log {lines} within {self.args.startup_timeout}s")
            time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL after --stop-timeout. True if it exited 0 by itself."""
        if self.proc is None:
            return True
        ok = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            try:
                self.proc.wait(timeout=self.args.stop_timeout)
                took = time.monotonic() - t0
                self.exit_note = f"exited {self.proc.returncode} {took:.2f}s after SIGTERM"
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.exit_note = f"did not exit within {self.args.stop_timeout}s of SIGTERM; killed"
                ok = False
        else:
            self.exit_note = f"had already exited with code {self.proc.returncode}"
            ok = False
        if self.proc.returncode != 0:
            ok = False
        self.log.close()
        return ok

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


# ------------------------------------------------------------------------- the tools


def tool_cmd(tool: str, argv: list[str]) -> list[str]:
    return [sys.executable, str(BENCH / f"{tool}.py"), *argv, "--json"]


def finish_tool(tool: str, proc: subprocess.Popen, timeout: float) -> tuple[int, dict]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n[{tool}] killed by run.py after {timeout:.0f}s\n"
        proc.returncode = -9
    sys.stdout.write(err)
    data: dict = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                pass
    if not data and out.strip():
        sys.stdout.write(out)
    sys.stdout.flush()
    return proc.returncode, data


def start_tool(tool: str, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(tool_cmd(tool, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Runner:
    def __init__(
        self, args: argparse.Namespace, tcp: str, daemon: Daemon | None, workdir: Path | None = None
    ) -> None:
        self.args = args
        self.tcp = tcp
        self.daemon = daemon
        self.workdir = workdir
        self.rows: list[dict] = []
        self.failures: list[str] = []
        self.warnings: list[str] = []
        self.suffix = "" if daemon else "_" + secrets.token_hex(3)

    def cpu(self) -> float | None:
        return proc_cpu_seconds(self.daemon.pid) if self.daemon and self.daemon.pid else None

    def upgrade_argv(self) -> list[str]:
        """The tools' upgrade flags; the CA is the daemon's own one when run.py made it."""
        a = self.args
        argv = []
        if a.tls:
            argv.append("--tls")
            ca = self.daemon.tls_ca if self.daemon else a.tls_root_ca_file
            argv.append(f"--tls-root-ca-file={ca}" if ca else "--tls-insecure-skip-verify")
        if a.snappy:
            argv.append("--snappy")
        if a.deflate:
            argv += ["--deflate", f"--deflate-level={a.deflate_level}"]
        return argv

    def writer_argv(self, topic: str) -> list[str]:
        a = self.args
        argv = [
            f"--nsqd-tcp-address={self.tcp}",
            f"--topic={topic}",
            f"--runfor={a.runfor}",
            f"--size={a.size}",
            f"--batch-size={a.batch_size}",
            f"--procs={a.writer_procs}",
            f"--pipeline={a.pipeline}",
            *self.upgrade_argv(),
        ]
        if a.count:
            argv.append(f"--count={a.count}")
        return argv

    def reader_argv(self, topic: str, runfor: float, count: int = 0, idle: float = 0.0) -> list[str]:
        a = self.args
        argv = [
            f"--nsqd-tcp-address={self.tcp}",
            f"--topic={topic}",
            "--channel=ch",
            f"--runfor={runfor}",
            f"--size={a.size}",
            f"--rdy={a.rdy}",
            f"--procs={a.reader_procs}",
            *self.upgrade_argv(),
        ]
        if count:
            argv.append(f"--count={count}")
        if idle:
            argv.append(f"--idle-timeout={idle}")
        return argv

    def row(
        self,
        phase: str,
        test: str,
        rc: int,
        data: dict,
        cpu0: float | None,
        busy_s: float | None = None,
        **extra,
    ) -> dict:
        """Record one result. nsqd cpu = daemon CPU seconds used while the tool ran, divided
        by the tool's measured duration (busy_s overrides it), so 100% is one full core;
        cpu_s its CPU-seconds, cpu_s_per_M those per 1M of the row's messages."""
        cpu1 = self.cpu()
        busy = busy_s if busy_s is not None else data.get("duration_s") or 0.0
        if not data.get("msgs") or busy < 0.5:
            busy = 0.0  # nothing happened, or too short to tell: the figure would be noise
        r = {
            "phase": phase,
            "test": test,
            "rc": rc,
            "msgs": data.get("msgs", 0),
            "ops_per_s": data.get("ops_per_s", 0.0),
            "mb_per_s": data.get("mb_per_s", 0.0),
            "duration_s": data.get("duration_s", 0.0),
            "nsqd_cpu": None,
            "upgrade": data.get("negotiated", ""),
        }
        if cpu0 is not None and cpu1 is not None and busy > 0:
            r["nsqd_cpu"] = (cpu1 - cpu0) / busy
        if cpu0 is not None and cpu1 is not None:
            r["cpu_s"] = cpu1 - cpu0
            if r["msgs"]:
                r["cpu_s_per_M"] = r["cpu_s"] / r["msgs"] * 1e6
        r.update(extra)
        self.rows.append(r)
        if rc != 0:
            errs = data.get("errors") or [f"exit code {rc}"]
            self.failures.append(f"{phase} {test}: " + "; ".join(map(str, errs)))
        return r

    def prepare_channel(self, topic: str) -> None:
        """--channel-config: the readers' channel ``ch`` created, with those settings."""
        a = self.args
        if a.channel_config is None or self.daemon is None:
            return
        steps = [f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=ch"]
        if json.loads(a.channel_config):
            steps.append(f"/channel/config?topic={topic}&channel=ch")
        for path in steps:
            body = a.channel_config.encode() if "config" in path else b""
            status, answer = http_post(self.daemon.http, path, body)
            if status != 200:
                self.failures.append(f"POST {path}: {status} {answer.decode(errors='replace')}")
                raise RuntimeError("channel settings refused")
        print(f"# channel {topic}/ch created with settings {a.channel_config}", flush=True)

    def check_daemon(self, phase: str) -> None:
        if self.daemon and not self.daemon.alive():
            code = self.daemon.proc.returncode if self.daemon.proc else None
            self.failures.append(f"nsqd died during {phase} (exit code {code})")
            raise RuntimeError("nsqd died")

    def sequential(self) -> None:
        a = self.args
        topic = "sub_bench" + self.suffix
        print(f"# sequential: write {topic} for {a.runfor}s, then read it back", flush=True)
        self.prepare_channel(topic)
        cpu0 = self.cpu()
        sys.stdout.write("PUB: ")
        sys.stdout.flush()
        writer = start_tool("bench_writer", self.writer_argv(topic))
        rc, w = finish_tool("bench_writer", writer, a.runfor + 180)
        self.row("sequential", "PUB", rc, w, cpu0)
        self.check_daemon("sequential PUB")
        written = w.get("msgs", 0)
        if rc == 0 and not written:
            self.failures.append("sequential PUB: no messages published")
        if not written:
            return
        cpu0 = self.cpu()
        sys.stdout.write("SUB: ")
        sys.stdout.flush()
        argv = self.reader_argv(topic, a.reader_runfor, count=written, idle=a.idle_timeout)
        rc, r = finish_tool("bench_reader", start_tool("bench_reader", argv), a.reader_runfor + 120)
        got = r.get("msgs", 0)
        reasons = r.get("stop_reasons", [])
        sub = self.row("sequential", "SUB", rc, r, cpu0, expected=written, stop=",".join(reasons))
        self.check_daemon("sequential SUB")
        pub = self.rows[-2]
        if got == written and pub.get("cpu_s") is not None and sub.get("cpu_s") is not None:
            self.cpu_row("sequential", written, pub["cpu_s"] + sub["cpu_s"])
        if rc == 0 and got < written:
            msg = f"sequential SUB: read {got} of {written} messages (stopped by {','.join(reasons)})"
            if "idle" in reasons:
                self.failures.append(msg + f": nothing arrived for {a.idle_timeout}s")
            else:
                self.warnings.append(msg + "; raise --reader-runfor to drain everything")
        elif got > written:
            self.failures.append(f"sequential SUB: read {got} messages but only {written} were published")

    def concurrent(self) -> None:
        a = self.args
        topic = "sub_bench_concurrent" + self.suffix
        print(f"# concurrent: write and read {topic} at the same time for {a.runfor}s", flush=True)
        self.prepare_channel(topic)
        cpu0 = self.cpu()
        if a.count:  # the reader drains what the writer will publish, then stops
            expected = self.expected_written()
            argv = self.reader_argv(topic, a.runfor + a.reader_runfor, count=expected, idle=a.idle_timeout)
        else:
            argv = self.reader_argv(topic, a.runfor)
        reader = start_tool("bench_reader", argv)
        writer = start_tool("bench_writer", self.writer_argv(topic))
        sys.stdout.write("PUB: ")
        rc_w, w = finish_tool("bench_writer", writer, a.runfor + 180)
        sys.stdout.write("SUB: ")
        rc_r, r = finish_tool("bench_reader", reader, a.runfor + a.reader_runfor + 180)
        busy = max(w.get("duration_s", 0.0), r.get("duration_s", 0.0)) or None
        pub = self.row("concurrent", "PUB", rc_w, w, cpu0, busy_s=busy)
        self.row("concurrent", "SUB", rc_r, r, None)
        self.check_daemon("concurrent")
        done = min(w.get("msgs", 0), r.get("msgs", 0))
        if done and pub.get("cpu_s") is not None:
            self.cpu_row("concurrent", done, pub["cpu_s"])
        if rc_w == 0 and not w.get("msgs"):
            self.failures.append("concurrent PUB: no messages published")
        if rc_r == 0 and not r.get("msgs"):
            self.failures.append("concurrent SUB: no messages received")

    def expected_written(self) -> int:
        """What bench_writer publishes with --count: whole batches, --count split over procs."""
        a = self.args
        per_proc = -(-a.count // a.writer_procs)
        return a.writer_procs * -(-per_proc // a.batch_size) * a.batch_size

    def cpu_row(self, phase: str, msgs: int, cpu_s: float) -> None:
        """nsqd's CPU-seconds per 1M messages published and consumed in a phase."""
        self.rows.append(
            {
                "phase": phase,
                "test": "CPU",
                "rc": 0,
                "msgs": msgs,
                "ops_per_s": 0.0,
                "mb_per_s": 0.0,
                "duration_s": 0.0,
                "nsqd_cpu": None,
                "upgrade": "",
                "cpu_s": cpu_s,
                "cpu_s_per_M": cpu_s / msgs * 1e6,
            }
        )

    def make_channels(self, http_addr: str, topic: str, n: int) -> None:
        """Create ``topic`` and its channels ch0..ch<n-1> over HTTP (any nsqd takes that)."""
        paths = [f"/topic/create?topic={topic}"] + [
            f"/channel/create?topic={topic}&channel=ch{i}" for i in range(n)
        ]
        for path in paths:
            status, answer = http_post(http_addr, path)
            if status != 200:
                self.failures.append(f"POST {path}: {status} {answer.decode(errors='replace')}")
                raise RuntimeError("channel creation refused")

    def fanout(self, n: int) -> None:
        """N channels on one topic, each drained by its own consumer, while bench_writer
        publishes: deliveries summed over channels, the publisher's MPUB round trip."""
        a = self.args
        assert self.daemon is not None
        phase = f"fanout-{n}"
        topic = f"fanout_{n}" + self.suffix
        print(f"# {phase}: write {topic} for {a.runfor}s, {n} channels each read by a consumer", flush=True)
        self.make_channels(self.daemon.http, topic, n)
        cpu0 = self.cpu()
        argv = [
            f"--nsqd-tcp-address={self.tcp}",
            f"--topic={topic}",
            "--channel=ch",
            f"--channels={n}",
            f"--runfor={a.runfor}",
            f"--size={a.size}",
            f"--rdy={a.rdy}",
            f"--procs={a.reader_procs}",
        ]
        reader = start_tool("bench_reader", argv)
        writer = start_tool("bench_writer", self.writer_argv(topic))
        sys.stdout.write("PUB: ")
        rc_w, w = finish_tool("bench_writer", writer, a.runfor + 180)
        sys.stdout.write("DLV: ")
        rc_r, r = finish_tool("bench_reader", reader, a.runfor + 180)
        busy = max(w.get("duration_s", 0.0), r.get("duration_s", 0.0)) or None
        rtt = w.get("rtt") or {}
        pub = self.row(
            phase,
            "PUB",
            rc_w,
            w,
            cpu0,
            busy_s=busy,
            channels=n,
            rtt_p50_ms=rtt.get("p50_ms"),
            rtt_p99_ms=rtt.get("p99_ms"),
            rtt_max_ms=rtt.get("max_ms"),
        )
        dlv = self.row(
            phase,
            "DLV",
            rc_r,
            r,
            None,
            channels=n,
            per_channel_min=r.get("per_channel_min"),
            per_channel_max=r.get("per_channel_max"),
        )
        for row, d in ((pub, w), (dlv, r)):  # the load generator's own CPU, 100% = a core
            if d.get("tool_cpu_s") is not None and d.get("duration_s"):
                row["tool_cpu"] = d["tool_cpu_s"] / d["duration_s"]
        if pub.get("cpu_s") is not None and dlv["msgs"]:
            dlv["cpu_s_per_M"] = pub["cpu_s"] / dlv["msgs"] * 1e6  # per 1M deliveries
        self.check_daemon(phase)
        if rc_w == 0 and not w.get("msgs"):
            self.failures.append(f"{phase} PUB: no messages published")
        if rc_r == 0 and not r.get("msgs"):
            self.failures.append(f"{phase} DLV: no messages received")
        # the backlog the consumers did not drain would weigh on the next phase
        status, answer = http_post(self.daemon.http, f"/topic/delete?topic={topic}", timeout=120)
        if status != 200:
            self.warnings.append(f"{phase}: deleting {topic}: {status} {answer[:200]!r}")

    def fanout_memory(self, n: int) -> None:
        """Memory per queued copy: a fresh nsqd, a topic with N channels and no consumers,
        --fanout-fill/N messages published; (RSS after every channel holds them all - RSS
        before) / copies."""
        a = self.args
        per = a.fanout_fill // n
        if per < 1:
            return
        phase = f"fanout-{n}"
        # every message stays in memory: the topic's and each channel's queue hold them all
        # (a Go nsqd allocates each queue's buffer, 8 B a slot, at that size)
        size = a.fanout_mem_queue_size or per + a.writer_procs * a.batch_size
        opts = {**vars(a), "mem_queue_size": size, "data_path": None}
        mem = Daemon(argparse.Namespace(**opts), Path(tempfile.mkdtemp(prefix=f"mem{n}-", dir=self.workdir)))
        topic = f"fanmem_{n}"
        print(f"# {phase} memory: {per} messages to {topic} with {n} channels, no consumers", flush=True)
        try:
            mem.start()
            # our nsqd loads its TCP protocol, topics and channels with their first use
            self.make_channels(mem.http, "fanmem_warmup", 2)
            warm = [
                f"--nsqd-tcp-address={mem.tcp}",
                "--topic=fanmem_warmup",
                f"--count={a.batch_size}",
                f"--batch-size={a.batch_size}",
                f"--size={a.size}",
            ]
            finish_tool("bench_writer", start_tool("bench_writer", warm), 60)
            self.make_channels(mem.http, topic, n)
            time.sleep(0.5)
            rss0 = proc_rss_mb(mem.pid or 0)
            argv = [
                f"--nsqd-tcp-address={mem.tcp}",
                f"--topic={topic}",
                f"--count={per}",
                "--runfor=3600",
                f"--size={a.size}",
                f"--batch-size={a.batch_size}",
                f"--procs={a.writer_procs}",
                f"--pipeline={a.pipeline}",
            ]
            sys.stdout.write("PUB: ")
            rc, w = finish_tool("bench_writer", start_tool("bench_writer", argv), 600)
            written = w.get("msgs", 0)
            deadline = time.monotonic() + 300
            while True:  # a Go nsqd copies behind the publisher: wait for every channel
                tdepth, depths = topic_depths(mem.http, topic)
                if tdepth == 0 and len(depths) == n and all(d >= written for d in depths.values()):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{phase} memory: channels did not fill ({tdepth}, {depths})")
                time.sleep(0.2)
            time.sleep(1.0)
            rss1 = proc_rss_mb(mem.pid or 0)
        except RuntimeError as exc:
            self.failures.append(str(exc))
            return
        finally:
            mem.stop()
        copies = written * n
        per_copy = None
        if rss0 is not None and rss1 is not None and copies:
            per_copy = (rss1 - rss0) * 1048576 / copies
        self.rows.append(
            {
                "phase": phase,
                "test": "MEM",
                "rc": rc,
                "msgs": copies,
                "ops_per_s": 0.0,
                "mb_per_s": 0.0,
                "duration_s": 0.0,
                "nsqd_cpu": None,
                "upgrade": "",
                "channels": n,
                "published": written,
                "rss_before_mb": rss0,
                "rss_after_mb": rss1,
                "bytes_per_copy": per_copy,
            }
        )
        if rc != 0 or not written:
            self.failures.append(f"{phase} memory: the writer failed (rc={rc}, {written} written)")

    def latency(self) -> None:
        a = self.args
        topic = "latency_bench" + self.suffix
        print(
            f"# latency: {a.latency_rate:g} msgs/s of {a.latency_size}B for {a.latency_runfor}s on {topic}",
            flush=True,
        )
        argv = [
            f"--nsqd-tcp-address={self.tcp}",
            f"--topic={topic}",
            f"--rate={a.latency_rate}",
            f"--runfor={a.latency_runfor}",
            f"--size={a.latency_size}",
            *self.upgrade_argv(),
        ]
        if a.latency_buffering == "default":
            argv += ["--output-buffer-size=0", "--output-buffer-timeout=0"]
        cpu0 = self.cpu()
        rc, d = finish_tool("bench_latency", start_tool("bench_latency", argv), a.latency_runfor + 120)
        r = self.row(
            "latency",
            "LAT",
            rc,
            {"msgs": d.get("count", 0), "errors": d.get("errors"), "negotiated": d.get("negotiated", "")},
            cpu0,
            busy_s=(d.get("publisher") or {}).get("publish_s"),
        )
        for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "published", "received"):
            r[k] = d.get(k)
        r["rate"] = a.latency_rate
        self.check_daemon("latency")


def fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def print_summary(args: argparse.Namespace, runner: Runner, target: str, daemon: Daemon | None) -> None:
    print()
    print(f"== nsqpy bench summary: {target}")
    print(
        f"   size={args.size}B batch={args.batch_size} writer-procs={args.writer_procs} "
        f"reader-procs={args.reader_procs} pipeline={args.pipeline} rdy={args.rdy}"
        f"{f' mem-queue-size={args.mem_queue_size}' if daemon else ''}"
        f"{' (smoke)' if args.smoke else ''}"
        f"{f' channel-config={args.channel_config}' if args.channel_config is not None else ''}"
    )
    upgrade = nb.upgrade_name(args)
    negotiated = sorted({r["upgrade"] for r in runner.rows if r.get("upgrade")})
    if upgrade == "none":
        print("   upgrade=none (plain TCP)")
    else:  # what the tools report they negotiated (they fail if nsqd refuses an upgrade)
        print(f"   upgrade={upgrade}, negotiated on every tool connection: {'; '.join(negotiated) or '-'}")
    print(
        f"{'phase':<11} {'test':<4} {'msgs':>10} {'msgs/s':>12} {'MB/s':>9} {'secs':>7} "
        f"{'nsqd cpu':>9}  notes"
    )
    for r in runner.rows:
        if r["test"] == "LAT":
            continue
        notes = []
        if r.get("expected") is not None:
            notes.append(f"of {r['expected']} written; stop={r.get('stop', '')}")
        if r.get("cpu_s_per_M") is not None:
            what = "deliveries" if r["test"] == "DLV" else "msgs"
            notes.append(f"nsqd {r['cpu_s_per_M']:.3f} CPU-s per 1M {what}")
        if r.get("rtt_p99_ms") is not None:
            notes.append(f"MPUB round trip p50 {r['rtt_p50_ms']:.3f}ms p99 {r['rtt_p99_ms']:.3f}ms")
        if r.get("tool_cpu") is not None:
            notes.append(f"{'writer' if r['test'] == 'PUB' else 'readers'} cpu {r['tool_cpu'] * 100:.0f}%")
        if r.get("per_channel_min") is not None:
            notes.append(f"{r['channels']} channels, {r['per_channel_min']}..{r['per_channel_max']} each")
        if r["test"] == "MEM":
            notes.append(
                f"{r['channels']} channels x {r['published']} msgs: RSS {fmt(r['rss_before_mb'], '.1f')} -> "
                f"{fmt(r['rss_after_mb'], '.1f')} MiB, {fmt(r['bytes_per_copy'], '.0f')} B per queued copy"
            )
        note = "; ".join(notes)
        if r["rc"]:
            note = f"FAILED (rc={r['rc']}) " + note
        cpu = "-" if r["nsqd_cpu"] is None else f"{r['nsqd_cpu'] * 100:.0f}%"
        print(
            f"{r['phase']:<11} {r['test']:<4} {r['msgs']:>10} {r['ops_per_s']:>12.1f} "
            f"{r['mb_per_s']:>9.3f} {r['duration_s']:>7.2f} {cpu:>9}  {note}"
        )
    for r in runner.rows:
        if r["test"] != "LAT":
            continue
        print(
            f"latency     {r.get('rate') or 0:g} msgs/s (buffering {args.latency_buffering}): "
            f"n={r['msgs']} "
            f"p50={fmt(r.get('p50_ms'), '.3f')}ms "
            f"p90={fmt(r.get('p90_ms'), '.3f')}ms p99={fmt(r.get('p99_ms'), '.3f')}ms "
            f"p99.9={fmt(r.get('p999_ms'), '.3f')}ms max={fmt(r.get('max_ms'), '.3f')}ms"
            f"{'' if r['nsqd_cpu'] is None else '  nsqd cpu %.0f%%' % (r['nsqd_cpu'] * 100)}"
            f"{'  FAILED (rc=%d)' % r['rc'] if r['rc'] else ''}"
        )
    if daemon and daemon.pid:
        print(f"nsqd: pid {daemon.pid}, peak RSS {fmt(daemon.peak_rss, '.0f')} MB, {daemon.exit_note}")
    for w in runner.warnings:
        print(f"WARNING: {w}")
    for f in runner.failures:
        print(f"FAILED: {f}")
    print("RESULT: " + ("FAIL" if runner.failures else "OK"), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="nsqbench-"))
    daemon: Daemon | None = None
    if args.no_start:
        tcp = args.nsqd_tcp_address
        target = f"running nsqd at {tcp}"
    else:
        args.nsqd_bin = args.nsqd_bin or default_nsqd_bin()
        if not args.nsqd_bin:
            print("FAILED: no nsqd found (use --nsqd-bin PATH or --no-start)", file=sys.stderr)
            return 2
        daemon = Daemon(args, workdir)
        tcp = daemon.tcp
        target = args.nsqd_bin
    runner = Runner(args, tcp, daemon, workdir)
    try:
        if daemon:
            try:
                daemon.start()
            except Exception as exc:
                runner.failures.append(f"nsqd: {exc}")
                print(daemon.log_tail(), file=sys.stderr)
                raise
            print(
                f"# nsqd pid {daemon.pid} tcp {daemon.tcp} http {daemon.http} data {daemon.data}", flush=True
            )
        try:
            if args.mode in ("sequential", "all"):
                runner.sequential()
            if args.mode in ("concurrent", "all"):
                runner.concurrent()
            if args.mode == "fanout":
                for n in args.channels:
                    runner.fanout(n)
                if args.fanout_fill:
                    for n in args.channels:
                        runner.fanout_memory(n)
            if (not args.no_latency and args.mode != "fanout") or args.mode == "latency":
                runner.latency()
        except RuntimeError:
            pass
    except Exception as exc:  # already recorded, or unexpected: record and go on to cleanup
        if not runner.failures:
            runner.failures.append(f"run.py: {type(exc).__name__}: {exc}")
    finally:
        if daemon and daemon.proc:
            daemon.peak_rss = proc_peak_rss_mb(daemon.pid)
            if not daemon.stop():
                runner.failures.append(f"nsqd shutdown: {daemon.exit_note}")
            if runner.failures:
                tail = daemon.log_tail()
                if tail:
                    print("# nsqd log tail:\n" + tail)
        print_summary(args, runner, target, daemon)
        if args.json:
            print(
                json.dumps(
                    {
                        "target": target,
                        "upgrade": nb.upgrade_name(args),
                        "rows": runner.rows,
                        "failures": runner.failures,
                        "warnings": runner.warnings,
                        "nsqd_exit": daemon.exit_note if daemon else None,
                    }
                )
            )
        if args.keep_data:
            print(f"# kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if runner.failures else 0


if __name__ == "__main__":
    sys.exit(main())
