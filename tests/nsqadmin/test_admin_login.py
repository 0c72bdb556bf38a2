"""nsqadmin's login (an nsqpy addition): ``--htpasswd-file`` (bcrypt entries as ``htpasswd -B``
writes them) puts every page and ``/api/*`` behind a session or HTTP Basic credentials;
sessions are HttpOnly, SameSite=Strict cookies (Secure under HTTPS) that expire, actions
through them need the CSRF token, only ``--admin-user`` users act, failed logins are slowed
per address; ``--tls-cert``/``--tls-key`` serve HTTPS; ``--admin-token-file``'s token goes to
nsqd and nsqlookupd. Without ``--htpasswd-file`` nothing changes (Go's ACL header)."""

from __future__ import annotations

import base64
import json
import re
import ssl
from http.cookies import SimpleCookie
from typing import Any

import aiohttp
import pytest
from admin_helpers import HTTP, Cluster, Recorder, cluster_fixture, running_admin  # noqa: F401
from aiohttp import web
from support import htpasswd_entry, wait_for, write_htpasswd, write_token_file
from transport.certs import make_pki

from nsqpy.nsqadmin import NSQAdmin
from nsqpy.nsqadmin.login import FAILURE_WINDOW, MAX_FAILURES, LoginThrottle, read_htpasswd
from nsqpy.nsqadmin.options import OptionsError, parse_args, validate
from nsqpy.nsqlookupd import NSQLookupd
from nsqpy.nsqlookupd import Options as LookupdOptions

pytestmark = pytest.mark.timeout(60)

USERS = {"ann": "ann-secret", "bob": "bob-secret"}
#: made by Apache's own ``htpasswd -B -b`` (2.4), password "ann pass"
APACHE_ENTRY = "dan:$2y$05$hy8RDY8ic9LpF1k2WK6L2u3E.ijSjA8X2BsYTikF/O8Rq2w33ciT6"
UNAUTHORIZED = {"message": "UNAUTHORIZED"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


class Signed:
    """A session: its cookie (sent by hand: the addresses are IPs), its CSRF token and the
    Set-Cookie it came with."""

    def __init__(self, http: HTTP, set_cookie: str, csrf: str) -> None:
        self.http = http
        self.set_cookie = set_cookie
        jar: SimpleCookie = SimpleCookie()
        jar.load(set_cookie)
        self.cookie = "; ".join(f"{k}={m.value}" for k, m in jar.items())
        self.csrf = csrf

    def headers(self, csrf: bool = True, **extra: str) -> dict[str, str]:
        h = {"Cookie": self.cookie, **extra}
        if csrf:
            h["X-CSRF-Token"] = self.csrf
        return h

    async def call(self, method: str, path: str, doc: Any = None, csrf: bool = True, **extra: str):
        data = None if doc is None else json.dumps(doc).encode()
        status, _, body = await self.http.request(
            method, path, data=data, headers=self.headers(csrf, **extra)
        )
        return status, json.loads(body) if body else None


async def sign_in(http: HTTP, user: str, password: str, next_path: str = "/") -> Signed:
    status, headers, body = await http.post("/login", {"user": user, "password": password, "next": next_path})
    assert status == 303, (status, body)
    set_cookie = headers["Set-Cookie"]
    status, _, body = await http.get("/api/session", headers={"Cookie": set_cookie.split(";")[0]})
    assert status == 200, body
    return Signed(http, set_cookie, json.loads(body)["csrf_token"])


async def orders(cluster: Cluster) -> None:
    for nsqd in cluster.nsqds:
        nsqd.get_topic("orders").get_channel("archive")
    await cluster.registered("orders", len(cluster.nsqds))


def paused(cluster: Cluster, topic: str = "orders") -> list[bool]:
    return [n.get_topic(topic).paused for n in cluster.nsqds]


# --- who may come in ----------------------------------------------------------------------------


async def test_pages_and_api_need_credentials(cluster, tmp_path):
    pw = write_htpasswd(tmp_path / "htpasswd", USERS)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], htpasswd_file=pw) as (_, http):
        # pages go to the login, with the way back
        for path, back in [
            ("/", "/"),
            ("/topics/orders?x=1", "/topics/orders%3Fx%3D1"),
            ("/nodes", "/nodes"),
        ]:
            status, headers, _ = await http.get(path)
            assert (status, headers["Location"]) == (302, f"/login?next={back}"), path
        # the API and the other routes answer 401, with a Basic challenge for scripts only
        for method, path in [
            ("GET", "/api/topics"),
            ("GET", "/api/nodes"),
            ("GET", "/api/session"),
            ("GET", "/config/log_level"),
            ("POST", "/api/topics"),
            ("DELETE", "/api/topics/orders"),
            ("PUT", "/config/log_level"),
        ]:
            status, headers, body = await http.request(method, path, data=b"")
            assert (status, json.loads(body)) == (401, UNAUTHORIZED), (method, path)
            assert headers["WWW-Authenticate"] == 'Basic realm="nsqadmin", charset="UTF-8"'
        status, headers, _ = await http.get("/api/topics", headers={"X-Requested-With": "nsqadmin"})
        assert status == 401 and "WWW-Authenticate" not in headers
        # what stays open: the health check, the assets, the login page
        assert (await http.get("/ping"))[::2] == (200, b"OK")
        assert (await http.get("/static/css/nsqadmin.css"))[0] == 200
        status, headers, page = await http.get("/login?next=/topics/orders")
        assert status == 200 and b'<form class="login-form" method="post" action="/login"' in page
        assert b'name="next" value="/topics/orders"' in page
        assert headers["Cache-Control"] == "no-store" and headers["X-Frame-Options"] == "DENY"
        # the API said nothing of the cluster
        assert (await http.get("/api/topics/orders"))[0] == 401


