"""``scripts/run.sh``, the README's first command: starts nsqlookupd, then nsqd registered
with it; exits with nsqd's status; on Ctrl-C (SIGINT to the whole process group) or SIGTERM
it returns only once both daemons have finished their shutdown.

The script runs from a copy of the checkout's scripts whose ``.venv`` is this one (so its
set-up step finds everything installed), on free ports and a temporary data path.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.proc import http_request
from support import free_port, wait_until

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]


class RunScript:
    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "checkout"
        (self.home / "scripts").mkdir(parents=True)
        for name in ("run.sh", "setup.sh"):
            shutil.copy(ROOT / "scripts" / name, self.home / "scripts" / name)
        shutil.copy(ROOT / "pyproject.toml", self.home / "pyproject.toml")
        os.symlink(Path(sys.executable).parents[1], self.home / ".venv")
        self.data = tmp_path / "data"
        self.ports = {k: free_port() for k in ("lt", "lh", "nt", "nh", "ah")}
        self.env = dict(
            os.environ,
            NSQLOOKUPD_TCP_ADDRESS=f"127.0.0.1:{self.ports['lt']}",
            NSQLOOKUPD_HTTP_ADDRESS=f"127.0.0.1:{self.ports['lh']}",
            NSQD_TCP_ADDRESS=f"127.0.0.1:{self.ports['nt']}",
            NSQD_HTTP_ADDRESS=f"127.0.0.1:{self.ports['nh']}",
            NSQADMIN_HTTP_ADDRESS=f"127.0.0.1:{self.ports['ah']}",
            NSQD_DATA_PATH=str(self.data),
        )
        self.proc: subprocess.Popen[str] | None = None
        self.log = tmp_path / "run.log"

    def start(self, *args: str) -> subprocess.Popen[str]:
        with open(self.log, "w") as out:
            # a session of its own: a terminal's Ctrl-C is SIGINT to the whole group
            self.proc = subprocess.Popen(
                ["bash", str(self.home / "scripts" / "run.sh"), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                text=True,
                start_new_session=True,
            )
        return self.proc

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def nsqd(self, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        method = "GET" if body is None else "POST"
        return http_request(f"http://127.0.0.1:{self.ports['nh']}{path}", body, method, 5)

    def lookupd(self, path: str) -> tuple[int, bytes]:
        return http_request(f"http://127.0.0.1:{self.ports['lh']}{path}", timeout=5)

    def group_alive(self) -> bool:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def cleanup(self) -> None:
        if self.proc is not None and self.group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def run(tmp_path):
    # the copy's set-up step is a no-op only when this checkout's install is current
    subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], check=True, timeout=600)
    r = RunScript(tmp_path)
    yield r
    r.cleanup()


def test_a_bad_nsqd_flag_is_its_exit_status_and_stops_nsqlookupd(run):
    p = run.start("--mem-queue-size=abc")
    assert p.wait(60) == 2, run.output()
    assert "invalid value" in run.output()
    assert not run.group_alive(), "nsqlookupd was left running"


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stop_returns_after_both_daemons_finished(run, how):
    p = run.start("--mem-queue-size=100000")
    wait_until(
        lambda: _listening(run.ports["nh"]) and run.nsqd("/ping")[0] == 200, timeout=30, what="nsqd to answer"
    )
    body = b"\n".join(b"message %d" % i for i in range(2000))
    assert run.nsqd("/mpub?topic=t", body)[0] == 200
    wait_until(lambda: b'"t"' in run.lookupd("/topics")[1], timeout=10, what="registration")
    # nsqadmin runs too, and sees the topic through nsqlookupd
    admin = f"http://127.0.0.1:{run.ports['ah']}"
    wait_until(
        lambda: _listening(run.ports["ah"]) and b'"t"' in http_request(admin + "/api/topics", timeout=5)[1],
        timeout=30,
        what="nsqadmin",
    )

    if how == "ctrl-c":
        os.killpg(p.pid, signal.SIGINT)
    else:
        p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0, run.output()
    # returned only once nothing of the cluster runs any more
    assert not run.group_alive(), "a daemon was still running when run.sh returned"
    out = run.output()
    assert "failed to connect" not in out, out  # nsqlookupd was up before nsqd started
    assert "Traceback" not in out, out

    # an immediate second run gets the data path (no lock held) and the messages
    run.start()
    wait_until(
        lambda: _listening(run.ports["nh"]) and run.nsqd("/ping")[0] == 200,
        timeout=30,
        what="the second nsqd to answer",
    )
    _status, stats = run.nsqd("/stats?format=json&topic=t")
    assert b'"depth":2000' in stats, stats
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(30) == 0, run.output()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
