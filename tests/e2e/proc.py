"""Daemons and console scripts as real subprocesses, for e2e and interop tests.

Import as ``from e2e.proc import ...`` (``tests/`` is on ``sys.path`` through the root
conftest). Works for any daemon that prints ``<app> <KIND> address: <host:port>`` lines on
stdout once it listens (``nsqd``, and later ``nsqlookupd`` and ``nsqadmin``).

Output goes to files, never to pipes: a daemon that logs a lot can never block on a full
pipe, and the logs are there to show when a test fails. Every process is stopped by its PID
(SIGTERM, then SIGKILL after a deadline) in ``finally`` blocks and fixture teardown.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

#: The virtualenv's bin directory, where the console scripts live.
BIN_DIR = Path(sys.executable).parent

_ADDRESS_RE = re.compile(r"^(?P<app>[\w-]+) (?P<kind>[A-Z]+) address: (?P<addr>\S+)\s*$")


def script(name: str, bin_dir: Path = BIN_DIR) -> str:
    """Absolute path of a console script installed in ``bin_dir`` (next to this Python)."""
    path = bin_dir / name
    if not path.exists():
        raise FileNotFoundError(f"console script {name!r} not found in {bin_dir}")
    return str(path)


def split_host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def run_script(
    name: str, *args: str, timeout: float = 15.0, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a console script to completion (``--version``, bad flags…); kill it on timeout."""
    return subprocess.run(
        [script(name), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


class DaemonProcess:
    """One daemon started from its console script; output captured to files in ``log_dir``.
    ``bin_dir`` and ``env`` run another installation's script (tests/packaging's venvs)."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_dir: Path,
        cwd: str | None = None,
        bin_dir: Path = BIN_DIR,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.args = [script(name, bin_dir), *args]
        self.env = env
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = self.log_dir / f"{name}.stdout"
        self.stderr_path = self.log_dir / f"{name}.stderr"
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        #: KIND ("TCP", "HTTP", "HTTPS") -> "host:port", as printed by the daemon.
        self.addresses: dict[str, str] = {}

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> DaemonProcess:
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=self.cwd, env=self.env
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def poll(self) -> int | None:
        assert self.proc is not None, "not started"
        return self.proc.poll()

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_for_addresses(self, kinds: Sequence[str] = ("TCP",), timeout: float = 15.0) -> dict[str, str]:
        """Poll stdout until an address line for each of ``kinds`` was printed."""
        deadline = time.monotonic() + timeout
        while True:
            self._parse_addresses()
            if all(k in self.addresses for k in kinds):
                return self.addresses
            code = self.poll()
            if code is not None:
                self._parse_addresses()
                raise RuntimeError(
                    f"{self.name} exited with {code} before printing its addresses\n" + self.describe()
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name} printed no {list(kinds)} address within {timeout}s\n" + self.describe()
                )
            time.sleep(0.02)

    def _parse_addresses(self) -> None:
        for line in self.stdout().splitlines():
            m = _ADDRESS_RE.match(line)
            if m and m["app"] == self.name:
                self.addresses.setdefault(m["kind"], m["addr"])

    def send_signal(self, sig: int) -> None:
        """Signal exactly this process (by its PID), if it still runs."""
        if self.is_running():
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None, "not started"
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> int | None:
        """Send ``sig``, wait up to ``timeout`` s, then SIGKILL. Returns the exit code
        from the graceful stop, or None if the process had to be killed."""
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            return self.proc.returncode
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- output -----------------------------------------------------------------------------------

    def stdout(self) -> str:
        return _read(self.stdout_path)

    def stderr(self) -> str:
        return _read(self.stderr_path)

    def describe(self, tail: int = 4000) -> str:
        return (
            f"--- {self.name} argv: {self.args}\n--- stdout:\n{self.stdout()[-tail:]}"
            f"\n--- stderr:\n{self.stderr()[-tail:]}"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


class NsqdProcess(DaemonProcess):
    """``nsqd`` from the console script, on ports picked by the OS (port 0)."""

    def __init__(
        self, data_path: Path, *extra_args: str, log_dir: Path | None = None, http: bool = True
    ) -> None:
        data_path = Path(data_path)
        data_path.mkdir(parents=True, exist_ok=True)
        args = ["--tcp-address=127.0.0.1:0", f"--data-path={data_path}"]
        args.append("--http-address=127.0.0.1:0" if http else "--http-address=")
        super().__init__("nsqd", [*args, *extra_args], log_dir or data_path)
        self.data_path = data_path
        self.http = http

    def start(self, timeout: float = 15.0) -> NsqdProcess:  # type: ignore[override]
        super().start()
        try:
            self.wait_for_addresses(("TCP", "HTTP") if self.http else ("TCP",), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def tcp_address(self) -> str:
        return self.addresses["TCP"]

    @property
    def http_address(self) -> str:
        return self.addresses["HTTP"]

    @property
    def tcp_port(self) -> int:
        return split_host_port(self.tcp_address)[1]

    @property
    def http_port(self) -> int:
        return split_host_port(self.http_address)[1]

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        return http_request(f"http://{self.http_address}{path}", timeout=timeout)

    def http_post(self, path: str, body: bytes = b"", timeout: float = 5.0) -> tuple[int, bytes]:
        return http_request(f"http://{self.http_address}{path}", body, "POST", timeout)


@contextlib.contextmanager
def nsqd_process(data_path: Path, *extra_args: str, http: bool = True) -> Iterator[NsqdProcess]:
    """Start ``nsqd``; always stop it (SIGTERM, then SIGKILL) when the block ends."""
    p = NsqdProcess(data_path, *extra_args, http=http)
    try:
        p.start()
        yield p
    finally:
        p.stop()


class NsqlookupdProcess(DaemonProcess):
    """``nsqlookupd`` from the console script, on ports picked by the OS (port 0)."""

    def __init__(self, log_dir: Path, *extra_args: str) -> None:
        args = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
        super().__init__("nsqlookupd", [*args, *extra_args], log_dir)

    def start(self, timeout: float = 15.0) -> NsqlookupdProcess:  # type: ignore[override]
        super().start()
        try:
            self.wait_for_addresses(("TCP", "HTTP"), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def tcp_address(self) -> str:
        return self.addresses["TCP"]

    @property
    def http_address(self) -> str:
        return self.addresses["HTTP"]

    @property
    def tcp_port(self) -> int:
        return split_host_port(self.tcp_address)[1]

    @property
    def http_port(self) -> int:
        return split_host_port(self.http_address)[1]

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        return http_request(f"http://{self.http_address}{path}", timeout=timeout)

    def http_post(self, path: str, body: bytes = b"", timeout: float = 5.0) -> tuple[int, bytes]:
        return http_request(f"http://{self.http_address}{path}", body, "POST", timeout)


def nsqlookupd_fixture(tmp_path: Path, *extra_args: str) -> Iterator[NsqlookupdProcess]:
    """Body of an ``nsqlookupd_proc`` fixture (``yield from nsqlookupd_fixture(tmp_path)``):
    teardown asserts it is still alive, exits 0 on SIGTERM and logged no traceback."""
    p = NsqlookupdProcess(Path(tmp_path) / "nsqlookupd", *extra_args)
    code: int | None = None
    try:
        p.start()
        yield p
        assert p.is_running(), f"nsqlookupd died during the test\n{p.describe()}"
    finally:
        code = p.stop()
    assert code == 0, f"nsqlookupd did not exit cleanly on SIGTERM (code {code})\n{p.describe()}"
    assert "Traceback" not in p.stderr(), f"nsqlookupd logged an unhandled exception\n{p.describe(20000)}"


def http_request(
    url: str, body: bytes | None = None, method: str = "GET", timeout: float = 5.0
) -> tuple[int, bytes]:
    """(status, body) of one HTTP request; HTTP error statuses are returned, not raised."""
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def tcp_alive(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if a TCP connection to host:port is accepted."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def run_driver(script_path: Path, spec_json: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a Python client-driver script (in this venv) in its own process with a hard
    timeout; the spec goes to stdin as JSON, the result comes back on stdout."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, str(script_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(spec_json, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"{script_path.name} did not finish within {timeout}s\n"
            f"--- stdout:\n{out[-4000:]}\n--- stderr:\n{err[-6000:]}"
        ) from None
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def nsqd_fixture(tmp_path: Path, *extra_args: str) -> Iterator[NsqdProcess]:
    """Body of an ``nsqd_proc`` pytest fixture (``yield from nsqd_fixture(tmp_path)``).

    Fixtures live in the test modules, not in conftest.py files under tests/: a second
    ``conftest`` module would shadow the root one that other tests import by name.
    Teardown asserts nsqd is still alive (no test may crash it), that SIGTERM stops it with
    exit code 0 and that it logged no traceback; it is always stopped by PID, SIGKILL as the
    last resort."""
    p = NsqdProcess(Path(tmp_path) / "nsqd", *extra_args)
    code: int | None = None
    try:
        p.start()
        yield p
        assert p.is_running(), f"nsqd died during the test\n{p.describe()}"
    finally:
        code = p.stop()
    assert code == 0, f"nsqd did not exit cleanly on SIGTERM (code {code})\n{p.describe()}"
    assert "Traceback" not in p.stderr(), f"nsqd logged an unhandled exception\n{p.describe(20000)}"


@contextlib.contextmanager
def lookupd_and_nsqd(
    base: Path, *nsqd_args: str, check_exit: bool = False
) -> Iterator[tuple[NsqlookupdProcess, NsqdProcess]]:
    """An nsqlookupd and an nsqd registered with it (broadcasting 127.0.0.1, with
    ``nsqd_args``), logs under ``base/lookupd`` and ``base/nsqd``; both stopped (SIGTERM)
    when the block ends, nsqd first. ``check_exit``: assert that each exited with status 0."""
    lookupd = NsqlookupdProcess(base / "lookupd").start()
    nsqd = None
    try:
        nsqd = NsqdProcess(
            base / "nsqd",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--broadcast-address=127.0.0.1",
            *nsqd_args,
        ).start()
        yield lookupd, nsqd
    finally:
        if nsqd is not None:
            code = nsqd.stop()
            assert not check_exit or code == 0, nsqd.describe()
        code = lookupd.stop()
        assert not check_exit or code == 0, lookupd.describe()