async def test_http_basic(cluster, tmp_path):
    await orders(cluster)
    # htpasswd -B writes $2y$; the library's $2b$ and the older $2a$ are the same hash
    lines = [
        htpasswd_entry("ann", "ann-secret"),
        htpasswd_entry("bob", "bob-secret", "$2b$"),
        htpasswd_entry("cy", "cy-secret", "$2a$"),
        APACHE_ENTRY,
    ]
    (tmp_path / "htpasswd").write_text("# nsqadmin users\n\n" + "\n".join(lines) + "\n")
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        htpasswd_file=str(tmp_path / "htpasswd"),
        admin_users=["ann"],
    ) as (_, http):
        for user, password in [
            ("ann", "ann-secret"),
            ("bob", "bob-secret"),
            ("cy", "cy-secret"),
            ("dan", "ann pass"),
        ]:
            status, _, body = await http.get("/api/topics", headers=basic(user, password))
            assert (status, json.loads(body)["topics"]) == (200, ["orders"]), user
        for creds in [("ann", "bob-secret"), ("ann", ""), ("nobody", "ann-secret"), ("ann", "ann-secret ")]:
            status, headers, body = await http.get("/api/topics", headers=basic(*creds))
            assert (status, json.loads(body)) == (401, UNAUTHORIZED), creds
            assert headers["WWW-Authenticate"].startswith("Basic ")
        # a page through Basic: rendered for that user (no CSRF token: Basic needs none)
        status, _, page = await http.get("/topics/orders", headers=basic("bob", "bob-secret"))
        assert status == 200 and b"var IS_ADMIN = false;" in page
        config = json.loads(re.search(rb"var NSQADMIN = (\{.*?\});</script>", page)[1])
        assert config["user"] == "bob"
        assert config["login"] == {"enabled": True, "via": "basic", "csrf_token": ""}
        # an admin acts with Basic credentials and no CSRF token; a read-only user cannot
        status, _, body = await http.post(
            "/api/topics/orders", b'{"action": "pause"}', headers=basic("bob", "bob-secret")
        )
        assert (status, json.loads(body)) == (403, {"message": "FORBIDDEN"})
        assert paused(cluster) == [False, False]
        status, _, body = await http.post(
            "/api/topics/orders", b'{"action": "pause"}', headers=basic("ann", "ann-secret")
        )
        assert (status, json.loads(body)) == (200, {"message": ""})
        assert paused(cluster) == [True, True]
        # sent from another site's page (a browser remembering Basic credentials): refused
        status, _, body = await http.post(
            "/api/topics/orders",
            b'{"action": "unpause"}',
            headers={**basic("ann", "ann-secret"), "Origin": "http://evil.example"},
        )
        assert (status, json.loads(body)) == (403, {"message": "CROSS_SITE_REQUEST"})
        assert paused(cluster) == [True, True]
        status, _, doc = await http.get("/api/session", headers=basic("ann", "ann-secret"))
        assert json.loads(doc) == {
            "user": "ann",
            "is_admin": True,
            "via": "basic",
            "csrf_token": "",
            "expires": None,
        }


