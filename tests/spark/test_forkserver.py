"""The fork server and its launcher (nsqpy.spark.forkserver, nsqpy.spark._launch): a process
asked of the server behaves as `python -m module` would (arguments, working directory,
environment, standard streams, exit status, signals), dies with its launcher or the server,
and anything the server cannot stand in for runs as a new interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from nsqpy.spark import _launch, forkserver
from nsqpy.spark.session import python_launcher

pytestmark = pytest.mark.skipif(
    not forkserver.SUPPORTED, reason="no fork server on this OS: it needs Linux's prctl and SCM_RIGHTS"
)

PREFIX = "nsqpy_fsprobe"

#: What a probe module reports about the process that runs it (JSON on stdout), then it
#: does what its first argument says.
PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read().decode(errors="replace")
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
        "path0": sys.path[0], "env": os.environ.get("PROBE_VALUE"), "comm": comm,
        "forked": "nsqpy.spark.forkserver" in cmdline, "optimize": sys.flags.optimize,
        "hash": hash("nsqpy"), "encoding": sys.stdout.encoding, "main": __name__,
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
    }), flush=True)
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "echo":
        print(sys.stdin.readline().strip().upper(), flush=True)
    elif what == "exit":
        sys.exit(int(sys.argv[2]))
    elif what == "message":
        sys.exit("the probe gives up")
    elif what == "raise":
        raise RuntimeError("probe failure")
    elif what == "sleep":
        open(sys.argv[2], "w").close()
        time.sleep(120)
    elif what == "interrupt":
        raise KeyboardInterrupt
    elif what == "signals":
        import signal
        ign = signal.SIG_IGN
        print(signal.getsignal(signal.SIGTERM) == ign, signal.getsignal(signal.SIGINT) == ign)
    elif what == "limits":
        import resource
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], resource.getrlimit(resource.RLIMIT_CORE)[0])
    elif what == "unbuffered":
        sys.stdout.write("written, not flushed\\n")
        os._exit(0)
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[forkserver.ForkServer]:
    directory = tmp_path_factory.mktemp("forkserver")
    srv = forkserver.start(str(directory))
    assert srv is not None
    try:
        yield srv
    finally:
        srv.stop()
    assert srv.proc.returncode is not None


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    (tmp_path / f"{PREFIX}_a.py").write_text(PROBE)
    return tmp_path


def launch(
    srv: forkserver.ForkServer,
    probe_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    module: str = f"{PREFIX}_a",
    **kw: Any,
) -> subprocess.Popen[str]:
    """The launcher (as nsqpy-python runs it, with the probes' prefix) for `-m module args`."""
    cmd = [
        sys.executable,
        "-IS",
        _launch.__file__,
        srv.socket_path,
        srv.fingerprint_path,
        sys.executable,
        PREFIX,
        "-m",
        module,
        *args,
    ]
    e = dict(os.environ)
    e.pop("PYTHONPATH", None)
    e.update(env or {})
    then = kw.pop("preexec_fn", None)

    def preexec() -> None:
        # the launcher starts with the signals of an interactive shell's command, whatever
        # this test process inherited (a background job's shell ignores SIGINT for it)
        for sig in _launch.FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        if then is not None:
            then()

    return subprocess.Popen(
        cmd,
        cwd=probe_dir,
        env=e,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
        **kw,
    )


def run(
    srv: forkserver.ForkServer, probe_dir: Path, *args: str, stdin: str = "", **kw: Any
) -> tuple[int, dict[str, Any], str, str]:
    p = launch(srv, probe_dir, *args, **kw)
    out, err = p.communicate(stdin, timeout=60)
    first, _, rest = out.partition("\n")
    return p.returncode, json.loads(first) if first else {}, rest, err


def test_a_forked_process_is_what_python_dash_m_would_be(
    server: forkserver.ForkServer, probe_dir: Path
) -> None:
    code, info, rest, err = run(server, probe_dir, "echo", env={"PROBE_VALUE": "v1"}, stdin="hello\n")
    assert (code, rest, err) == (0, "HELLO\n", "")
    assert info["forked"] and info["ppid"] == server.proc.pid
    # the same as a new interpreter: arguments, path, working directory, environment, name
    plain = subprocess.run(
        [sys.executable, "-m", f"{PREFIX}_a"],
        cwd=probe_dir,
        capture_output=True,
        text=True,
        env={**os.environ, "PROBE_VALUE": "v1", "PYTHONHASHSEED": "0"},
        check=True,
    )
    fresh = json.loads(plain.stdout.splitlines()[0])
    assert not fresh["forked"]
    for key in ("path0", "cwd", "env", "main", "encoding", "hash", "optimize"):
        assert info[key] == fresh[key], key
    assert info["argv"] == [str(probe_dir / f"{PREFIX}_a.py"), "echo"]
    assert fresh["argv"] == [str(probe_dir / f"{PREFIX}_a.py")]
    assert info["comm"] == f"{PREFIX}_a"[:15]
    assert info["pgid_is_pid"]  # a process group of its own, as the server has


def test_exit_status_and_errors_are_the_processes(server: forkserver.ForkServer, probe_dir: Path) -> None:
    assert run(server, probe_dir, "exit", "7")[0] == 7
    code, info, _, err = run(server, probe_dir, "message")
    assert info["forked"] and code == 1 and err == "the probe gives up\n"
    code, info, _, err = run(server, probe_dir, "raise")
    assert info["forked"] and code == 1 and "RuntimeError: probe failure" in err
    code, info, out, _ = run(server, probe_dir, "unbuffered", env={"PYTHONUNBUFFERED": "1"})
    assert info["forked"] and (code, out) == (0, "written, not flushed\n")
    code, info, _, err = run(server, probe_dir, "interrupt")
    assert info["forked"] and code == -signal.SIGINT and "KeyboardInterrupt" in err
    # a module that does not exist: Python's own message
    code, _, _, err = run(server, probe_dir, module=f"{PREFIX}_missing")
    assert code == 1 and f"No module named {PREFIX}_missing" in err


def _started(p: subprocess.Popen[str], flag: Path) -> dict[str, Any]:
    assert p.stdout is not None
    info: dict[str, Any] = json.loads(p.stdout.readline())
    wait_until(flag.exists, timeout=30)
    return info


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before or while it was read
        return True


def test_signals_to_the_launcher_reach_the_process(server: forkserver.ForkServer, probe_dir: Path) -> None:
    flag = probe_dir / "started"
    p = launch(server, probe_dir, "sleep", str(flag))
    info = _started(p, flag)
    assert info["forked"]
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == -signal.SIGTERM  # the child died of it: so does the launcher
    wait_until(lambda: _gone(info["pid"]), timeout=10)


def test_signals_ignored_by_the_launcher_are_ignored_by_the_process(
    server: forkserver.ForkServer, probe_dir: Path
) -> None:
    def ignore_term() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    code, info, out, _ = run(server, probe_dir, "signals", preexec_fn=ignore_term)
    assert info["forked"] and (code, out) == (0, "True False\n")
    code, info, out, _ = run(server, probe_dir, "signals")
    assert info["forked"] and (code, out) == (0, "False False\n")


def test_the_launchers_resource_limits_are_the_processes(
    server: forkserver.ForkServer, probe_dir: Path
) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(soft, 256) if soft != resource.RLIM_INFINITY else 256

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))

    code, info, out, _ = run(server, probe_dir, "limits", preexec_fn=lower)
    assert info["forked"] and (code, out) == (0, f"{want} 0\n")


