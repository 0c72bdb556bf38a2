"""What an nsqd loads only when a flag or a client asks for it: the HTTP server (aiohttp)
starts with the HTTP listener's first connection; TLS, compression, AUTH and Prometheus
modules load with their first use. An idle daemon stays small (bench/bench_idle.py)."""

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