async def test_login_session_and_logout(cluster, tmp_path):
    await orders(cluster)
    pw = write_htpasswd(tmp_path / "htpasswd", USERS)
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http], htpasswd_file=pw, session_timeout=3600.0
    ) as (_, http):
        # a wrong password: the form again, with the name typed and the way on kept
        status, headers, page = await http.post(
            "/login", {"user": "ann", "password": "nope", "next": "/topics/orders"}
        )
        assert status == 401 and "Set-Cookie" not in headers
        assert b"Wrong user name or password." in page
        assert b'value="ann"' in page and b'name="next" value="/topics/orders"' in page

        status, headers, _ = await http.post(
            "/login", {"user": "ann", "password": "ann-secret", "next": "/topics/orders"}
        )
        assert (status, headers["Location"]) == (303, "/topics/orders")
        cookie = headers["Set-Cookie"]
        name, _, rest = cookie.partition("=")
        sid = rest.split(";")[0]
        assert name == "nsqadmin_session" and len(sid) >= 40
        attrs = {a.strip().split("=")[0].lower(): a.strip() for a in cookie.split(";")[1:]}
        assert set(attrs) == {"httponly", "max-age", "path", "samesite"}  # not Secure on HTTP
        assert attrs["samesite"] == "SameSite=Strict" and attrs["path"] == "Path=/"
        assert attrs["max-age"] == "Max-Age=3600"

        me = Signed(http, cookie, "")
        status, _, page = await http.get("/topics/orders", headers=me.headers(csrf=False))
        assert status == 200 and b"var IS_ADMIN = true;" in page
        config = json.loads(re.search(rb"var NSQADMIN = (\{.*?\});</script>", page)[1])
        assert config["user"] == "ann" and config["login"]["via"] == "session"
        me.csrf = config["login"]["csrf_token"]
        assert len(me.csrf) >= 40 and me.csrf != sid
        status, doc = await me.call("GET", "/api/session")
        assert status == 200 and doc["user"] == "ann" and doc["csrf_token"] == me.csrf
        assert (await me.call("GET", "/api/topics"))[1]["topics"] == ["orders"]
        # the login page sends a signed-in user on
        status, headers, _ = await http.get("/login?next=/nodes", headers=me.headers())
        assert (status, headers["Location"]) == (303, "/nodes")

        # where to go after: only paths of this nsqadmin
        for bad in [
            "//evil.example/x",
            "http://evil.example/",
            "/\\evil.example",
            "javascript:alert(1)",
            "/logout",
        ]:
            status, headers, _ = await http.post(
                "/login", {"user": "bob", "password": "bob-secret", "next": bad}
            )
            assert (status, headers["Location"]) == (303, "/"), bad

        # logout needs the session's token; then the cookie is cleared and the session gone
        status, _, body = await http.post("/logout", b"", headers=me.headers(csrf=False))
        assert (status, json.loads(body)) == (403, {"message": "INVALID_CSRF_TOKEN"})
        status, headers, _ = await http.post(
            "/logout",
            f"csrf_token={me.csrf}".encode(),
            headers={"Cookie": me.cookie, "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert (status, headers["Location"]) == (303, "/login?signed_out=1")
        assert re.match(r'nsqadmin_session=""; .*Max-Age=0', headers["Set-Cookie"])
        assert (await me.call("GET", "/api/topics"))[0] == 401
        assert (await http.get("/", headers=me.headers()))[0] == 302
        status, _, page = await http.get("/login?signed_out=1")
        assert b"You have signed out." in page


async def test_session_expires_and_base_path(cluster, tmp_path):
    pw = write_htpasswd(tmp_path / "htpasswd", USERS)
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        htpasswd_file=pw,
        session_timeout=1.0,
        base_path="/admin/",
    ) as (_, http):
        status, headers, _ = await http.get("/admin/topics")
        assert (status, headers["Location"]) == (302, "/admin/login?next=/admin/topics")
        status, headers, _ = await http.post("/admin/login", {"user": "bob", "password": "bob-secret"})
        assert (status, headers["Location"]) == (303, "/admin")
        assert "Path=/admin" in headers["Set-Cookie"] and "Max-Age=1" in headers["Set-Cookie"]
        me = Signed(http, headers["Set-Cookie"], "")
        assert (await http.get("/admin/api/topics", headers=me.headers()))[0] == 200

        async def ended() -> bool:
            return (await http.get("/admin/api/topics", headers=me.headers()))[0] == 401

        await wait_for(ended, timeout=10)


async def test_csrf(cluster, tmp_path):
    await orders(cluster)
    pw = write_htpasswd(tmp_path / "htpasswd", USERS)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], htpasswd_file=pw) as (_, http):
        me = await sign_in(http, "ann", "ann-secret")
        refused = (403, {"message": "INVALID_CSRF_TOKEN"})
        for method, path, doc in [
            ("POST", "/api/topics/orders", {"action": "pause"}),
            ("POST", "/api/topics", {"topic": "made"}),
            ("DELETE", "/api/topics/orders/archive", None),
            ("POST", "/api/config/topics/orders", {"max_depth": 10}),
        ]:
            assert await me.call(method, path, doc, csrf=False) == refused, path
            status, _, body = await http.request(
                method, path, data=b"{}", headers=me.headers(csrf=False, **{"X-CSRF-Token": "wrong"})
            )
            assert (status, json.loads(body)) == refused
        assert paused(cluster) == [False, False]
        assert [n.get_topic("orders").channels.get("archive") is not None for n in cluster.nsqds] == [
            True,
            True,
        ]
        # with the token it acts; from another site's page, not even with it
        assert await me.call("POST", "/api/topics/orders", {"action": "pause"}) == (200, {"message": ""})
        assert paused(cluster) == [True, True]
        status, doc = await me.call(
            "POST", "/api/topics/orders", {"action": "unpause"}, Origin="http://evil.example"
        )
        assert (status, doc) == (403, {"message": "CROSS_SITE_REQUEST"})
        status, doc = await me.call(
            "POST", "/api/topics/orders", {"action": "unpause"}, **{"Sec-Fetch-Site": "cross-site"}
        )
        assert status == 403 and paused(cluster) == [True, True]
        # the page's own origin is fine
        status, doc = await me.call(
            "POST", "/api/topics/orders", {"action": "unpause"}, Origin=f"http://{http.base[7:]}"
        )
        assert status == 200 and paused(cluster) == [False, False]
        # reads need no token
        assert (await me.call("GET", "/api/topics/orders", csrf=False))[0] == 200


