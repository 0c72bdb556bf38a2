"""What an nsqd loads only when a flag or a client asks for it: the HTTP server
(nsqpy.httpserver) starts with the HTTP listener's first connection; TLS, compression, AUTH,
--config and the debug endpoints' modules load with their first use; and an nsqd in real use
(pinged, scraped, a producer and a consumer) never loads aiohttp or prometheus_client. An
idle daemon stays small (bench/bench_idle.py), one in real use too (bench/bench_rss.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest
from conftest import make_options

from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(60)


async def test_the_http_server_starts_with_the_first_connection(tmp_path):
    async with NSQD(make_options(tmp_path)) as nsqd:
        listener = nsqd._http_listener
        assert listener is not None and listener.runner is None
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{nsqd.http_port}/ping") as r:
                assert r.status == 200 and await r.read() == b"OK"
            assert listener.runner is not None
            async with s.get(f"http://127.0.0.1:{nsqd.http_port}/info") as r:
                assert r.status == 200


async def test_a_listener_never_used_is_closed_on_stop(tmp_path):
    nsqd = NSQD(make_options(tmp_path))
    await nsqd.start()
    port = nsqd.http_port
    await nsqd.stop()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


IDLE_SCRIPT = r"""
import asyncio, json, socket, struct, sys, tempfile
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options

async def main():
    opts = Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0",
                   data_path=tempfile.mkdtemp())
    async with NSQD(opts) as nsqd:
        unused = sorted(sys.modules)
        r, w = await asyncio.open_connection("127.0.0.1", nsqd.tcp_port)
        w.write(b"  V2" + b"PUB t\n" + struct.pack(">i", 5) + b"hello")
        await w.drain()
        frame = await r.readexactly(10)
        w.close()
        print(json.dumps({"ok": frame[-2:] == b"OK", "modules": sorted(sys.modules), "unused": unused,
                          "topics": sorted(nsqd.topics)}))

asyncio.run(main())
"""


def run_idle_script() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", IDLE_SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    doc: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def test_an_idle_daemon_loads_no_http_tls_compression_or_metrics_modules(tmp_path):
    doc = run_idle_script()
    assert doc["ok"]
    loaded = set(doc["modules"])
    for name in (
        "aiohttp",
        "nsqpy.nsqd.http",
        "nsqpy.transport",
        "OpenSSL",
        "cramjam",
        "prometheus_client",
        "hashlib",
        "urllib.parse",
    ):
        assert name not in loaded, f"{name} loaded by an idle nsqd"


def test_topics_and_the_tcp_protocol_load_with_the_first_topic_and_connection(tmp_path):
    doc = run_idle_script()
    unused, loaded = set(doc["unused"]), set(doc["modules"])
    lazy = (
        "nsqpy.nsqd.protocol_v2",
        "nsqpy.nsqd.client_v2",
        "nsqpy.nsqd.topic",
        "nsqpy.nsqd.channel",
        "nsqpy.nsqd.diskqueue",
    )
    for name in lazy:
        assert name not in unused, f"{name} loaded by an nsqd with no topic and no client"
    # ... and the first connection's PUB created the topic and was answered OK
    assert doc["ok"] and doc["topics"] == ["t"]
    assert loaded.issuperset(lazy)


REAL_USE_SCRIPT = r"""
import asyncio, json, struct, sys, tempfile
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options
from nsqpy.nsqlookupd.nsqlookupd import NSQLookupd
from nsqpy.nsqlookupd.options import Options as LookupdOptions

async def get(port, path):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await r.read()
    w.close()
    return data.split(b" ", 2)[1]

async def main():
    lookupd = NSQLookupd(LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"))
    await lookupd.start()
    opts = Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0",
                   data_path=tempfile.mkdtemp(), nsqlookupd_tcp_addresses=[lookupd.tcp_addr_str])
    async with NSQD(opts) as nsqd:
        while not nsqd.lookup_peers.http_addresses():  # lookupd answered IDENTIFY
            await asyncio.sleep(0.01)
        statuses = [await get(nsqd.http_port, p) for p in ("/ping", "/stats", "/metrics")]
        pr, pw = await asyncio.open_connection("127.0.0.1", nsqd.tcp_port)
        pw.write(b"  V2" + b"PUB t\n" + struct.pack(">i", 5) + b"hello")
        await pw.drain()
        published = (await pr.readexactly(10))[-2:] == b"OK"
        cr, cw = await asyncio.open_connection("127.0.0.1", nsqd.tcp_port)
        cw.write(b"  V2SUB t c\nRDY 1\n")
        await cr.readexactly(10)
        frame = await cr.readexactly(8)
        size = struct.unpack(">i", frame[:4])[0]
        body = (await cr.readexactly(size - 4))[-5:]
        print(json.dumps({"statuses": [s.decode() for s in statuses], "published": published,
                          "body": body.decode(), "modules": sorted(sys.modules)}))
        pw.close()
        cw.close()
    await lookupd.stop()

import uvloop  # as the nsqd console script runs
uvloop.run(main())
"""


def test_a_daemon_in_real_use_loads_no_aiohttp_prometheus_client_or_config_parsers():
    """Pinged, stats and metrics scraped, one producer and one consumer, an nsqlookupd asked
    for the new topic's channels: the HTTP server is nsqpy.httpserver, /metrics nsqpy.metrics
    and the lookupd query nsqpy.httpget, none of the client libraries (issue 31). (nsqlookupd
    runs in the same process here: it loads no more than nsqd.)"""
    out = subprocess.run(
        [sys.executable, "-c", REAL_USE_SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["statuses"] == ["200", "200", "200"] and doc["published"] and doc["body"] == "hello"
    loaded = set(doc["modules"])
    assert {"nsqpy.httpserver", "nsqpy.nsqd.http", "nsqpy.metrics", "nsqpy.httpget"} <= loaded
    for name in (
        "aiohttp",
        "multidict",
        "yarl",
        "propcache",
        "frozenlist",
        "aiosignal",
        "aiohappyeyeballs",
        "attr",
        "prometheus_client",
        "http.server",
        "wsgiref",
        "gzip",
        "cramjam",
        "OpenSSL",
        "html",
        "urllib.parse",
        "email",
        "tomllib",
        "encodings.idna",
        "decimal",
        "datetime",
        "cProfile",
        "tracemalloc",
        "nsqpy.nsqadmin",
    ):
        assert name not in loaded, f"{name} loaded by an nsqd in real use"
