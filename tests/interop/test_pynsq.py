"""The official pynsq 0.9.1 client (``nsq.Writer``, ``nsq.Reader``) against our nsqd.

nsqd runs from its console script; pynsq runs in tests/interop/pynsq_driver.py in its own
process (its own Tornado IOLoop), with a hard timeout.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import ClassVar

import pytest
from e2e.proc import nsqd_fixture
from interop_helpers import drive, make_bodies

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def nsqd_proc(tmp_path):
    yield from nsqd_fixture(tmp_path)


def deliveries_by_body(result):
    out = defaultdict(list)
    for d in result["deliveries"]:
        out[d["body"]].append(d)
    return out


def assert_clean(result):
    assert result["status"] == "ok", result["error"] + "\n" + result["_stderr"][-4000:]
    assert result["errors"] == [], result["errors"]
    bad = [r for r in result["pub_results"] if not r["ok"]]
    assert bad == [], bad


def test_writer_pub_mpub_dpub_reader_fin_req(nsqd_proc):
    """1211 messages (PUB, MPUB, DPUB, one of 512 KiB) published by nsq.Writer arrive at
    nsq.Reader (max_in_flight 50) byte-exact; handler False → REQ → redelivered with
    attempts 2; DPUB is not delivered before its delay."""
    pub = make_bodies("pub", 400, 1)
    pub.append(b"big|" + bytes(range(256)) * 2048)  # 512 KiB + 4
    mpub = make_bodies("mpub", 800, 2)
    dpub = [(200 + 50 * i, b) for i, b in enumerate(make_bodies("dpub", 10, 3))]
    requeue = pub[::20] + mpub[::40]
    spec = {
        "nsqd": nsqd_proc.tcp_address,
        "topic": "pynsq_bulk",
        "channel": "ch",
        "max_in_flight": 50,
        "reader_conn": {"requeue_delay": 0},
        "pub": [b.hex() for b in pub],
        "mpub": [[b.hex() for b in mpub[i : i + 100]] for i in range(0, len(mpub), 100)],
        "dpub": [[d, b.hex()] for d, b in dpub],
        "requeue_first": [b.hex() for b in requeue],
        "deadline": 40,
    }
    result = drive("pynsq_driver.py", spec, timeout=50)
    assert_clean(result)

    expected = {b.hex() for b in pub + mpub} | {b.hex() for _, b in dpub}
    assert len(expected) == 1211
    assert set(result["finished"]) == expected
    assert all(n == 1 for n in result["finished"].values()), "a message was FINished twice"

    by_body = deliveries_by_body(result)
    assert set(by_body) == expected
    requeued = {b.hex() for b in requeue}
    for h, ds in by_body.items():
        attempts = [d["attempts"] for d in ds]
        if h in requeued:
            assert attempts == [1, 2], (bytes.fromhex(h)[:20], attempts)
            assert ds[0]["id"] == ds[1]["id"], "REQ'd message came back with another id"
        else:
            assert attempts == [1], (bytes.fromhex(h)[:20], attempts)

    ids = [ds[0]["id"] for ds in by_body.values()]
    assert len(set(ids)) == len(ids), "message ids are not unique"

    for delay_ms, b in dpub:
        sent = result["pub_sent_at"][b.hex()]
        got = by_body[b.hex()][0]["t"]
        assert got - sent >= delay_ms / 1000 - 0.01, (delay_ms, got - sent)

    (ident,) = result["identify"]["reader"]
    assert ident["max_rdy_count"] == 2500
    assert ident["version"] == "1.3.0"
    assert result["reader_ready"] == 1 and result["writer_ready"] == 1


def test_touch_heartbeats_and_msg_timeout(nsqd_proc):
    """heartbeat_interval=1s and msg_timeout=1s: TOUCHed messages are kept past the
    timeout (not redelivered); an unanswered one is redelivered (attempts 2) after ~1 s;
    after >3.5 s connected and heartbeats on both connections, a late MPUB still flows
    through the same connections."""
    normal = make_bodies("normal", 50, 4)
    touched = make_bodies("touch", 3, 5)
    held = make_bodies("hold", 1, 6)
    late = make_bodies("late", 200, 7)
    spec = {
        "nsqd": nsqd_proc.tcp_address,
        "topic": "pynsq_touch",
        "max_in_flight": 10,
        "reader_conn": {"heartbeat_interval": 1, "msg_timeout": 1, "requeue_delay": 0},
        "writer_conn": {"heartbeat_interval": 1},
        "pub": [b.hex() for b in normal + touched + held],
        "touch": [b.hex() for b in touched],
        "touch_for": 2.5,
        "touch_every": 0.2,
        "hold": [b.hex() for b in held],
        "late": [b.hex() for b in late],
        "min_connected": 3.5,
        "min_heartbeats": 2,
        "deadline": 40,
    }
    result = drive("pynsq_driver.py", spec, timeout=50)
    assert_clean(result)

    by_body = deliveries_by_body(result)
    expected = {b.hex() for b in normal + touched + held + late}
    assert set(result["finished"]) == expected
    assert all(n == 1 for n in result["finished"].values())

    for b in touched:
        ds = by_body[b.hex()]
        assert [d["attempts"] for d in ds] == [1], "a TOUCHed message timed out and was redelivered"
        assert result["touches"][b.hex()] >= 5
    (hold_body,) = held
    ds = by_body[hold_body.hex()]
    assert [d["attempts"] for d in ds] == [1, 2]
    assert ds[1]["t"] - ds[0]["t"] >= 0.9, "redelivered before msg_timeout (1 s)"
    for b in normal + late:
        assert [d["attempts"] for d in by_body[b.hex()]] == [1]

    (ident,) = result["identify"]["reader"]
    assert ident["msg_timeout"] == 1000
    assert result["reader_heartbeats"] >= 2 and result["writer_heartbeats"] >= 2
    assert result["late_published_at"] - result["reader_connected_at"] >= 3.5
    assert (result["reader_ready"], result["writer_ready"]) == (1, 1), "a connection was re-made"


@pytest.mark.parametrize(
    "reader_conn,writer_conn",
    [
        ({"snappy": True}, {"deflate": True, "deflate_level": 3}),
        ({"deflate": True, "deflate_level": 9}, {"snappy": True}),
    ],
    ids=["reader-snappy-writer-deflate", "reader-deflate-writer-snappy"],
)
def test_compression_is_negotiated(nsqd_proc, reader_conn, writer_conn):
    """pynsq asks for snappy/deflate: nsqd agrees in the IDENTIFY response (deflate at most
    --max-deflate-level, 6), both sides upgrade, and frames flow compressed both ways. /stats
    shows the pynsq consumer as pynsq identified itself, with its compression."""
    bodies = make_bodies("cmp", 300, 8)
    spec = {
        "nsqd": nsqd_proc.tcp_address,
        "topic": "pynsq_compress",
        "max_in_flight": 20,
        "reader_conn": reader_conn,
        "writer_conn": writer_conn,
        "pub": [b.hex() for b in bodies[:100]],
        "mpub": [[b.hex() for b in bodies[100:]]],
        "stats_url": f"http://{nsqd_proc.http_address}/stats?format=json&topic=pynsq_compress",
        "deadline": 30,
    }
    result = drive("pynsq_driver.py", spec, timeout=40)
    assert_clean(result)
    assert set(result["finished"]) == {b.hex() for b in bodies}
    for side, conn in (("reader", reader_conn), ("writer", writer_conn)):
        (ident,) = result["identify"][side]
        assert ident["snappy"] is bool(conn.get("snappy")), ident
        assert ident["deflate"] is bool(conn.get("deflate")), ident
        if conn.get("deflate"):
            assert ident["deflate_level"] == min(conn["deflate_level"], 6), ident
        assert ident["tls_v1"] is False, ident
    (topic,) = result["stats"]["topics"]
    assert topic["message_count"] == 300
    (chan,) = topic["channels"]
    (client,) = chan["clients"]
    assert client["user_agent"] == "pynsq/0.9.1", client
    assert client["snappy"] is bool(reader_conn.get("snappy")), client
    assert client["deflate"] is bool(reader_conn.get("deflate")), client
    assert client["finish_count"] == 300 and client["in_flight_count"] == 0, client


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from transport.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


class _AuthHandler(__import__("http.server").server.BaseHTTPRequestHandler):
    """A tiny auth server: secret "pynsq-secret" may publish and subscribe to ^tls_."""

    seen: ClassVar[list[dict]] = []

    def do_GET(self):
        import urllib.parse

        q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        self.seen.append(q)
        if q.get("secret") != "pynsq-secret":
            self.send_response(403)
            self.end_headers()
            return
        body = json.dumps(
            {
                "ttl": 60,
                "identity": "pynsq-user",
                "identity_url": "",
                "authorizations": [
                    {"topic": "^tls_", "channels": [".*"], "permissions": ["publish", "subscribe"]}
                ],
            }
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def authd():
    import http.server
    import threading

    _AuthHandler.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AuthHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize(
    "reader_extra,writer_extra",
    [({"snappy": True}, {"deflate": True, "deflate_level": 6}), ({}, {"snappy": True})],
    ids=["tls+snappy/tls+deflate", "tls/tls+snappy"],
)
def test_tls_compression_and_auth(tmp_path, pki, authd, reader_extra, writer_extra):
    """pynsq with tls_v1 (verifying nsqd's certificate against the test CA) stacked with
    snappy or deflate, and AUTH against an auth server, on an nsqd that requires TLS."""
    import ssl

    from e2e.proc import NsqdProcess

    p = NsqdProcess(
        tmp_path / "nsqd",
        f"--tls-cert={pki.server_cert}",
        f"--tls-key={pki.server_key}",
        "--tls-required=true",
        "--https-address=127.0.0.1:0",
        f"--auth-http-address={authd}",
    ).start()
    try:
        tls = {
            "tls_v1": True,
            "tls_options": {"ca_certs": pki.ca_cert, "cert_reqs": int(ssl.CERT_REQUIRED)},
            "auth_secret": "pynsq-secret",
        }
        bodies = make_bodies("tls", 300, 9)
        spec = {
            "nsqd": p.tcp_address,
            "topic": "tls_topic",
            "max_in_flight": 20,
            "reader_conn": {**tls, **reader_extra},
            "writer_conn": {**tls, **writer_extra},
            "pub": [b.hex() for b in bodies[:100]],
            "mpub": [[b.hex() for b in bodies[100:]]],
            "deadline": 30,
        }
        result = drive("pynsq_driver.py", spec, timeout=40)
        assert_clean(result)
        assert set(result["finished"]) == {b.hex() for b in bodies}
        for side, extra in (("reader", reader_extra), ("writer", writer_extra)):
            (ident,) = result["identify"][side]
            assert ident["tls_v1"] is True and ident["auth_required"] is True, ident
            assert ident["snappy"] is bool(extra.get("snappy")), ident
            assert ident["deflate"] is bool(extra.get("deflate")), ident
        assert {q["tls"] for q in _AuthHandler.seen} == {"true"}
        assert len(_AuthHandler.seen) == 2  # one AUTH per connection
    finally:
        code = p.stop()
    assert code == 0, p.describe()
    assert "Traceback" not in p.stderr(), p.describe()