async def test_admin_and_read_only_users(cluster, tmp_path):
    await orders(cluster)
    pw = write_htpasswd(tmp_path / "htpasswd", USERS)
    async with (
        Recorder() as endpoint,
        running_admin(
            nsqlookupd_http_addresses=[cluster.lookupd_http],
            htpasswd_file=pw,
            admin_users=["ann"],
            notification_http_endpoint=f"http://{endpoint.address}/notify",
        ) as (_, http),
    ):
        bob = await sign_in(http, "bob", "bob-secret")
        # the ACL header means nothing with a login
        for extra in ({}, {"X-Forwarded-User": "ann"}):
            status, _, page = await http.get("/topics/orders", headers=bob.headers(**extra))
            assert status == 200 and b"var IS_ADMIN = false;" in page
            for method, path, doc in [
                ("POST", "/api/topics/orders", {"action": "pause"}),
                ("POST", "/api/topics", {"topic": "made"}),
                ("DELETE", "/api/topics/orders", None),
                ("GET", "/api/peek/topics/orders/archive", None),
            ]:
                assert await bob.call(method, path, doc, **extra) == (403, {"message": "FORBIDDEN"})
        assert (await bob.call("GET", "/api/session"))[1]["is_admin"] is False
        # /config: anyone signed in reads it (from --allow-config-from-cidr); admins change it
        status, _, body = await http.get("/config/log_level", headers=bob.headers())
        assert (status, body) == (200, b"2")  # Go's INFO
        status, _, body = await http.put("/config/log_level", b"debug", headers=bob.headers())
        assert (status, json.loads(body)) == (403, {"message": "FORBIDDEN"})
        assert paused(cluster) == [False, False]

        ann = await sign_in(http, "ann", "ann-secret")
        assert await ann.call("POST", "/api/topics/orders", {"action": "pause"}) == (200, {"message": ""})
        assert paused(cluster) == [True, True]
        [note] = await endpoint.wait_requests(1)
        assert json.loads(note["body"])["user"] == "ann"
        assert (await ann.call("GET", "/api/peek/topics/orders/archive"))[0] == 200
        status, _, body = await http.put("/config/log_level", b"warn", headers=ann.headers())
        assert (status, body) == (200, b"3")  # WARN

    # no --admin-user: every user of the file is an admin (as Go without it)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], htpasswd_file=pw) as (_, http):
        bob = await sign_in(http, "bob", "bob-secret")
        assert await bob.call("POST", "/api/topics/orders", {"action": "unpause"}) == (200, {"message": ""})
        assert paused(cluster) == [False, False]