def test_the_process_dies_with_its_launcher(server: forkserver.ForkServer, probe_dir: Path) -> None:
    flag = probe_dir / "started"
    p = launch(server, probe_dir, "sleep", str(flag))
    info = _started(p, flag)
    p.kill()  # SIGKILL cannot be passed on: the server sees the launcher's connection go
    p.wait(30)
    wait_until(lambda: _gone(info["pid"]), timeout=10)


def test_the_processes_die_with_the_server(probe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    srv = forkserver.start(str(tmp_path_factory.mktemp("fs")))
    assert srv is not None
    flag = probe_dir / "started"
    p = launch(srv, probe_dir, "sleep", str(flag))
    try:
        info = _started(p, flag)
        srv.stop()
        assert p.wait(30) != 0
        wait_until(lambda: _gone(info["pid"]), timeout=10)
    finally:
        p.kill()
        srv.stop()


def test_what_the_server_cannot_stand_in_for_runs_as_a_new_interpreter(
    server: forkserver.ForkServer, probe_dir: Path, tmp_path: Path
) -> None:
    # the interpreter's own settings differ from the server's
    code, info, _, _ = run(server, probe_dir, env={"PYTHONOPTIMIZE": "1"})
    assert code == 0 and not info["forked"] and info["optimize"] == 1
    # another hash seed (unset, or the server's, is fine)
    code, info, _, _ = run(server, probe_dir, env={"PYTHONHASHSEED": "123"})
    assert code == 0 and not info["forked"]
    code, info, _, _ = run(server, probe_dir, env={"PYTHONHASHSEED": "0"})
    assert code == 0 and info["forked"]
    # an existing PYTHONPATH entry (one that does not exist changes nothing)
    code, info, _, _ = run(server, probe_dir, env={"PYTHONPATH": str(tmp_path)})
    assert code == 0 and not info["forked"]
    code, info, _, _ = run(server, probe_dir, env={"PYTHONPATH": str(tmp_path / "none.zip")})
    assert code == 0 and info["forked"]
    # a module outside the prefix
    (probe_dir / "other_probe.py").write_text(PROBE)
    code, info, _, _ = run(server, probe_dir, module="other_probe")
    assert code == 0 and not info["forked"]
    # no server at that socket
    gone = forkserver.ForkServer(server.proc, str(tmp_path / "no.sock"), server.fingerprint_path)
    code, info, _, _ = run(gone, probe_dir)
    assert code == 0 and not info["forked"]


def test_process_name() -> None:
    assert forkserver.process_name(["-m", "pyspark.daemon", "pyspark.worker"]) == "worker"
    assert forkserver.process_name(["-m", "pyspark.daemon"]) == "daemon"
    assert (
        forkserver.process_name(["-m", "pyspark.sql.streaming.python_streaming_source_runner"])
        == "python_streamin"
    )


def test_requests_round_trip() -> None:
    env = {b"A": b"1=2", b"PYTHONPATH": b"/x:/y", b"E": b""}
    argv = [b"-m", b"pyspark.worker", b"\xff"]
    req = _launch.encode_request(argv, env, b"/tmp/d", [2, 15], {7: 4096, 4: -1})
    assert _launch.decode_request(req[4:]) == (argv, env, b"/tmp/d", [2, 15], {7: 4096, 4: -1})
    assert _launch.decode_request(_launch.encode_request(argv, {}, b"/")[4:]) == (argv, {}, b"/", [], {})
    for bad in (b"junk\0/tmp\0\0" + b"1", req[4:-3], req[4:].replace(b"A=1=2", b"A12"), b""):
        with pytest.raises(ValueError):
            _launch.decode_request(bad)


def test_the_session_launcher_asks_the_server(server: forkserver.ForkServer, tmp_path: Path) -> None:
    launcher = python_launcher(str(tmp_path), sys.executable, server)
    assert launcher is not None
    last = Path(launcher).read_text().splitlines()[-1]
    assert _launch.__file__ in last and server.socket_path in last and "pyspark." in last
    # Spark's own modules go to the server: pyspark.find_spark_home prints SPARK_HOME
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SPARK_HOME"] = str(tmp_path)
    out = subprocess.run(
        [launcher, "-m", "pyspark.find_spark_home"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (out.returncode, out.stdout.strip()) == (0, str(tmp_path))


def test_a_preloaded_module_runs_without_runpy_s_warning(
    server: forkserver.ForkServer, tmp_path: Path
) -> None:
    """The server preloads Spark's worker modules; one run as ``-m`` is executed afresh as
    __main__, without runpy's RuntimeWarning about a module found in sys.modules (which
    every nsq_spark run printed four times)."""
    module = "pyspark.sql.worker.lookup_data_sources"
    assert module in forkserver.PRELOAD
    cmd = [
        sys.executable,
        "-IS",
        _launch.__file__,
        server.socket_path,
        server.fingerprint_path,
        sys.executable,
        "pyspark.",
        "-m",
        module,
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # no Java to talk to: the module fails at once, after runpy has had its say
    p = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert "RuntimeWarning" not in p.stderr, p.stderr
    assert "found in sys.modules" not in p.stderr
