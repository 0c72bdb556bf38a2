"""nsqlookupd's TCP protocol V1 over raw sockets (NSQ 1.3.0 ``nsqlookupd/tcp.go`` and
``lookup_protocol_v1.go``): responses, exact error texts, closing, and what the registry
shows over HTTP afterwards."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import aiohttp
import pytest
from lookupd_helpers import (  # noqa: F401  (fixtures)
    HTTP,
    PEER,
    V1Client,
    clients_fixture,
    http_fixture,
    lookupd_fixture,
    lookupd_options,
)
from support import wait_for

from nsqpy.nsqlookupd import NSQLookupd

pytestmark = pytest.mark.timeout(30)


def body_of(fields: dict) -> bytes:
    data = json.dumps(fields).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(data)) + data


async def expect_error(c: V1Client, text: bytes) -> None:
    assert await c.response() == text
    await c.expect_closed()


# --- magic, PING, IDENTIFY --------------------------------------------------------------------


async def test_bad_magic_is_refused(lookupd, clients):
    c = await clients(magic=False)
    c.send(b"  V2PING\n")
    await expect_error(c, b"E_BAD_PROTOCOL")


async def test_magic_split_across_writes(lookupd, clients):
    c = await clients(magic=False)
    for b in b"  V1PING\n":
        c.send(bytes([b]))
        await c.writer.drain()
    assert await c.response() == b"OK"


async def test_client_gone_before_magic_does_not_hurt(lookupd, clients):
    c = await clients(magic=False)
    c.send(b" ")
    await c.close()
    ok = await clients()
    assert await ok.command(b"PING\n") == b"OK"


async def test_ping_before_identify_is_ok(lookupd, clients):
    c = await clients()
    assert await c.command(b"PING\n") == b"OK"
    assert await c.command(b"PING extra words\n") == b"OK"


async def test_identify_reply_describes_this_lookupd(lookupd, clients):
    c = await clients()
    c.send(body_of(PEER))
    raw = await c.response()
    reply = json.loads(raw)
    assert list(reply) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
    assert reply == {
        "broadcast_address": lookupd.options.broadcast_address,
        "hostname": socket.gethostname(),
        "http_port": lookupd.http_port,
        "tcp_port": lookupd.tcp_port,
        "version": "1.3.0",
    }
    assert b" " not in raw  # compact, as Go's json.Marshal
    assert await c.command(b"PING\n") == b"OK"


async def test_identify_with_broadcast_address_option():
    async with NSQLookupd(lookupd_options(broadcast_address="lookupd.example")) as lk:
        c = await V1Client.connect(lk.tcp_port)
        try:
            assert (await c.identify())["broadcast_address"] == "lookupd.example"
        finally:
            await c.close()


@pytest.mark.parametrize("missing", ["broadcast_address", "tcp_port", "http_port", "version"])
async def test_identify_requires_fields(lookupd, clients, missing):
    c = await clients()
    fields = {k: v for k, v in PEER.items() if k != missing}
    c.send(body_of(fields))
    await expect_error(c, b"E_BAD_BODY IDENTIFY missing fields")


@pytest.mark.parametrize("zero", [{"tcp_port": 0}, {"version": ""}, {"broadcast_address": ""}])
async def test_identify_zero_values_count_as_missing(lookupd, clients, zero):
    c = await clients()
    c.send(body_of({**PEER, **zero}))
    await expect_error(c, b"E_BAD_BODY IDENTIFY missing fields")


async def test_identify_hostname_is_optional(lookupd, clients):
    c = await clients()
    fields = {k: v for k, v in PEER.items() if k != "hostname"}
    c.send(body_of(fields))
    assert json.loads(await c.response())["version"] == "1.3.0"


@pytest.mark.parametrize("body", [b"nope", b'{"tcp_port": "4150"}', b"[]"])
async def test_identify_bad_json(lookupd, clients, body):
    c = await clients()
    c.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    await expect_error(c, b"E_BAD_BODY IDENTIFY failed to decode JSON body")


async def test_identify_negative_size(lookupd, clients):
    c = await clients()
    c.send(b"IDENTIFY\n" + struct.pack(">i", -1))
    await expect_error(c, b"E_BAD_BODY IDENTIFY failed to read body")


async def test_identify_twice_is_refused_without_reading_a_body(lookupd, clients):
    c = await clients()
    await c.identify()
    c.send(b"IDENTIFY\n")
    await expect_error(c, b"E_INVALID cannot IDENTIFY again")


async def test_identify_body_in_pieces(lookupd, clients):
    c = await clients()
    data = body_of(PEER)
    for i in range(0, len(data), 7):
        c.send(data[i : i + 7])
        await c.writer.drain()
    assert json.loads(await c.response())["version"] == "1.3.0"


# --- REGISTER / UNREGISTER ----------------------------------------------------------------------


@pytest.mark.parametrize("line", [b"REGISTER t\n", b"UNREGISTER t c\n"])
async def test_register_requires_identify(lookupd, clients, line):
    c = await clients()
    c.send(line)
    await expect_error(c, b"E_INVALID client must IDENTIFY")


@pytest.mark.parametrize(
    "line,error",
    [
        (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
        (b"UNREGISTER \n", b"E_INVALID UNREGISTER insufficient number of params"),
        (b"REGISTER a!\n", b"E_BAD_TOPIC REGISTER topic name 'a!' is not valid"),
        (b"REGISTER  c\n", b"E_BAD_TOPIC REGISTER topic name '' is not valid"),
        (b"UNREGISTER t\xff\n", b"E_BAD_TOPIC UNREGISTER topic name 't\xff' is not valid"),
        (b"REGISTER t c!\n", b"E_BAD_CHANNEL REGISTER channel name 'c!' is not valid"),
        (
            b"UNREGISTER t " + b"c" * 65 + b"\n",
            b"E_BAD_CHANNEL UNREGISTER channel name '" + b"c" * 65 + b"' is not valid",
        ),
        (b"FOO\n", b"E_INVALID invalid command FOO"),
        (b"register t\n", b"E_INVALID invalid command register"),
        (b"\n", b"E_INVALID invalid command "),
    ],
)
async def test_command_errors_are_fatal(lookupd, clients, line, error):
    c = await clients()
    await c.identify()
    c.send(line + b"PING\n")  # never answered: the connection closes after the error
    await expect_error(c, error)


async def test_register_and_unregister_show_in_lookup(lookupd, clients, http):
    c = await clients()
    await c.identify()
    assert await c.register("t", "c") == b"OK"
    doc = await http.json("/lookup?topic=t")
    assert doc == {
        "channels": ["c"],
        "producers": [
            {
                "remote_address": c.local_address,
                "hostname": PEER["hostname"],
                "broadcast_address": PEER["broadcast_address"],
                "tcp_port": PEER["tcp_port"],
                "http_port": PEER["http_port"],
                "version": PEER["version"],
            }
        ],
    }
    assert await c.unregister("t", "c") == b"OK"
    doc = await http.json("/lookup?topic=t")
    assert doc["channels"] == ["c"] and len(doc["producers"]) == 1  # still a topic producer
    assert await c.unregister("t") == b"OK"
    assert await http.json("/lookup?topic=t") == {"channels": ["c"], "producers": []}
    assert await c.unregister("never") == b"OK"


async def test_double_space_registers_the_topic_only(lookupd, clients, http):
    c = await clients()
    await c.identify()
    assert await c.command(b"REGISTER t  c\n") == b"OK"
    assert await http.json("/channels?topic=t") == {"channels": []}
    assert await http.json("/topics") == {"topics": ["t"]}


async def test_pipelined_commands_are_answered_in_order(lookupd, clients, http):
    c = await clients()
    c.send(body_of(PEER) + b"REGISTER a\nREGISTER b x\nPING\nUNREGISTER a\n")
    assert json.loads(await c.response())["version"] == "1.3.0"
    assert [await c.response() for _ in range(4)] == [b"OK"] * 4
    assert await http.json("/topics") == {"topics": ["a", "b"]}


async def test_ephemeral_channel_leaves_with_last_producer(lookupd, clients, http):
    a, b = await clients(), await clients()
    await a.identify()
    await b.identify()
    await a.register("t", "e#ephemeral")
    await b.register("t", "e#ephemeral")
    await a.unregister("t", "e#ephemeral")
    assert await http.json("/channels?topic=t") == {"channels": ["e#ephemeral"]}
    await b.unregister("t", "e#ephemeral")
    assert await http.json("/channels?topic=t") == {"channels": []}


async def test_ephemeral_topic_leaves_with_last_producer(lookupd, clients, http):
    c = await clients()
    await c.identify()
    await c.register("t#ephemeral")
    assert await http.json("/topics") == {"topics": ["t#ephemeral"]}
    await c.unregister("t#ephemeral")
    assert await http.json("/topics") == {"topics": []}


# --- disconnects, inactivity, tombstones --------------------------------------------------------


async def test_dropped_connection_unregisters_the_peer(lookupd, clients, http):
    a, b = await clients(), await clients()
    await a.identify(broadcast_address="a")
    await b.identify(broadcast_address="b")
    await a.register("t", "c")
    await b.register("t")
    assert len((await http.json("/nodes"))["producers"]) == 2
    await a.close()

    async def only_b():
        doc = await http.json("/lookup?topic=t")
        return [p["broadcast_address"] for p in doc["producers"]] == ["b"]

    await wait_for(only_b)
    nodes = (await http.json("/nodes"))["producers"]
    assert [n["broadcast_address"] for n in nodes] == ["b"]
    # the registrations stay known, as in Go
    assert await http.json("/channels?topic=t") == {"channels": ["c"]}


async def test_fatal_error_unregisters_the_peer(lookupd, clients, http):
    c = await clients()
    await c.identify()
    await c.register("t")
    c.send(b"BOGUS\n")
    await expect_error(c, b"E_INVALID invalid command BOGUS")

    async def gone():
        return (await http.json("/lookup?topic=t"))["producers"] == []

    await wait_for(gone)


async def test_inactive_producer_drops_out_until_it_pings():
    async with NSQLookupd(lookupd_options(inactive_producer_timeout=0.3)) as lk, aiohttp.ClientSession() as s:
        http = HTTP(s, lk.http_port)
        c = await V1Client.connect(lk.tcp_port)
        try:
            await c.identify()
            await c.register("t")
            assert len((await http.json("/lookup?topic=t"))["producers"]) == 1

            async def inactive():
                doc = await http.json("/lookup?topic=t")
                nodes = await http.json("/nodes")
                return doc["producers"] == [] and nodes["producers"] == []

            await wait_for(inactive, timeout=5)
            assert await c.command(b"PING\n") == b"OK"
            assert len((await http.json("/lookup?topic=t"))["producers"]) == 1
            assert len((await http.json("/nodes"))["producers"]) == 1
        finally:
            await c.close()


async def test_tombstoned_producer_is_hidden_for_the_lifetime():
    async with NSQLookupd(lookupd_options(tombstone_lifetime=0.5)) as lk, aiohttp.ClientSession() as s:
        http = HTTP(s, lk.http_port)
        a, b = await V1Client.connect(lk.tcp_port), await V1Client.connect(lk.tcp_port)
        try:
            await a.identify(broadcast_address="a", http_port=1)
            await b.identify(broadcast_address="b", http_port=2)
            for c in (a, b):
                await c.register("t")
                await c.register("u")
            status, _, body = await http.post("/topic/tombstone?topic=t&node=a:1")
            assert (status, body) == (200, b"")
            doc = await http.json("/lookup?topic=t")
            assert [p["broadcast_address"] for p in doc["producers"]] == ["b"]
            assert len((await http.json("/lookup?topic=u"))["producers"]) == 2
            nodes = {n["broadcast_address"]: n for n in (await http.json("/nodes"))["producers"]}
            assert nodes["a"]["topics"] == ["t", "u"]
            assert nodes["a"]["tombstones"] == [True, False]
            assert nodes["b"]["tombstones"] == [False, False]

            async def back():
                doc = await http.json("/lookup?topic=t")
                return len(doc["producers"]) == 2

            await wait_for(back, timeout=5)
            nodes = {n["broadcast_address"]: n for n in (await http.json("/nodes"))["producers"]}
            assert nodes["a"]["tombstones"] == [False, False]
        finally:
            await a.close()
            await b.close()


async def test_stop_closes_clients():
    lk = NSQLookupd(lookupd_options())
    await lk.start()
    c = await V1Client.connect(lk.tcp_port)
    try:
        await c.identify()
        await lk.stop()
        await c.expect_closed()
        await lk.stop()  # idempotent
    finally:
        await c.close()
        await lk.stop()


async def test_many_clients_concurrently(lookupd, clients, http):
    conns = [await clients() for _ in range(20)]
    await asyncio.gather(*(c.identify(broadcast_address=f"n{i}") for i, c in enumerate(conns)))
    await asyncio.gather(*(c.register("t", f"c{i}") for i, c in enumerate(conns)))
    doc = await http.json("/lookup?topic=t")
    assert len(doc["producers"]) == 20 and len(doc["channels"]) == 20


async def test_unix_socket_listeners(tmp_path):
    tcp_path, http_path = str(tmp_path / "lookupd.sock"), str(tmp_path / "lookupd-http.sock")
    async with NSQLookupd(lookupd_options(tcp_address=tcp_path, http_address=http_path)) as lk:
        assert (lk.tcp_addr_str, lk.http_addr_str) == (tcp_path, http_path)
        conns = []
        try:
            for name in ("a", "b"):
                r, w = await asyncio.open_unix_connection(tcp_path)
                c = V1Client(r, w)
                conns.append(c)
                c.send(b"  V1")
                reply = await c.identify(broadcast_address=name)
                assert (reply["tcp_port"], reply["http_port"]) == (0, 0)
                assert await c.register("t") == b"OK"
            conn = aiohttp.UnixConnector(path=http_path)
            async with (
                aiohttp.ClientSession(connector=conn) as s,
                s.get("http://lookupd/lookup?topic=t") as resp,
            ):
                doc = await resp.json()
            # two peers without a peer address stay two producers
            assert sorted(p["broadcast_address"] for p in doc["producers"]) == ["a", "b"]
        finally:
            for c in conns:
                await c.close()