# --- failed logins ------------------------------------------------------------------------------


async def test_failed_logins_slowed(cluster, tmp_path):
    pw = write_htpasswd(tmp_path / "htpasswd", USERS)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], htpasswd_file=pw) as (_, http):
        me = await sign_in(http, "ann", "ann-secret")
        for i in range(MAX_FAILURES - 2):
            status, _, _ = await http.post("/login", {"user": "ann", "password": f"guess{i}"})
            assert status == 401
        for i in range(2):
            status, _, _ = await http.get("/api/topics", headers=basic("bob", f"guess{i}"))
            assert status == 401
        # the next try, right or wrong, form or Basic, waits
        status, headers, page = await http.post("/login", {"user": "ann", "password": "ann-secret"})
        assert status == 429 and "Set-Cookie" not in headers
        assert 1 <= int(headers["Retry-After"]) <= FAILURE_WINDOW
        assert re.search(rb"Too many failed sign-ins from your address: try again in \d+ s\.", page)
        status, headers, body = await http.get("/api/topics", headers=basic("bob", "bob-secret"))
        assert (status, json.loads(body)) == (429, {"message": "TOO_MANY_FAILED_LOGINS"})
        assert 1 <= int(headers["Retry-After"]) <= FAILURE_WINDOW
        # a session made before goes on
        assert (await me.call("GET", "/api/topics"))[0] == 200


def test_throttle_window():
    now = [1000.0]
    t = LoginThrottle(limit=5, window=60.0, clock=lambda: now[0])
    for _ in range(4):
        t.failed("10.0.0.1")
        now[0] += 1
    assert t.retry_after("10.0.0.1") == 0
    t.failed("10.0.0.1")  # the 5th, at 1004
    assert t.retry_after("10.0.0.1") == 56  # until the first (at 1000) is a minute old
    assert t.retry_after("10.0.0.2") == 0
    now[0] = 1060.0
    assert t.retry_after("10.0.0.1") == 0  # one more may try
    t.failed("10.0.0.1")
    assert t.retry_after("10.0.0.1") == 1
    now[0] = 1200.0
    assert t.retry_after("10.0.0.1") == 0 and "10.0.0.1" not in t.failures


