"""End to end: nsqadmin as a real process (``python -m nsqpy.nsqadmin``, the code behind the
``nsqadmin`` console script) next to the ``nsqlookupd`` and ``nsqd`` console scripts: its
address line, the API over the real cluster, an action, the sampler, SIGTERM; and its exit
codes for ``--version``, bad flags and bad options."""

from __future__ import annotations

import base64
import json
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from e2e.proc import (
    DaemonProcess,
    NsqdProcess,
    NsqlookupdProcess,
    http_request,
)
from support import htpasswd_entry, wait_until, write_htpasswd, write_token_file
from transport.certs import make_pki

pytestmark = pytest.mark.timeout(90)

MODULE = [sys.executable, "-m", "nsqpy.nsqadmin"]


class AdminProcess(DaemonProcess):
    """nsqadmin started as ``python -m nsqpy.nsqadmin`` (output to files, stopped by PID)."""

    def __init__(self, log_dir: Path, *args: str) -> None:
        self.name = "nsqadmin"
        self.args = [*MODULE, "--http-address=127.0.0.1:0", *args]
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = self.log_dir / "nsqadmin.stdout"
        self.stderr_path = self.log_dir / "nsqadmin.stderr"
        self.cwd = None
        self.env = None
        self.proc = None
        self.addresses = {}

    @property
    def http_address(self) -> str:
        return self.addresses["HTTP"]

    def get(self, path: str) -> tuple[int, bytes]:
        return http_request(f"http://{self.http_address}{path}")

    def json(self, path: str):
        status, body = self.get(path)
        assert status == 200, (path, status, body)
        return json.loads(body)


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MODULE, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30
    )


def test_nsqadmin_process_over_real_daemons(tmp_path):
    lookupd = NsqlookupdProcess(tmp_path / "lookupd")
    nsqd = NsqdProcess(tmp_path / "nsqd", "--broadcast-address=127.0.0.1")
    admin = None
    try:
        lookupd.start()
        nsqd.args.append(f"--lookupd-tcp-address={lookupd.tcp_address}")
        nsqd.start()
        admin = AdminProcess(
            tmp_path / "admin",
            f"--lookupd-http-address={lookupd.http_address}",
            "--stats-sample-interval=100ms",
        )
        admin.start()
        admin.wait_for_addresses(("HTTP",))
        assert admin.get("/ping") == (200, b"OK")
        status, page = admin.get("/")
        assert status == 200 and b"var IS_ADMIN = true;" in page

        assert nsqd.http_post("/topic/create?topic=events")[0] == 200
        assert nsqd.http_post("/channel/create?topic=events&channel=sink")[0] == 200
        wait_until(lambda: admin.json("/api/topics")["topics"] == ["events"], 15, "topic")
        nodes = admin.json("/api/nodes")["nodes"]
        assert [n["http_port"] for n in nodes] == [nsqd.http_port]
        assert nodes[0]["topics"] == [{"topic": "events", "tombstoned": False}]

        assert nsqd.http_post("/mpub?topic=events", b"a\nb\nc")[0] == 200
        topic = admin.json("/api/topics/events")
        assert topic["message_count"] == 3 and topic["channels"][0]["depth"] == 3

        status, body = http_request(
            f"http://{admin.http_address}/api/topics/events/sink",
            json.dumps({"action": "pause"}).encode(),
            "POST",
        )
        assert (status, json.loads(body)) == (200, {"message": ""})
        stats = json.loads(nsqd.http_get("/stats?format=json&topic=events")[1])
        assert stats["topics"][0]["channels"][0]["paused"] is True

        def rated():
            doc = admin.json("/api/series/topics/events/sink")
            return doc["message_count"] and doc["message_count"][-1] == 3

        wait_until(rated, 15, "a sample with the messages")
        assert admin.is_running()
    finally:
        code = admin.stop() if admin is not None else 0
        nsqd.stop()
        lookupd.stop()
    assert code == 0, admin.describe()
    assert "Traceback" not in admin.stderr(), admin.describe(20000)
    assert "[nsqadmin] " in admin.stderr()


def test_exit_codes():
    res = run_module("--version")
    assert res.returncode == 0 and res.stdout.startswith("nsqadmin v1.3.0 ")

    res = run_module("--nope")
    assert res.returncode == 2
    assert res.stderr.startswith("flag provided but not defined: -nope\nUsage of nsqadmin:")

    res = run_module("--help")
    assert res.returncode == 0 and "-lookupd-http-address value" in res.stderr

    res = run_module("--http-address=127.0.0.1:0")
    assert res.returncode == 1
    assert (
        "FATAL: failed to instantiate nsqadmin - --nsqd-http-address or --lookupd-http-address required"
    ) in res.stderr
    assert "Traceback" not in res.stderr

    res = run_module(
        "--http-address=127.0.0.1:0",
        "--nsqd-http-address=127.0.0.1:4151",
        "--lookupd-http-address=127.0.0.1:4161",
    )
    assert res.returncode == 1
    assert "use --nsqd-http-address or --lookupd-http-address not both" in res.stderr


def test_login_over_https_and_sighup(tmp_path):
    """The script with --htpasswd-file, --tls-cert/--tls-key and --admin-token-file: its
    HTTPS address line, Basic credentials over HTTPS, SIGHUP re-reading the users; a file of
    another kind of entry refuses the start, naming the line."""
    pki = make_pki(tmp_path / "pki")
    users = tmp_path / "htpasswd"
    write_htpasswd(users, {"ann": "ann-secret"})
    token = write_token_file(tmp_path / "token", "t0ken")
    ctx = ssl.create_default_context(cafile=pki.ca_cert)

    def get(admin: AdminProcess, path: str, user: str, password: str) -> int:
        creds = base64.b64encode(f"{user}:{password}".encode()).decode()
        req = urllib.request.Request(
            f"https://{admin.addresses['HTTPS']}{path}", headers={"Authorization": f"Basic {creds}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

    admin = AdminProcess(
        tmp_path / "admin",
        "--nsqd-http-address=127.0.0.1:4151",
        f"--htpasswd-file={users}",
        f"--tls-cert={pki.server_cert}",
        f"--tls-key={pki.server_key}",
        f"--admin-token-file={token}",
        "--stats-sample-interval=0",
    )
    try:
        admin.start()
        admin.wait_for_addresses(("HTTPS",))
        assert get(admin, "/ping", "", "") == 200
        assert get(admin, "/api/session", "ann", "ann-secret") == 200
        assert get(admin, "/api/session", "bob", "bob-secret") == 401
        write_htpasswd(users, {"ann": "ann-secret", "bob": "bob-secret"})
        admin.send_signal(signal.SIGHUP)
        wait_until(lambda: get(admin, "/api/session", "bob", "bob-secret") == 200, 10, "bob after SIGHUP")
        assert admin.is_running()
    finally:
        code = admin.stop()
    assert code == 0, admin.describe()
    assert "htpasswd: 2 user(s) read from" in admin.stderr()
    assert "Traceback" not in admin.stderr(), admin.describe(20000)

    users.write_text(htpasswd_entry("ann", "x") + "\nbob:$apr1$XntAo1RU$R9/rw0lx7XTKJPVakRLAY.\n")
    res = run_module(
        "--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:4151", f"--htpasswd-file={users}"
    )
    assert res.returncode == 1
    assert (
        f"FATAL: failed to instantiate nsqadmin - --htpasswd-file: {users} line 2 (user 'bob') is an MD5 "
        "($apr1$) entry: only bcrypt entries are accepted (make them with htpasswd -B)"
    ) in res.stderr
    assert "Traceback" not in res.stderr
