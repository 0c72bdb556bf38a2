"""Helpers for the tool tests: run a tool's console script (with stdin bytes, or in the
background with its output in files), poll conditions, read nsqd stats, collect messages."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from e2e.proc import NsqdProcess, NsqlookupdProcess, lookupd_and_nsqd, script
from support import free_port as free_port  # re-exported for the tool tests
from support import read_bodies
from support import wait_until as wait_until  # re-exported for the tool tests


def run_tool(
    name: str, *args: str, input: bytes = b"", timeout: float = 30.0
) -> subprocess.CompletedProcess[bytes]:
    """Run a tool to completion with ``input`` on stdin (killed, by PID, on timeout)."""
    return subprocess.run([script(name), *args], input=input, capture_output=True, timeout=timeout)


class ToolProcess:
    """A tool started in the background: stdin a pipe (or /dev/null), stdout/stderr in files,
    always stopped by its PID."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_dir: Path,
        stdin_pipe: bool = False,
        argv: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """Start console script ``name`` with ``args`` (or run ``argv`` as is)."""
        self.name = name
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = log_dir / f"{name}.{os.getpid()}.{id(self)}.stdout"
        self.stderr_path = log_dir / f"{name}.{os.getpid()}.{id(self)}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                list(argv) if argv is not None else [script(name), *args],
                stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=cwd,
            )

    def stdout(self) -> bytes:
        return self.stdout_path.read_bytes()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def wait(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a deadline (no-op if it already exited)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        with contextlib.suppress(OSError):
            self.close_stdin()

    def describe(self) -> str:
        return f"--- {self.name} stdout:\n{self.stdout()[-3000:]!r}\n--- stderr:\n{self.stderr()[-3000:]}"

    def __enter__(self) -> ToolProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stats(nsqd: NsqdProcess, topic: str | None = None) -> dict[str, Any]:
    path = "/stats?format=json" + (f"&topic={topic}" if topic else "")
    status, body = nsqd.http_get(path)
    assert status == 200, body
    data: dict[str, Any] = json.loads(body)
    return data


def topic_stats(nsqd: NsqdProcess, topic: str) -> dict[str, Any] | None:
    for t in stats(nsqd, topic).get("topics") or []:
        if t["topic_name"] == topic:
            return t  # type: ignore[no-any-return]
    return None


def message_count(nsqd: NsqdProcess, topic: str) -> int:
    t = topic_stats(nsqd, topic)
    return -1 if t is None else int(t["message_count"])


def channels(nsqd: NsqdProcess, topic: str) -> dict[str, dict[str, Any]]:
    t = topic_stats(nsqd, topic)
    return {} if t is None else {c["channel_name"]: c for c in t["channels"] or []}


def collect(
    nsqd: NsqdProcess, topic: str, n: int, timeout: float = 20.0, channel: str = "verify"
) -> list[bytes]:
    """The first ``n`` message bodies of a new channel on ``topic`` (FINed), in arrival order."""
    return read_bodies(nsqd.tcp_address, topic, channel, n, timeout, max_in_flight=min(max(n, 1), 2500))


def publish_http(nsqd: NsqdProcess, topic: str, *bodies: bytes) -> None:
    for body in bodies:
        status, resp = nsqd.http_post(f"/pub?topic={topic}", body)
        assert status == 200, resp


@contextlib.contextmanager
def registered_topic(tmp_path: Path, topic: str, body: bytes) -> Iterator[NsqlookupdProcess]:
    """An nsqlookupd and an nsqd registered with it whose ``topic`` holds ``body``, once the
    lookupd lists the topic's producer; both stopped afterwards."""
    with lookupd_and_nsqd(tmp_path) as (lookupd, nsqd):
        publish_http(nsqd, topic, body)

        def registered() -> bool:
            status, doc = lookupd.http_get(f"/lookup?topic={topic}")
            return status == 200 and bool(json.loads(doc)["producers"])

        wait_until(registered, what="the topic in nsqlookupd")
        yield lookupd
