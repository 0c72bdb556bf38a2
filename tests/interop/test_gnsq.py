"""gnsq 1.0.2 (gevent) against our nsqd.

nsqd runs from its console script; gnsq runs in tests/interop/gnsq_driver.py in its own
process (gevent's monkey-patching never reaches pytest), with a hard timeout.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from e2e.proc import nsqd_fixture
from interop_helpers import drive, make_bodies

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def nsqd_proc(tmp_path):
    yield from nsqd_fixture(tmp_path)


def by_body(deliveries):
    out = defaultdict(list)
    for d in deliveries:
        out[d["body"]].append(d)
    return out


def assert_ok(result):
    assert result["status"] == "ok", result["error"] + "\n" + result["_stderr"][-4000:]


def test_producer_consumer(nsqd_proc):
    """1108 messages through gnsq.Producer (publish, multipublish, publish(defer=)) arrive at
    a gnsq.Consumer (max_in_flight 32) byte-exact; NSQRequeueMessage and a plain exception
    from the handler both REQ, and the message comes back with attempts 2. The Consumer reads
    through deflate. (gnsq 1.0.2's Producer cannot use snappy, deflate or TLS with any nsqd,
    Go's included: the OK that follows an upgrade reaches its response handler before the
    connection is registered, a KeyError.)"""
    pub = make_bodies("gpub", 300, 11)
    mpub = make_bodies("gmpub", 800, 12)
    dpub = [(150 + 50 * i, b) for i, b in enumerate(make_bodies("gdpub", 8, 13))]
    req_signal = pub[::30] + mpub[::80]
    req_exc = pub[5::60] + mpub[7::160]
    spec = {
        "scenario": "producer_consumer",
        "nsqd": nsqd_proc.tcp_address,
        "topic": "gnsq_bulk",
        "max_in_flight": 32,
        "producer_conn": {},
        "consumer_conn": {"deflate": True},
        "pub": [b.hex() for b in pub],
        "mpub": [[b.hex() for b in mpub[i : i + 100]] for i in range(0, len(mpub), 100)],
        "dpub": [[d, b.hex()] for d, b in dpub],
        "requeue_signal": [b.hex() for b in req_signal],
        "requeue_exception": [b.hex() for b in req_exc],
        "deadline": 40,
    }
    result = drive("gnsq_driver.py", spec, timeout=50)
    assert_ok(result)
    assert result["errors"] == []
    assert result["pub_responses"] == ["OK"] * (len(pub) + len(spec["mpub"]) + len(dpub))

    expected = {b.hex() for b in pub + mpub} | {b.hex() for _, b in dpub}
    assert len(expected) == 1108
    assert set(result["finished"]) == expected
    assert all(n == 1 for n in result["finished"].values())

    deliveries = by_body(result["deliveries"])
    requeued = {b.hex() for b in req_signal + req_exc}
    assert len(requeued) == len(req_signal) + len(req_exc)
    for h, ds in deliveries.items():
        want = [1, 2] if h in requeued else [1]
        assert [d["attempts"] for d in ds] == want, (bytes.fromhex(h)[:20], ds)
    for delay_ms, b in dpub:
        waited = deliveries[b.hex()][0]["t"] - result["pub_sent_at"][b.hex()]
        assert waited >= delay_ms / 1000 - 0.01, (delay_ms, waited)
    assert result["connections"] == 1


def test_lowlevel_tcp_client(nsqd_proc):
    """gnsq.NsqdTCPClient: IDENTIFY, the producer upgraded to deflate (level 5) and the
    consumer to snappy, PUB/MPUB/DPUB → OK each, SUB, RDY,
    REQ with a 200 ms delay → redelivered (attempts 2) no sooner, TOUCH, FIN; E_FIN_FAILED
    is NSQFinishFailed and not fatal; heartbeats every second are answered (gnsq NOPs) and
    the connections keep working; CLS → CLOSE_WAIT; an empty PUB is the fatal
    E_BAD_MESSAGE (NSQBadMessage)."""
    pub = make_bodies("lpub", 50, 21)
    mpub = make_bodies("lmpub", 300, 22)
    dpub = [(100 * (i + 1), b) for i, b in enumerate(make_bodies("ldpub", 3, 23))]
    requeue = pub[::10] + mpub[::60]
    touch = pub[3:8]
    spec = {
        "scenario": "lowlevel",
        "nsqd": nsqd_proc.tcp_address,
        "topic": "gnsq_lowlevel",
        "pub": [b.hex() for b in pub],
        "mpub": [b.hex() for b in mpub],
        "dpub": [[d, b.hex()] for d, b in dpub],
        "requeue": [b.hex() for b in requeue],
        "touch": [b.hex() for b in touch],
        "requeue_delay_ms": 200,
        "rdy": 100,
        "deadline": 40,
    }
    result = drive("gnsq_driver.py", spec, timeout=50)
    assert_ok(result)
    assert result["pub_responses"] == [[0, "OK"]] * (len(pub) + 1 + len(dpub))

    for key, want in (
        ("identify_producer", (False, True, False)),
        ("identify_consumer", (True, False, False)),
    ):
        ident = result[key]
        assert (ident["snappy"], ident["deflate"], ident["tls_v1"]) == want, ident
        assert ident["max_rdy_count"] == 2500 and ident["version"] == "1.3.0", ident
    assert result["identify_producer"]["deflate_level"] == 5

    expected = {b.hex() for b in pub + mpub} | {b.hex() for _, b in dpub}
    assert set(result["finished"]) == expected
    assert all(n == 1 for n in result["finished"].values())
    deliveries = by_body(result["deliveries"])
    requeued = {b.hex() for b in requeue}
    for h, ds in deliveries.items():
        want = [1, 2] if h in requeued else [1]
        assert [d["attempts"] for d in ds] == want, ds
        if h in requeued:
            assert ds[1]["t"] - ds[0]["t"] >= 0.19, "REQ delay of 200 ms not honoured"
    for delay_ms, b in dpub:
        waited = deliveries[b.hex()][0]["t"] - result["pub_sent_at"][b.hex()]
        assert waited >= delay_ms / 1000 - 0.01, (delay_ms, waited)

    ff = result["fin_failed"]
    assert ff["class"] == "NSQFinishFailed" and ff["fatal"] is False and ff["connected"] is True, ff
    assert ff["text"].startswith("FIN 0000000000000000 failed"), ff
    errors = [f for f in result["frames"] if f[0] == "error"]
    assert len(errors) == 2, f"unexpected error frames (TOUCH/FIN/REQ failures?): {errors}"

    assert result["consumer_heartbeats"] >= 2 and result["producer_heartbeats"] >= 2
    assert result["late_pub"] == "OK" and result["late_message"] == "after-heartbeats"
    assert result["cls_response"] == "CLOSE_WAIT"
    bm = result["bad_message"]
    assert bm["class"] == "NSQBadMessage" and bm["fatal"] is True, bm
    assert bm["text"] == "PUB invalid message body size 0", bm


def http_missing(nsqd_proc) -> list[str]:
    """HTTP endpoints the gnsq HTTP client needs that still answer 404."""
    probes = [
        ("POST", "/pub?topic=gnsq_probe"),
        ("POST", "/mpub?topic=gnsq_probe"),
        ("GET", "/stats?format=json"),
        ("POST", "/topic/create?topic=gnsq_probe"),
        ("POST", "/channel/create?topic=gnsq_probe&channel=probe"),
        ("GET", "/info"),
    ]
    missing = []
    for method, path in probes:
        if method == "GET":
            status, body = nsqd_proc.http_get(path)
        else:
            status, body = nsqd_proc.http_post(path, b"probe")
        if status == 404 and b"NOT_FOUND" in body:
            missing.append(f"{method} {path.split('?')[0]}")
    if not missing:
        nsqd_proc.http_post("/topic/delete?topic=gnsq_probe")
    return missing


def test_http_client(nsqd_proc):
    """gnsq.NsqdHTTPClient: ping, info, publish, text and binary multipublish, stats,
    topic/channel create/pause/empty/delete (404 for missing ones); the published bodies are
    then consumed over TCP byte-exact."""
    missing = http_missing(nsqd_proc)
    assert not missing, f"nsqd HTTP API answers 404 for {', '.join(missing)}"
    pub = make_bodies("hpub", 20, 31)
    text = [f"htext-{i:04d} plain line".encode() for i in range(100)]
    binary = make_bodies("hbin", 100, 32)
    spec = {
        "scenario": "http",
        "nsqd": nsqd_proc.tcp_address,
        "nsqd_http": nsqd_proc.http_address,
        "topic": "gnsq_http",
        "pub": [b.hex() for b in pub],
        "mpub_text": [b.hex() for b in text],
        "mpub_binary": [b.hex() for b in binary],
        "deadline": 30,
    }
    result = drive("gnsq_driver.py", spec, timeout=40)
    assert_ok(result)
    res = result["http"]
    assert res["ping"] == "OK"
    assert res["publish"] == "OK" and res["mpub_text"] == "OK" and res["mpub_binary"] == "OK"
    assert res["info"]["version"] == "1.3.0" and res["info"]["tcp_port"] == nsqd_proc.tcp_port

    (topic,) = [t for t in res["stats"]["topics"] if t["topic_name"] == "gnsq_http"]
    assert topic["message_count"] == 220
    (chan,) = topic["channels"]
    assert chan["channel_name"] == "http" and chan["depth"] == 220

    assert "<404>" in res["pause_missing_channel"]
    assert "<404>" in res["delete_missing_topic"]
    assert set(result["finished"]) == {b.hex() for b in pub + text + binary}
    assert all(n == 1 for n in result["finished"].values())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from transport.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize(
    "extra",
    [{}, {"snappy": True}, {"deflate": True, "deflate_level": 3}],
    ids=["tls", "tls+snappy", "tls+deflate"],
)
def test_tls_and_compression(tmp_path, pki, extra):
    """gnsq.NsqdTCPClient over TLS (nsqd's certificate verified against the test CA, a
    client certificate presented for --tls-client-auth-policy=require-verify), optionally
    stacked with snappy or deflate."""
    import ssl

    from e2e.proc import NsqdProcess

    p = NsqdProcess(
        tmp_path / "nsqd",
        f"--tls-cert={pki.server_cert}",
        f"--tls-key={pki.server_key}",
        "--tls-client-auth-policy=require-verify",
        f"--tls-root-ca-file={pki.ca_cert}",
        "--https-address=127.0.0.1:0",
    ).start()
    try:
        bodies = make_bodies("gtls", 200, 31)
        conn = {
            "tls_v1": True,
            "tls_options": {
                "ca_certs": pki.ca_cert,
                "cert_reqs": int(ssl.CERT_REQUIRED),
                "certfile": pki.client_cert,
                "keyfile": pki.client_key,
            },
            **extra,
        }
        spec = {
            "scenario": "upgraded",
            "nsqd": p.tcp_address,
            "topic": "gnsq_tls",
            "conn": conn,
            "bodies": [b.hex() for b in bodies],
            "deadline": 30,
        }
        result = drive("gnsq_driver.py", spec, timeout=40)
        assert_ok(result)
        ident = result["identify"]
        assert ident["tls_v1"] is True, ident
        assert ident["snappy"] is bool(extra.get("snappy")), ident
        assert ident["deflate"] is bool(extra.get("deflate")), ident
        assert (result["pub"], result["mpub"]) == ("OK", "OK")
        assert sorted(result["finished"]) == sorted(b.hex() for b in bodies)
    finally:
        code = p.stop()
    assert code == 0, p.describe()
    assert "Traceback" not in p.stderr(), p.describe()
