"""Admin tokens on nsqd's and nsqlookupd's HTTP APIs (``--admin-token-file``, an nsqpy
addition), through the console scripts and curl: every route either daemon registers has a
decision (a route added later without one fails here), and each is walked with no token, a
wrong one and a right one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from e2e.proc import NsqdProcess, NsqlookupdProcess

from nsqpy.httpapi import ACCESS_LEVELS, ADMIN, BODIES, OPEN, PUBLISH
from nsqpy.nsqd.http import HTTPServer as NsqdHTTP
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqlookupd.http import HTTPServer as LookupdHTTP
from nsqpy.nsqlookupd.nsqlookupd import NSQLookupd

pytestmark = pytest.mark.timeout(120)

TOKEN = "t0ken-ops-1"

#: what must need a token (the issue's list); everything else of the daemon is open
NSQD_GUARDED = {
    ("POST", "/topic/create"),
    ("POST", "/topic/delete"),
    ("POST", "/topic/empty"),
    ("POST", "/topic/pause"),
    ("POST", "/topic/unpause"),
    ("POST", "/channel/create"),
    ("POST", "/channel/delete"),
    ("POST", "/channel/empty"),
    ("POST", "/channel/pause"),
    ("POST", "/channel/unpause"),
    ("POST", "/topic/config"),
    ("POST", "/channel/config"),
    ("GET", "/topic/peek"),
    ("GET", "/channel/peek"),
    ("POST", "/channel/requeue"),
    ("POST", "/channel/remove"),
    ("POST", "/topic/redrive"),
    ("PUT", "/config/:opt"),
    ("PUT", "/debug/setblockrate"),
    ("POST", "/debug/freememory"),
    ("GET", "/debug/pprof/"),
    ("GET", "/debug/pprof/cmdline"),
    ("GET", "/debug/pprof/goroutine"),
    ("GET", "/debug/pprof/heap"),
    ("GET", "/debug/pprof/profile"),
}
LOOKUPD_GUARDED = {
    ("POST", "/topic/create"),
    ("POST", "/topic/delete"),
    ("POST", "/channel/create"),
    ("POST", "/channel/delete"),
    ("POST", "/topic/tombstone"),
    ("GET", "/debug"),
    ("GET", "/debug/pprof"),
    ("GET", "/debug/pprof/cmdline"),
    ("GET", "/debug/pprof/goroutine"),
    ("GET", "/debug/pprof/heap"),
    ("GET", "/debug/pprof/profile"),
}


def nsqd_routes() -> dict[tuple[str, str], str | None]:
    return NsqdHTTP(NSQD()).router.access


def lookupd_routes() -> dict[tuple[str, str], str | None]:
    return LookupdHTTP(NSQLookupd()).router.access


@pytest.mark.parametrize("routes, guarded", [(nsqd_routes, NSQD_GUARDED), (lookupd_routes, LOOKUPD_GUARDED)])
def test_every_route_has_a_decision(routes, guarded):
    access = routes()
    undecided = sorted(k for k, v in access.items() if v not in ACCESS_LEVELS)
    assert not undecided, f"routes without an access decision: {undecided}"
    needs_token = {k for k, v in access.items() if v in (ADMIN, BODIES)}
    assert needs_token == guarded
    # what shows no message bodies stays open
    for route in (("GET", "/ping"), ("GET", "/info"), ("GET", "/metrics")):
        assert access[route] == OPEN
    if routes is nsqd_routes:
        assert access[("GET", "/stats")] == OPEN
        assert access[("GET", "/topic/peek")] == BODIES
        assert access[("POST", "/pub")] == access[("POST", "/mpub")] == PUBLISH
    else:
        for path in ("/lookup", "/topics", "/channels", "/nodes"):
            assert access[("GET", path)] == OPEN


def token_file(tmp_path: Path) -> Path:
    p = tmp_path / "tokens"
    p.write_text(f"# the ops team\n{TOKEN}\n")
    os.chmod(p, 0o600)
    return p


def curl(method: str, url: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    cmd = ["curl", "-s", "-i", "-X", method, "--max-time", "20", url]
    if token is not None:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    if method in ("POST", "PUT"):
        cmd += ["--data-binary", ""]
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=30).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


def concrete(path: str) -> str:
    path = path.replace(":opt", "log_level")
    if path.endswith("/profile"):
        return path + "?seconds=1"
    return path


def walk(address: str, access: dict[tuple[str, str], str | None]) -> None:
    for (method, path), level in sorted(access.items(), key=lambda kv: kv[0][1]):
        url = f"http://{address}{concrete(path)}"
        status, headers, body = curl(method, url)
        if level in (ADMIN, BODIES):
            assert status == 401, (method, path, status, body)
            assert json.loads(body) == {"message": "UNAUTHORIZED"}
            assert headers["www-authenticate"] == "Bearer"
            status, _, body = curl(method, url, "wrong")
            assert (status, json.loads(body)) == (403, {"message": "FORBIDDEN"}), (method, path)
            status, _, body = curl(method, url, TOKEN)
            assert status not in (401, 403), (method, path, status, body)
        else:
            assert status not in (401, 403), (method, path, status, body)


def test_nsqd_routes_with_no_wrong_and_right_tokens(tmp_path):
    tokens = token_file(tmp_path)
    with NsqdProcess(tmp_path / "data", f"--admin-token-file={tokens}").start() as p:
        # a topic and channel to act on (with the token)
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            assert curl("POST", f"http://{p.http_address}{path}", TOKEN)[0] == 200
        walk(p.http_address, nsqd_routes())
        # reads show what they did before; publishing is not an admin's
        assert curl("POST", f"http://{p.http_address}/pub?topic=t")[0] in (200, 400)
        assert curl("POST", f"http://{p.http_address}/topic/create?topic=x", TOKEN)[0] == 200
        assert "x" in [
            t["topic_name"]
            for t in json.loads(curl("GET", f"http://{p.http_address}/stats?format=json")[2])["topics"]
        ]


def test_nsqlookupd_routes_with_no_wrong_and_right_tokens(tmp_path):
    tokens = token_file(tmp_path)
    with NsqlookupdProcess(tmp_path, f"--admin-token-file={tokens}").start() as p:
        walk(p.http_address, lookupd_routes())
        assert curl("POST", f"http://{p.http_address}/topic/create?topic=made", TOKEN)[0] == 200
        status, _, body = curl("GET", f"http://{p.http_address}/topics")
        assert status == 200 and "made" in json.loads(body)["topics"]


def test_without_a_token_file_every_route_is_open_as_in_nsq(tmp_path):
    with NsqdProcess(tmp_path / "data").start() as p:
        assert curl("POST", f"http://{p.http_address}/topic/create?topic=t")[0] == 200
        assert curl("GET", f"http://{p.http_address}/topic/peek?topic=t")[0] == 200
    with NsqlookupdProcess(tmp_path).start() as p:
        assert curl("POST", f"http://{p.http_address}/topic/create?topic=t")[0] == 200
        assert curl("GET", f"http://{p.http_address}/debug")[0] == 200


def test_nsqlookupd_refuses_a_token_file_others_can_read(tmp_path):
    tokens = token_file(tmp_path)
    tokens.chmod(0o640)
    p = NsqlookupdProcess(tmp_path, f"--admin-token-file={tokens}")
    with pytest.raises(Exception):  # noqa: B017 - the start fails whichever way it is told
        p.start(timeout=10)
    assert p.wait(10) == 1
    assert "readable by other users" in p.stderr()
