"""End to end: the ``nsqlookupd`` console script as a real process, on ports picked by the
OS; register over TCP, query over HTTP, stop with a signal."""

from __future__ import annotations

import json
import re
import signal
import socket
import struct

import pytest
from e2e.proc import NsqlookupdProcess, nsqlookupd_fixture, run_script
from support import wait_until

pytestmark = pytest.mark.timeout(30)

PEER = {"broadcast_address": "e2e-host", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0"}


@pytest.fixture
def lookupd_proc(tmp_path):
    yield from nsqlookupd_fixture(tmp_path)


class SyncV1:
    """A blocking V1 client over a plain socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"  V1")

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def command(self, data: bytes) -> bytes:
        self.sock.sendall(data)
        (n,) = struct.unpack(">i", self._exact(4))
        return self._exact(n)

    def identify(self, **fields) -> dict:
        body = json.dumps({**PEER, **fields}).encode()
        return json.loads(self.command(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body))

    def close(self) -> None:
        self.sock.close()


def poll(cond, timeout: float = 5.0):
    return wait_until(cond, timeout)


def get_json(p: NsqlookupdProcess, path: str):
    status, body = p.http_get(path)
    assert status == 200, body
    return json.loads(body)


def test_register_over_tcp_query_over_http(lookupd_proc):
    p = lookupd_proc
    assert p.stdout().splitlines()[:2] == [
        f"nsqlookupd TCP address: {p.tcp_address}",
        f"nsqlookupd HTTP address: {p.http_address}",
    ]
    assert p.http_get("/ping") == (200, b"OK")
    assert get_json(p, "/info") == {"version": "1.3.0"}
    c = SyncV1(p.tcp_port)
    try:
        reply = c.identify()
        assert (reply["tcp_port"], reply["http_port"]) == (p.tcp_port, p.http_port)
        assert c.command(b"REGISTER orders archive\n") == b"OK"
        assert c.command(b"PING\n") == b"OK"
        doc = get_json(p, "/lookup?topic=orders")
        assert doc["channels"] == ["archive"]
        assert [(x["broadcast_address"], x["tcp_port"]) for x in doc["producers"]] == [("e2e-host", 4150)]
        assert get_json(p, "/topics") == {"topics": ["orders"]}
        assert p.http_post("/topic/tombstone?topic=orders&node=e2e-host:4151") == (200, b"")
        assert get_json(p, "/lookup?topic=orders")["producers"] == []
    finally:
        c.close()
    poll(lambda: get_json(p, "/nodes") == {"producers": []})
    err = p.stderr()
    assert re.search(r"^\[nsqlookupd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} INFO: ", err, re.M), err
    assert "TCP: listening on" in err and "HTTP: listening on" in err
    assert "REGISTER category:topic key:orders" in err


def test_sigint_exits_zero(tmp_path):
    p = NsqlookupdProcess(tmp_path).start()
    try:
        assert p.stop(signal.SIGINT) == 0, p.describe()
    finally:
        p.kill()


def test_sigterm_with_connected_peers_exits_zero(tmp_path):
    p = NsqlookupdProcess(tmp_path).start()
    c = SyncV1(p.tcp_port)
    try:
        c.identify()
        c.command(b"REGISTER t\n")
        assert p.stop() == 0, p.describe()
        assert "Traceback" not in p.stderr()
    finally:
        c.close()
        p.kill()


def test_config_file_and_log_level(tmp_path):
    cfg = tmp_path / "lookupd.cfg"
    cfg.write_text('broadcast_address = "from-config"\nlog_level = "warn"\n')
    p = NsqlookupdProcess(tmp_path, f"--config={cfg}").start()
    c = SyncV1(p.tcp_port)
    try:
        assert c.identify()["broadcast_address"] == "from-config"
    finally:
        c.close()
        assert p.stop() == 0, p.describe()
    assert " INFO: " not in p.stderr()


def test_version():
    res = run_script("nsqlookupd", "--version")
    assert res.returncode == 0
    assert res.stdout.startswith("nsqlookupd v1.3.0")


def test_help_prints_usage_and_exits_zero():
    res = run_script("nsqlookupd", "-h")
    assert res.returncode == 0
    assert res.stderr.startswith("Usage of nsqlookupd:")
    assert "-tombstone-lifetime duration" in res.stderr


def test_bad_flag_prints_usage_and_exits_two():
    res = run_script("nsqlookupd", "--nope")
    assert res.returncode == 2
    assert res.stderr.startswith("flag provided but not defined: -nope\nUsage of nsqlookupd:")


def test_bad_config_exits_two(tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text('log_level = "loud"\n')
    res = run_script("nsqlookupd", f"--config={cfg}")
    assert res.returncode == 2
    assert res.stderr.startswith("failed parsing log_level loud")


def test_address_in_use_exits_one(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        res = run_script("nsqlookupd", f"--tcp-address=127.0.0.1:{port}", "--http-address=127.0.0.1:0")
    assert res.returncode == 1
    assert "failed to instantiate nsqlookupd - listen (127.0.0.1:%d) failed" % port in res.stderr
    assert "Traceback" not in res.stderr