# --- the files: refused at start, re-read on SIGHUP ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no user"),
        ("# nobody yet\n\n", "holds no user"),
        (
            "ann:$apr1$XntAo1RU$R9/rw0lx7XTKJPVakRLAY.\n",  # htpasswd -m
            r"line 1 \(user 'ann'\) is an MD5 \(\$apr1\$\) entry: only bcrypt entries are accepted "
            r"\(make them with htpasswd -B\)",
        ),
        ("{bcrypt}\nbob:{SHA}EfatjsUqKYSrqv18O1FlA3hcIHI=\n", r"line 2 \(user 'bob'\) is a SHA-1"),  # -s
        ("cy:abJnggxhB/yWI\n", r"line 1 \(user 'cy'\) is a crypt \(DES\) or plain-text entry"),
        ("dee:$6$salt$hash\n", r"line 1 \(user 'dee'\) is a crypt\(3\) entry"),
        ("eve:$2y$05$short\n", r"line 1 \(user 'eve'\) is a malformed bcrypt entry"),
        ("no colon here\n", "line 1 is not 'user:hash'"),
    ],
)
async def test_bad_htpasswd_refused(tmp_path, text, message):
    if text.startswith("{bcrypt}"):
        text = htpasswd_entry("ann", "x") + text[len("{bcrypt}") :]
    path = tmp_path / "htpasswd"
    path.write_text(text)
    with pytest.raises(OptionsError, match=f"--htpasswd-file: {re.escape(str(path))} {message}"):
        async with NSQAdmin(
            http_address="127.0.0.1:0", nsqd_http_addresses=["127.0.0.1:4151"], htpasswd_file=str(path)
        ):
            pass


async def test_missing_or_duplicate_entries_refused(tmp_path):
    with pytest.raises(OptionsError, match=r"--htpasswd-file: cannot open .*/nope - No such file"):
        read_htpasswd(str(tmp_path / "nope"))
    path = tmp_path / "htpasswd"
    path.write_text(htpasswd_entry("ann", "a") + "\n" + htpasswd_entry("ann", "b") + "\n")
    with pytest.raises(OptionsError, match=r"lists user 'ann' twice \(lines 1, 2\)"):
        read_htpasswd(str(path))


def test_new_flags():
    o = parse_args(
        [
            "--nsqd-http-address=127.0.0.1:4151",
            "--htpasswd-file=/etc/nsqadmin.htpasswd",
            "--session-timeout=30m",
            "--tls-cert=c.pem",
            "--tls-key=k.pem",
            "--admin-token-file=/etc/nsq/admin-token",
        ]
    )
    assert (o.htpasswd_file, o.session_timeout, o.tls_cert, o.tls_key, o.admin_token_file) == (
        "/etc/nsqadmin.htpasswd",
        1800.0,
        "c.pem",
        "k.pem",
        "/etc/nsq/admin-token",
    )
    assert parse_args([]).session_timeout == 12 * 3600.0
    for args, message in [
        (["--tls-cert=c.pem"], "--tls-key must be specified with --tls-cert"),
        (["--tls-key=k.pem"], "--tls-cert must be specified with --tls-key"),
        (["--session-timeout=0s"], "--session-timeout must be > 0"),
    ]:
        with pytest.raises(OptionsError, match=message):
            validate(parse_args(["--nsqd-http-address=127.0.0.1:4151", *args]))


async def test_reload(cluster, tmp_path):
    path = tmp_path / "htpasswd"
    write_htpasswd(path, USERS)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], htpasswd_file=str(path)) as (
        admin,
        http,
    ):
        ann = await sign_in(http, "ann", "ann-secret")
        bob = await sign_in(http, "bob", "bob-secret")
        # a file that cannot be used keeps the users read before
        path.write_text("ann:$apr1$x$y\n")
        admin.reload()
        assert (await ann.call("GET", "/api/topics"))[0] == 200
        # bob removed and ann's password changed: both sessions end; cy comes in
        write_htpasswd(path, {"ann": "new-secret", "cy": "cy-secret"})
        admin.reload()
        assert (await ann.call("GET", "/api/topics"))[0] == 401
        assert (await bob.call("GET", "/api/topics"))[0] == 401
        assert (await http.get("/api/topics", headers=basic("ann", "ann-secret")))[0] == 401
        assert (await http.get("/api/topics", headers=basic("ann", "new-secret")))[0] == 200
        assert (await http.get("/api/topics", headers=basic("cy", "cy-secret")))[0] == 200


# --- HTTPS --------------------------------------------------------------------------------------


