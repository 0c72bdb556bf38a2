"""Regression tests for what the fuzzers found: each one failed before its fix (checked by
reverting the fix). The fuzz targets no longer tolerate any of these symptoms, so a long run
would report a regression as a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import make_options
from e2e.proc import NsqdProcess
from support import AuthServer, RawClient

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqlookupd.nsqlookupd import NSQLookupd
from nsqpy.protocol import commands
from nsqpy.protocol import lookup as lk
from nsqpy.protocol.client import ClientProtocol, HandshakeError
from nsqpy.protocol.commands import MAX_LINE_LENGTH, CommandParser, LineTooLong
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.frames import FrameReader, encode_response

pytestmark = pytest.mark.timeout(60)

#: a JSON document nested deeper than Python's recursion limit: json.loads raises
#: RecursionError (not ValueError) for it
DEEP = b"[" * 5000
_INT32 = struct.Struct(">i")


# --- deep JSON: nsqlookupd, the client --------------------------------------------------------------


def test_lookup_identify_nested_too_deep_is_a_value_error():
    with pytest.raises(ValueError, match="exceeded max depth"):
        lk.decode_identify(DEEP)


async def test_nsqlookupd_answers_deep_identify_with_e_bad_body():
    """Before: RecursionError escaped data_received; asyncio dropped the connection with no
    answer and logged 'Fatal error: protocol.data_received() call failed'."""
    async with NSQLookupd(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as lookupd:
        r, w = await asyncio.open_connection("127.0.0.1", lookupd.tcp_port)
        w.write(b"  V1IDENTIFY\n" + _INT32.pack(len(DEEP)) + DEEP)
        size = _INT32.unpack(await asyncio.wait_for(r.readexactly(4), 5))[0]
        assert (
            await asyncio.wait_for(r.readexactly(size), 5)
            == b"E_BAD_BODY IDENTIFY failed to decode JSON body"
        )
        assert await asyncio.wait_for(r.read(), 5) == b""  # then closed
        w.close()


@pytest.mark.parametrize("step", ["identify", "auth"])
def test_client_handshake_with_deep_json_answer_is_a_handshake_error(step):
    """Before: RecursionError out of ClientProtocol.receive (the caller expects
    HandshakeError, TransportError, ValueError or the server's error)."""
    p = ClientProtocol({"client_id": "x"}, auth_secret=b"s")
    p.start()
    p.data_to_send()
    if step == "auth":
        assert p.receive(encode_response(b'{"auth_required":true}')) == []
    with pytest.raises(HandshakeError, match=r"bad (IDENTIFY|AUTH) response"):
        p.receive(encode_response(DEEP))


def test_client_http_error_message_with_deep_json():
    from nsqpy.client.http import _message

    assert _message(DEEP) == DEEP.decode()


# --- deep JSON in nsqd ---------------------------------------------------------------------------


async def test_nsqd_answers_deep_identify_with_e_bad_body(nsqd):
    """Before: RecursionError escaped ProtocolV2.data_received (protocol_v2._identify caught
    only ValueError); asyncio dropped the connection without the E_BAD_BODY answer."""
    c = await RawClient.connect(nsqd.tcp_port)
    c.send(commands._with_body(b"IDENTIFY\n", DEEP))
    assert await c.read_error() == "E_BAD_BODY IDENTIFY failed to decode JSON body"
    await c.expect_closed()
    other = await RawClient.connect(nsqd.tcp_port)
    assert await other.pub("t", b"still serving") == (0, b"OK")
    await other.close()


async def test_nsqd_auth_server_answering_deep_json_fails_the_auth(tmp_path):
    """Before: RecursionError out of AuthClient.query failed the AUTH task outside the
    ProtocolError handler; the client stayed suspended, with no answer."""
    authd = await AuthServer().start()
    authd.answers["deep"] = (200, DEEP)
    try:
        async with NSQD(make_options(tmp_path, auth_http_addresses=[authd.address])) as d:
            c = await RawClient.connect(d.tcp_port)
            await c.identify(feature_negotiation=True)
            c.send(commands.auth(b"deep"))
            assert await c.read_error(timeout=5) == "E_AUTH_FAILED AUTH failed"
            await c.expect_closed()
    finally:
        await authd.stop()


async def test_nsqd_lookup_peer_survives_a_deep_json_identify_answer(tmp_path):
    """Before: RecursionError out of the IDENTIFY answer's json.loads killed the LookupPeer
    task; the nsqlookupd never got a REGISTER (nor a PING) again."""
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def fake_lookupd(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readexactly(4)
            first = True
            while True:
                line = await r.readline()
                if not line:
                    return
                if line == b"IDENTIFY\n":
                    await r.readexactly(_INT32.unpack(await r.readexactly(4))[0])
                    w.write(lk.encode_response(DEEP if first else b"{}"))
                    first = False
                else:
                    got.put_nowait(line)
                    w.write(lk.encode_response(b"OK"))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(fake_lookupd, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        opts = make_options(tmp_path, nsqlookupd_tcp_addresses=[f"127.0.0.1:{port}"])
        async with NSQD(opts) as d:
            d.get_topic("t")
            line = await asyncio.wait_for(got.get(), 10)
            assert line.startswith((b"REGISTER t", b"PING"))
    finally:
        server.close()


def test_nsqd_refuses_deep_nsqd_dat_like_any_bad_one(tmp_path):
    """Before: read_metadata let RecursionError out: a traceback instead of the FATAL line
    that names the file."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "nsqd.dat").write_bytes(DEEP)
    p = NsqdProcess(data, log_dir=tmp_path / "logs")
    p.proc = None
    from e2e.proc import DaemonProcess

    DaemonProcess.start(p)
    try:
        assert p.wait(15) == 1
    finally:
        p.stop()
    assert "Traceback" not in p.stderr()
    assert f"FATAL: failed to parse metadata in {data}/nsqd.dat - " in p.stderr(), p.stderr()


# --- long command lines ---------------------------------------------------------------------------


@pytest.mark.parametrize("compiled", [False, True], ids=["pure", "compiled"])
def test_over_long_line_is_refused_however_it_arrives(compiled, monkeypatch):
    """Before: a line over MAX_LINE_LENGTH was refused when TCP delivered part of it, but
    parsed when it arrived whole (both parse paths)."""
    if compiled:
        # the compiled line splitter itself, in the pure-Python run too (a missing build fails)
        import importlib

        hot = importlib.import_module("nsqpy._speedups._hot")
        monkeypatch.setattr(commands, "_c_parse_line", hot.parse_line, raising=False)
    monkeypatch.setattr(commands, "compiled", compiled)
    line = b"SUB " + b"t" * (MAX_LINE_LENGTH + 100) + b" c\n"
    split = CommandParser()
    split.feed(line[: MAX_LINE_LENGTH + 10])
    with pytest.raises(LineTooLong):
        split.next()
    whole = CommandParser()
    whole.feed(line)
    with pytest.raises(LineTooLong):
        whole.next()


def test_lookupd_over_long_line_is_refused_however_it_arrives():
    """The same for nsqlookupd's V1 parser (its limit is 64 KiB). Before: refused only when
    the line arrived in pieces."""
    line = b"REGISTER " + b"t" * (lk.MAX_LINE_LENGTH + 100) + b"\n"
    for pieces in ([line], [line[: lk.MAX_LINE_LENGTH + 10], line[lk.MAX_LINE_LENGTH + 10 :]]):
        p = lk.LookupParser()
        with pytest.raises(ProtocolError, match="command line too long"):
            for piece in pieces:
                p.feed(piece)
                p.next_line()


# --- compression negotiated, then commands not in it ----------------------------------------------


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
async def test_nsqd_closes_a_connection_whose_pipelined_commands_are_not_compressed(nsqd, kind, caplog):
    """IDENTIFY asks for snappy (deflate), and the commands after it arrive in the same
    segment uncompressed (a broken client). As Go's nsqd: the IDENTIFY answer, the OK in
    the new compression, then the connection is closed. Before: TransportError escaped
    data_received (found by the nsqd_identify target): asyncio logged 'Fatal error:
    protocol.data_received() call failed' and the OK was never sent."""
    from nsqpy.transport.deflate import DeflateLayer
    from nsqpy.transport.snappy import SnappyLayer

    c = await RawClient.connect(nsqd.tcp_port)
    garbage = b"SUB t c\n" if kind == "snappy" else b"\xff" * 16
    c.send(commands.identify({"feature_negotiation": True, kind: True}) + garbage)
    wire = b""
    while True:  # everything until nsqd closes the connection
        try:
            data = await asyncio.wait_for(c.reader.read(65536), 5)
        except ConnectionError:
            break
        if not data:
            break
        wire += data
    size = _INT32.unpack_from(wire)[0]
    ((ftype, answer),) = FrameReader().feed(wire[: 4 + size])  # in plain text
    assert ftype == 0 and json.loads(answer)[kind] is True
    wire = wire[4 + size :]
    layer = SnappyLayer() if kind == "snappy" else DeflateLayer()
    assert FrameReader().feed(layer.decode(wire)) == [(0, b"OK")]
    other = await RawClient.connect(nsqd.tcp_port)
    assert await other.pub("t", b"still serving") == (0, b"OK")
    await other.close()
    await c.close()
    assert "data_received() call failed" not in caplog.text


# --- DiskQueue: a gap of missing segments --------------------------------------------------------


def test_diskqueue_reads_past_a_large_gap_of_missing_segments(tmp_path):
    """Metadata (bit rot, a hand edit, deleted files) puts the write segment 10**12 files
    after the read segment, and only a few segments exist. Opening and reading jump to the
    next existing segment. Before: a failed open and a recount of every remaining file
    number per missing segment (quadratic; a gap of 30,000 took minutes, this one never
    ends), and opening walked a missing read segment one file number at a time."""
    rec = b"r" * 10
    far = 10**12
    # q: the read segment exists, then the gap; r: the read segment itself is missing
    (tmp_path / "q.diskqueue.000000.dat").write_bytes(_INT32.pack(len(rec)) + rec)
    (tmp_path / "q.diskqueue.meta.dat").write_bytes(b"1\n0,0\n%d,0\n" % far)
    (tmp_path / "r.diskqueue.000007.dat").write_bytes(_INT32.pack(len(rec)) + rec)
    (tmp_path / "r.diskqueue.meta.dat").write_bytes(b"5\n5,0\n%d,0\n" % far)
    code = textwrap.dedent(f"""
        import logging
        from nsqpy.nsqd.diskqueue import DiskQueue
        logging.disable(logging.CRITICAL)
        for name in ("q", "r"):
            q = DiskQueue(name, {str(tmp_path)!r}, max_bytes_per_file=1 << 20, min_msg_size=0,
                          max_msg_size=1024, sync_every=1, sync_timeout=2)
            assert q.depth == 1, q
            got = q.read(10)
            got += q.read(10)
            assert got == [{rec!r}], got
            assert q.depth == 0 and q.read_file_num == {far}, q
            q.put(b"after")
            assert q.read(10) == [b"after"]
            q.close()
        print("ok")
    """)
    # a hang guard, not a timing: the fixed code takes a fraction of a second
    try:
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=45,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("reading past 10**12 missing segments did not end") from None
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_json_recursion_is_what_the_findings_say():
    """The premise of the deep-JSON findings, on this Python."""
    with pytest.raises(RecursionError):
        json.loads(DEEP)
    assert Path(__file__).parent.joinpath("fuzz_targets.py").exists()