async def test_https(cluster, tmp_path):
    pki = make_pki(tmp_path / "pki")
    pw = write_htpasswd(tmp_path / "htpasswd", USERS)
    async with NSQAdmin(
        http_address="127.0.0.1:0",
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        stats_sample_interval=0.0,
        htpasswd_file=pw,
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
    ) as admin:
        assert admin.scheme == "https"
        ctx = ssl.create_default_context(cafile=pki.ca_cert)
        url = f"https://{admin.http_addr_str}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async with s.get(f"{url}/ping") as r:
                assert (r.status, await r.text()) == (200, "OK")
            async with s.post(
                f"{url}/login", data={"user": "ann", "password": "ann-secret"}, allow_redirects=False
            ) as r:
                assert r.status == 303
                cookie = r.headers["Set-Cookie"]
            assert "; Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
            async with s.get(f"{url}/api/topics", headers={"Cookie": cookie.split(";")[0]}) as r:
                assert r.status == 200
        # plain HTTP finds no HTTP server there
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientError):
                async with s.get(f"http://{admin.http_addr_str}/ping") as r:
                    await r.read()

    # a behind-the-proxy HTTPS: Secure too
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], htpasswd_file=pw) as (_, http):
        status, headers, _ = await http.post(
            "/login", {"user": "ann", "password": "ann-secret"}, headers={"X-Forwarded-Proto": "https"}
        )
        assert status == 303 and "; Secure" in headers["Set-Cookie"]


async def test_bad_tls_files_refused(tmp_path):
    (tmp_path / "c.pem").write_text("not a certificate")
    with pytest.raises(OptionsError, match="failed to build TLS config - "):
        async with NSQAdmin(
            http_address="127.0.0.1:0",
            nsqd_http_addresses=["127.0.0.1:4151"],
            tls_cert=str(tmp_path / "c.pem"),
            tls_key=str(tmp_path / "c.pem"),
        ):
            pass


# --- Go's ACL header mode without --htpasswd-file -----------------------------------------------


async def test_acl_header_mode_without_htpasswd(cluster):
    await orders(cluster)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], admin_users=["boss"]) as (
        _,
        http,
    ):
        status, headers, page = await http.get("/")
        assert status == 200 and "Cache-Control" not in headers
        config = json.loads(re.search(rb"var NSQADMIN = (\{.*?\});</script>", page)[1])
        assert config["login"] == {"enabled": False, "via": "", "csrf_token": ""}
        assert (await http.json("/api/topics"))["topics"] == ["orders"]
        for path in ("/login", "/api/session"):
            assert (await http.get(path))[0] == 404
        assert (await http.post("/logout"))[0] == 404
        # actions: the header's user, no CSRF token, no Origin check (as Go)
        status, _, body = await http.post("/api/topics/orders", b'{"action": "pause"}')
        assert (status, json.loads(body)) == (403, {"message": "FORBIDDEN"})
        status, _, body = await http.post(
            "/api/topics/orders",
            b'{"action": "pause"}',
            headers={"X-Forwarded-User": "boss", "Origin": "http://elsewhere.example"},
        )
        assert (status, json.loads(body)) == (200, {"message": ""})
        assert paused(cluster) == [True, True]
        # Basic credentials are not checked (there is no file): only named in notifications
        status, _, _ = await http.get("/api/topics", headers=basic("ann", "whatever"))
        assert status == 200


# --- --admin-token-file: nsqadmin's token to nsqd and nsqlookupd --------------------------------


async def test_admin_token_sent_to_nsqd_and_nsqlookupd(tmp_path):
    tokens = write_token_file(tmp_path / "tokens", "# ops", "t0ken-one", "t0ken-two")
    own = write_token_file(tmp_path / "admin-token", "t0ken-two")
    wrong = write_token_file(tmp_path / "wrong-token", "not-listed")
    async with Cluster(tmp_path / "c", n=1, admin_token_file=tokens) as cluster:
        nsqd = cluster.nsqds[0]
        nsqd.get_topic("orders").get_channel("archive")
        await cluster.registered("orders", 1)
        await cluster.publish(nsqd, "orders", [b"hello"])
        lookupds = [cluster.lookupd_http]

        # without a token: the nsqd refuses its actions and its messages
        async with running_admin(nsqlookupd_http_addresses=lookupds) as (_, http):
            status, _, body = await http.post("/api/topics/orders", b'{"action": "pause"}')
            assert "got response 401 Unauthorized" in json.loads(body)["message"], (status, body)
            doc = await http.json("/api/peek/topics/orders/archive")
            assert doc["nodes"][0]["error"].startswith("UNAUTHORIZED (this nsqd wants an admin token")
        assert not nsqd.get_topic("orders").paused
        async with running_admin(nsqlookupd_http_addresses=lookupds, admin_token_file=wrong) as (_, http):
            doc = await http.json("/api/peek/topics/orders/archive")
            assert doc["nodes"][0]["error"].startswith("FORBIDDEN (")

        # with it: actions, settings and peek go through
        async with running_admin(nsqlookupd_http_addresses=lookupds, admin_token_file=own) as (admin, http):
            status, _, body = await http.post("/api/topics/orders", b'{"action": "pause"}')
            assert (status, json.loads(body)) == (200, {"message": ""})
            assert nsqd.get_topic("orders").paused
            status, _, body = await http.post("/api/topics/orders/archive", b'{"action": "empty"}')
            assert status == 200, body
            doc = await http.json("/api/peek/topics/orders")
            assert "peek" in doc["nodes"][0], doc
            status, _, body = await http.delete("/api/topics/orders/archive")
            assert status == 200, body
            assert "archive" not in nsqd.get_topic("orders").channels
            # SIGHUP: a file that cannot be used keeps the token; a new one is sent from then on
            (tmp_path / "admin-token").chmod(0o644)
            admin.reload()
            assert admin.client.bearer_token == "t0ken-two"
            write_token_file(tmp_path / "admin-token", "not-listed")
            admin.reload()
            status, _, body = await http.post("/api/topics/orders", b'{"action": "unpause"}')
            assert "got response 403 Forbidden" in json.loads(body)["message"], (status, body)
            write_token_file(tmp_path / "admin-token", "t0ken-one")
            admin.reload()
            status, _, body = await http.post("/api/topics/orders", b'{"action": "unpause"}')
            assert status == 200, body

    # an nsqlookupd with the token file: creating a topic through it needs the token too
    opts = LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", admin_token_file=tokens)
    async with NSQLookupd(opts) as lookupd:
        lookupds = [lookupd.http_addr_str]
        async with running_admin(nsqlookupd_http_addresses=lookupds) as (_, http):
            status, _, body = await http.post("/api/topics", b'{"topic": "made"}')
            assert "got response 401 Unauthorized" in json.loads(body)["message"], (status, body)
        async with running_admin(nsqlookupd_http_addresses=lookupds, admin_token_file=own) as (_, http):
            status, _, body = await http.post("/api/topics", b'{"topic": "made"}')
            assert (status, json.loads(body)) == (200, {"message": ""})
            assert (await http.json("/api/topics"))["topics"] == ["made"]

    # every request carries the file's first token
    first = write_token_file(tmp_path / "first-token", "# for nsqadmin", "t0ken-3", "t0ken-4")
    async with Recorder() as fake:
        async with running_admin(nsqlookupd_http_addresses=[fake.address], admin_token_file=first) as (
            _,
            http,
        ):
            await http.post("/api/topics", b'{"topic": "made"}')
            await http.get("/api/topics")
            await http.get("/api/nodes")
        assert len(fake.requests) >= 3
        assert {r["headers"].get("Authorization") for r in fake.requests} == {"Bearer t0ken-3"}


async def test_admin_token_not_sent_to_graphite(tmp_path):
    own = write_token_file(tmp_path / "admin-token", "t0ken")
    async with Recorder() as graphite:
        graphite.answer = lambda r: web.json_response([{"datapoints": [[60.0, 1]]}])
        async with running_admin(
            nsqd_http_addresses=["127.0.0.1:4151"],
            graphite_url=f"http://{graphite.address}",
            admin_token_file=own,
        ) as (_, http):
            assert (await http.json("/api/graphite?metric=rate&target=x"))["rate"] == "1.00"
        assert "Authorization" not in graphite.requests[0]["headers"]


async def test_bad_token_file_refused(tmp_path):
    path = tmp_path / "token"
    path.write_text("t0ken\n")
    path.chmod(0o644)
    with pytest.raises(OptionsError, match=r"--admin-token-file: .* is readable by other users"):
        async with NSQAdmin(
            http_address="127.0.0.1:0", nsqd_http_addresses=["127.0.0.1:4151"], admin_token_file=str(path)
        ):
            pass
