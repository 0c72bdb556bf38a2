"""Fuzz targets: every parser that reads bytes from the network or the disk.

Each target is a function of one ``bytes`` that must return normally for *any* input: the
errors a parser is allowed to raise for bad input are caught here, anything else (another
exception type, a failed assertion, a hang) is a finding. The same functions are driven by
atheris (``bench/fuzz.py``: coverage-guided, minutes per target), by CI on the seed corpus
kept in ``tests/fuzz/corpus/<target>/`` plus a few seconds of atheris
(``tests/fuzz/test_fuzz_corpus.py``), and by Hypothesis (``tests/fuzz/test_fuzz_properties.py``).

Where a parser has a compiled twin (``nsqpy._speedups``), the target runs both and
compares them; where it is incremental, it compares feeding the input whole with feeding it
in pieces cut by the input's first byte.

Imports of nsqpy happen inside :func:`setup` so that atheris can instrument them.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from typing import Any

_INT32 = struct.Struct(">i")

#: target name -> function(data)
TARGETS: dict[str, Callable[[bytes], None]] = {}
#: target name -> function() returning seed inputs (the corpus in the repo is made from them)
SEEDS: dict[str, Callable[[], list[bytes]]] = {}


def target(name: str) -> Callable[[Callable[[bytes], None]], Callable[[bytes], None]]:
    def register(fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
        TARGETS[name] = fn
        return fn

    return register


def seeds(name: str) -> Callable[[Callable[[], list[bytes]]], Callable[[], list[bytes]]]:
    def register(fn: Callable[[], list[bytes]]) -> Callable[[], list[bytes]]:
        SEEDS[name] = fn
        return fn

    return register


def cuts(data: bytes, seed: int) -> list[bytes]:
    """``data`` in pieces whose sizes follow ``seed`` (0: whole; else 1..64-byte pieces,
    some of them single bytes), so a parser sees every split point sooner or later."""
    if seed == 0 or len(data) <= 1:
        return [data]
    rng = random.Random(seed)
    out = []
    pos = 0
    top = 1 + seed % 64
    while pos < len(data):
        n = 1 if rng.random() < 0.2 else rng.randint(1, top)
        out.append(data[pos : pos + n])
        pos += n
    return out


def split_input(data: bytes) -> tuple[int, bytes]:
    """(selector byte, rest): the first byte picks modes and cut points."""
    if not data:
        return 0, b""
    return data[0], data[1:]


def body(line: bytes, payload: bytes) -> bytes:
    return line + _INT32.pack(len(payload)) + payload


def setup() -> None:
    """Import what the targets use (atheris instruments these imports)."""
    import nsqpy.client.http
    import nsqpy.httpapi
    import nsqpy.nsqd.diskqueue
    import nsqpy.nsqd.http
    import nsqpy.nsqd.metadata
    import nsqpy.nsqd.protocol_v2
    import nsqpy.nsqlookupd.http
    import nsqpy.nsqlookupd.lookup_protocol_v1
    import nsqpy.protocol.client
    import nsqpy.protocol.commands
    import nsqpy.protocol.discovery
    import nsqpy.protocol.frames
    import nsqpy.protocol.lookup
    import nsqpy.transport.deflate
    import nsqpy.transport.snappy  # noqa: F401


def compiled_available() -> bool:
    from nsqpy import _speedups

    return _speedups.compiled


class FakeTransport:
    """Enough of an asyncio transport for a server protocol object: records writes."""

    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 40000)) -> None:
        self.peer = peer
        self.written: list[bytes] = []
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def write(self, data: bytes) -> None:
        assert True  # writes after close are dropped by real transports
        self.written.append(bytes(data))

    def writelines(self, data: list[bytes]) -> None:
        for d in data:
            self.write(d)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False


# --- protocol V2 commands (nsqd's parser) ------------------------------------------------------

_BODY_LIMIT = 1 << 16


def _validate(name: bytes, params: list[bytes], size: int | None) -> None:
    from nsqpy.protocol.errors import ProtocolError

    if size is not None and size > _BODY_LIMIT:
        raise ProtocolError("E_BAD_BODY", "too big")


def _parse_commands(pieces: list[bytes], compiled: bool) -> tuple[list[Any], str | None]:
    """Every command the parser yields for ``pieces`` fed in turn, and the error (code or
    "LineTooLong") that ended the stream, if any."""
    from nsqpy.protocol import commands
    from nsqpy.protocol.errors import ProtocolError

    saved = commands.compiled
    commands.compiled = compiled
    try:
        p = commands.CommandParser()
        out: list[Any] = []
        try:
            for piece in pieces:
                p.feed(piece)
                while True:
                    cmd = p.next(_validate)
                    if cmd is None:
                        break
                    name, params, payload = cmd
                    assert params and params[0] == name, cmd
                    assert (payload is None) == (name not in commands.BODY_COMMANDS), cmd
                    out.append(cmd)
            assert p.buffered >= 0
            return out, None
        except commands.LineTooLong:
            return out, "LineTooLong"
        except ProtocolError as e:
            return out, e.code
    finally:
        commands.compiled = saved


def _fin_runs(payload: bytes, pieces_cmds: list[Any]) -> None:
    """The FIN fast path, compiled and pure, on the same buffer and in-flight index."""
    from nsqpy.protocol import commands

    class Msg:
        __slots__ = ("client",)

        def __init__(self, client: object) -> None:
            self.client = client

    owner, other = object(), object()
    ids = [params[1] for name, params, _ in pieces_cmds if name == b"FIN" and len(params) > 1]
    results = []
    impls = [commands.fin_run_py]
    if compiled_available():
        from nsqpy._speedups._hot import fin_run

        impls.append(fin_run)
    for impl in impls:
        in_flight = {i: Msg(owner if n % 3 else other) for n, i in enumerate(ids)}
        buf = bytearray(payload)
        n, pos = impl(buf, 0, in_flight, owner)
        assert 0 <= pos <= len(buf) and n >= 0
        results.append((n, pos, sorted(in_flight), sorted(k for k, m in in_flight.items() if m.client)))
    assert all(r == results[0] for r in results), results


def _mpub_bodies(cmds: list[Any]) -> None:
    from nsqpy.protocol import commands
    from nsqpy.protocol.errors import ProtocolError

    for name, _params, payload in cmds:
        if name != b"MPUB" or payload is None:
            continue
        for max_msg, max_body in ((1 << 20, 5 << 20), (16, 64), (1, 9)):
            try:
                want: Any = commands.decode_mpub_py(payload, max_msg, max_body)
            except ProtocolError as e:
                want = e.text()
            if compiled_available():
                from nsqpy._speedups._hot import decode_mpub

                got = decode_mpub(payload, max_msg, max_body)
                assert got is None or got == want, (got, want)
            try:
                got2: Any = commands.decode_mpub(payload, max_msg, max_body)
            except ProtocolError as e:
                got2 = e.text()
            assert got2 == want, (got2, want)


@target("v2_commands")
def fuzz_v2_commands(data: bytes) -> None:
    """nsqd's incremental command parser (``CommandParser``): compiled line scanner against
    the pure one, whole against pieces; the MPUB body decoder and the FIN fast path, both
    implementations."""
    sel, payload = split_input(data)
    whole = _parse_commands([payload], False)
    pieces = cuts(payload, sel)
    split = _parse_commands(pieces, False)
    if compiled_available():
        assert _parse_commands([payload], True) == whole
        assert _parse_commands(pieces, True) == split
    # the outcome does not depend on how TCP cut the bytes (an over-long line included)
    assert whole == split, (whole, split)
    _fin_runs(payload, whole[0])
    _mpub_bodies(whole[0])


@seeds("v2_commands")
def seeds_v2_commands() -> list[bytes]:
    from nsqpy.protocol import commands as c

    mid = b"0123456789abcdef"
    return [
        b"\x00" + c.NOP,
        b"\x07" + c.identify({"client_id": "x", "feature_negotiation": True}) + c.sub("t", "ch") + c.rdy(10),
        b"\x03" + c.pub("t", b"hello") + c.mpub("t", [b"a", b"bb", b"ccc"]) + c.dpub("t", 100, b"later"),
        b"\x05" + c.fin(mid) + c.fin(b"fedcba9876543210") + c.req(mid, 0) + c.touch(mid) + c.CLS,
        b"\x02FIN " + mid + b"\r\nFIN " + mid + b" x\nFIN short\n",
        b"\x01" + c.auth("secret") + b"PUB t\n" + _INT32.pack(-1),
        b"\x09MPUB t\n" + _INT32.pack(12) + _INT32.pack(2) + _INT32.pack(0) + _INT32.pack(-5),
        b"\x00" + b"X" * 100 + b"\n \n\n  \r\n",
        b"\x11IDENTIFY\n" + _INT32.pack(1 << 20),
        b"\x04" + b"PUB" + b" t" * 40 + b"\n" + _INT32.pack(1) + b"z",
    ]


# --- server frames (the client's parser) -------------------------------------------------------


def _frames_plain(pieces: list[bytes]) -> tuple[list[Any], bool]:
    from nsqpy.protocol.frames import FRAME_TYPE_MESSAGE, FrameReader, decode_message

    r = FrameReader(max_frame_size=1 << 20)
    out: list[Any] = []
    try:
        for piece in pieces:
            frames = r.feed(piece)
            decoded = []
            for ftype, payload in frames:
                if ftype == FRAME_TYPE_MESSAGE:
                    m = decode_message(payload)
                    decoded.append(("msg", m.id, m.body, m.timestamp, m.attempts))
                else:
                    decoded.append((ftype, payload))
            out += decoded
        return out, False
    except ValueError:
        return out, True


def _frames_batched(pieces: list[bytes]) -> tuple[list[Any], bool]:
    from nsqpy.protocol.frames import FrameReader

    r = FrameReader(max_frame_size=1 << 20)
    out: list[Any] = []

    def make(msg_id: bytes, payload: bytes, ts: int, attempts: int) -> Any:
        return ("msg", bytes(msg_id), bytes(payload), ts, attempts)

    try:
        for piece in pieces:
            items = r.feed_batched(piece, make)
            decoded = []
            prev_list = False
            for item in items:
                if type(item) is list:
                    assert item, "an empty run of messages"
                    assert not prev_list, "two runs of messages in a row"
                    decoded += item
                    prev_list = True
                else:
                    ftype, payload = item
                    decoded.append((ftype, bytes(payload)))
                    prev_list = False
            out += decoded
        return out, False
    except ValueError:
        return out, True


@target("frames")
def fuzz_frames(data: bytes) -> None:
    """The client's frame parser: ``FrameReader.feed`` (+ ``decode_message``) and the batch
    decoder ``feed_batched`` must agree frame for frame, whole or in pieces."""
    sel, payload = split_input(data)
    pieces = cuts(payload, sel)
    a = _frames_plain(pieces)
    b = _frames_batched(pieces)
    w = _frames_batched([payload])
    # the frames before an error are the same whichever decoder and cuts
    n = min(len(a[0]), len(b[0]), len(w[0]))
    assert a[0][:n] == b[0][:n] == w[0][:n]
    if not (a[1] or b[1] or w[1]):
        assert a == b == w, (a, b, w)
    else:
        # a bad frame is bad however it arrives
        assert a[1] == b[1] == w[1], (a[1], b[1], w[1])


def _frame(ftype: int, payload: bytes) -> bytes:
    return struct.pack(">Ii", len(payload) + 4, ftype) + payload


def _msg(i: int, payload: bytes) -> bytes:
    return _frame(2, struct.pack(">qH", 1_700_000_000_000_000_000 + i, 1) + b"%016x" % i + payload)


@seeds("frames")
def seeds_frames() -> list[bytes]:
    hb = _frame(0, b"_heartbeat_")
    return [
        b"\x00" + _frame(0, b"OK"),
        b"\x05" + _msg(1, b"body") + _msg(2, b"") + hb + _msg(3, b"x" * 300) + _frame(1, b"E_INVALID x"),
        b"\x01" + _frame(2, b"short"),
        b"\x02" + struct.pack(">Ii", 3, 0),
        b"\x03" + struct.pack(">Ii", 1 << 30, 2),
        b"\x07" + b"".join(_msg(i, b"m%d" % i) for i in range(20)),
    ]


# --- the client's protocol state machine --------------------------------------------------------


@target("client_protocol")
def fuzz_client_protocol(data: bytes) -> None:
    """``ClientProtocol`` fed what a (hostile) server sends: the handshake (IDENTIFY answer,
    snappy/deflate upgrades, AUTH answer) and then frames. It may only raise the errors its
    docstring lists: TransportError, ValueError, HandshakeError and the server's error."""
    from nsqpy.protocol.client import ClientProtocol
    from nsqpy.protocol.errors import NSQError
    from nsqpy.transport import TransportError

    sel, payload = split_input(data)
    ident: dict[str, Any] = {"client_id": "fuzz"}
    if sel & 1:
        ident["snappy"] = True
    elif sel & 2:
        ident["deflate"] = True
    p: ClientProtocol[Any] = ClientProtocol(ident, auth_secret=b"s3cret" if sel & 4 else None)
    p.start()
    assert p.data_to_send().startswith(b"  V2")
    try:
        for piece in cuts(payload, sel >> 3):
            for ev in p.receive(piece):
                assert ev is not None
            p.data_to_send()
            if p.ready and p.pending < 3:
                p.send_request(b"PUB t\n" + _INT32.pack(1) + b"x", token=len(piece))
                p.send(b"RDY 1\n")
    except (TransportError, ValueError, NSQError):
        pass


@seeds("client_protocol")
def seeds_client_protocol() -> list[bytes]:
    import cramjam

    ok = _frame(0, b"OK")
    neg = _frame(0, json.dumps({"max_rdy_count": 2500, "version": "1.3.0", "auth_required": False}).encode())
    auth = _frame(0, json.dumps({"auth_required": True}).encode())
    snappy_ident = _frame(0, json.dumps({"snappy": True}).encode())
    deflate_ident = _frame(0, json.dumps({"deflate": True, "deflate_level": 3}).encode())
    after = _frame(0, b"_heartbeat_") + _msg(1, b"hello") + ok + _frame(1, b"E_FIN_FAILED x")
    c = cramjam.snappy.Compressor()
    c.compress(ok + after)
    snappy_stream = bytes(c.flush())
    d = zlib.compressobj(6, zlib.DEFLATED, -15)
    deflate_stream = d.compress(ok + after) + d.flush(zlib.Z_SYNC_FLUSH)
    return [
        b"\x00" + ok + after,
        b"\x08" + neg + after,
        b"\x04" + auth + _frame(0, b'{"identity":"a","permission_count":1}') + after,
        b"\x04" + auth + _frame(1, b"E_AUTH_FAILED AUTH failed"),
        b"\x01" + snappy_ident + snappy_stream,
        b"\x02" + deflate_ident + deflate_stream,
        b"\x00" + _frame(0, b"[1,2]"),
        b"\x00" + _frame(0, b"{" * 10),
        b"\x00" + _frame(0, b'{"tls_v1": true}'),
    ]


# --- nsqlookupd's TCP protocol V1 ----------------------------------------------------------------

_LOOKUPD: Any = None


def _lookupd() -> Any:
    global _LOOKUPD
    if _LOOKUPD is None:
        import logging

        from nsqpy.nsqlookupd.nsqlookupd import NSQLookupd

        logging.getLogger("nsqlookupd").disabled = True
        _LOOKUPD = NSQLookupd()
        _LOOKUPD.tcp_address = ("127.0.0.1", 4160)
        _LOOKUPD.http_address = ("127.0.0.1", 4161)
    return _LOOKUPD


def _responses(raw: bytes) -> list[bytes]:
    """V1 responses ``[int32 size][data]``: the stream must be exactly that."""
    out = []
    pos = 0
    while pos < len(raw):
        assert pos + 4 <= len(raw), raw
        (n,) = _INT32.unpack_from(raw, pos)
        assert 0 <= n <= len(raw) - pos - 4, raw
        out.append(raw[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


@target("lookupd_v1")
def fuzz_lookupd_v1(data: bytes) -> None:
    """nsqlookupd's connection handler (``LookupProtocolV1``, on ``LookupParser`` and
    ``decode_identify``) fed a whole connection: nothing may escape ``data_received``, the
    answers are well-formed, an error closes the connection, and the registrations of a
    closed connection are gone."""
    from nsqpy.nsqlookupd.lookup_protocol_v1 import LookupProtocolV1

    sel, payload = split_input(data)
    lookupd = _lookupd()
    proto = LookupProtocolV1(lookupd)
    t = FakeTransport(("127.0.0.1", 1000 + sel))
    proto.connection_made(t)  # type: ignore[arg-type]
    for piece in cuts(payload, sel):
        proto.data_received(piece)
        if t.closed:
            break
    answers = _responses(b"".join(t.written))
    if any(a.startswith(b"E_") for a in answers):
        assert t.closed, answers
    proto.connection_lost(None)
    assert not lookupd.clients
    if proto.peer_info is not None:
        assert not any(
            p.peer_info.id == proto.peer_info.id for p in lookupd.db.find_producers("client", "", "")
        )


@seeds("lookupd_v1")
def seeds_lookupd_v1() -> list[bytes]:
    from nsqpy.protocol import lookup as lk

    ident = lk.identify(
        {"broadcast_address": "h", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0", "hostname": "h"}
    )
    return [
        b"\x00  V1" + lk.ping(),
        b"\x03  V1" + ident + lk.register("t") + lk.register("t", "c") + lk.ping() + lk.unregister("t", "c"),
        b"\x05  V1" + ident + lk.register("t#ephemeral", "c#ephemeral") + lk.unregister("t#ephemeral"),
        b"\x01  V1IDENTIFY\n" + _INT32.pack(7) + b'{"a":1}',
        b"\x02  V1" + ident + ident,
        b"\x00  V1REGISTER\nREGISTER a b c\nREGISTER \xff\xfe\n",
        b"\x00  V2PING\n",
        b"\x04  V1IDENTIFY\n" + body(b"", b'{"tcp_port": 1.0, "TCP_PORT": 5, "version": null}')[0:],
    ]


# --- snappy and deflate streams ------------------------------------------------------------------


@target("snappy")
def fuzz_snappy(data: bytes) -> None:
    """``SnappyLayer.decode`` (the snappy framing format) in pieces: TransportError or
    bytes; when it accepts a stream, whole or cut, it yields the same bytes."""
    from nsqpy.transport import TransportError
    from nsqpy.transport.snappy import SnappyLayer

    sel, payload = split_input(data)
    outs = []
    for pieces in ([payload], cuts(payload, sel)):
        layer = SnappyLayer()
        got = []
        try:
            for piece in pieces:
                got.append(layer.decode(piece))
        except TransportError as e:
            assert str(e).startswith("snappy: "), e
            outs.append(None)
            continue
        out = b"".join(got)
        outs.append(out)
    if outs[0] is not None and outs[1] is not None:
        assert outs[0] == outs[1]


@seeds("snappy")
def seeds_snappy() -> list[bytes]:
    import cramjam

    out = []
    for i, text in enumerate([b"OK", b"x" * 70000, bytes(range(256)) * 10, b""]):
        c = cramjam.snappy.Compressor()
        c.compress(text)
        out.append(bytes([i * 7]) + bytes(c.flush()))
    raw = b"hello"
    crc = 0  # a wrong checksum: must be refused
    out.append(
        b"\x03" + STREAM_ID + b"\x01" + (len(raw) + 4).to_bytes(3, "little") + crc.to_bytes(4, "little") + raw
    )
    out.append(b"\x00" + STREAM_ID + b"\xfe\x03\x00\x00abc" + STREAM_ID)
    out.append(b"\x00\x00\x05\x00\x00abcde")
    return out


STREAM_ID = b"\xff\x06\x00\x00sNaPpY"


@target("deflate")
def fuzz_deflate(data: bytes) -> None:
    """``DeflateLayer.decode`` (raw deflate) in pieces: TransportError or exactly what zlib
    decodes from the same stream."""
    from nsqpy.transport import TransportError
    from nsqpy.transport.deflate import DeflateLayer

    sel, payload = split_input(data)
    layer = DeflateLayer()
    got = []
    err = False
    try:
        for piece in cuts(payload, sel):
            got.append(layer.decode(piece))
    except TransportError as e:
        assert str(e).startswith("flate: "), e
        err = True
    ref = zlib.decompressobj(-15)
    try:
        want = ref.decompress(payload)
        ref_err = bool(ref.unused_data)
    except zlib.error:
        want, ref_err = None, True
    if not err and not ref_err:
        assert b"".join(got) == want
    if not err:
        assert not ref_err or ref.eof, "zlib refused what the layer accepted"


@seeds("deflate")
def seeds_deflate() -> list[bytes]:
    out = []
    for i, (level, text) in enumerate([(6, b"OK"), (1, b"y" * 100000), (9, bytes(range(256)) * 20)]):
        c = zlib.compressobj(level, zlib.DEFLATED, -15)
        out.append(bytes([i * 5]) + c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH))
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    out.append(b"\x02" + c.compress(b"end") + c.flush(zlib.Z_FINISH) + b"trailing")
    out.append(b"\x01\x07\x00\x00\xff\xff")
    return out


# --- DiskQueue: segment files and metadata as found on disk -------------------------------------

_DQ_DIR: str | None = None


def _dq_dir() -> str:
    global _DQ_DIR
    if _DQ_DIR is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        _DQ_DIR = tempfile.mkdtemp(prefix="nsqpy-fuzz-dq-", dir=base)
    return _DQ_DIR


def _split_records_both(buf: bytes, mn: int, mx: int) -> None:
    from nsqpy.nsqd.diskqueue import split_records_py

    impls = [split_records_py]
    if compiled_available():
        from nsqpy._speedups._hot import split_records

        impls.append(split_records)
    results = []
    for impl in impls:
        for want in (1, 3, 1 << 30):
            out: list[bytes] = []
            r = impl(buf, 0, 0, len(buf), want, mn, mx, out)
            results.append((want, r, out))
    if len(impls) == 2:
        n = len(results) // 2
        assert results[:n] == results[n:], (results[:n], results[n:])


def _dq_layout(payload: bytes) -> tuple[bytes | None, list[bytes], int, int, int]:
    """(metadata or None, segments, min size, max size, max bytes per file) from the input:
    ``[flags:1][meta len:1][meta][seg0 len:2][seg0][rest = seg1]``."""
    if len(payload) < 2:
        return None, [payload], 0, 64, 128
    flags, mlen = payload[0], payload[1]
    rest = payload[2:]
    meta: bytes | None = rest[:mlen] if flags & 1 else None
    rest = rest[mlen:] if flags & 1 else rest
    if flags & 2 and len(rest) >= 2:
        n = int.from_bytes(rest[:2], "big")
        segs = [rest[2 : 2 + n], rest[2 + n :]]
    else:
        segs = [rest]
    mn = (flags >> 2) & 3
    mx = (16, 64, 1024, 1 << 20)[(flags >> 4) & 3]
    per_file = (32, 128, 4096, 1 << 20)[(flags >> 6) & 3]
    return meta, segs, mn, mx, per_file


@target("diskqueue")
def fuzz_diskqueue(data: bytes) -> None:
    """A DiskQueue opened on segment files and metadata of any content (a crash, a torn
    write, bit rot, the other implementation): opening recovers, reading yields only
    records within the size limits and ends, the queue stays usable (a put is read back),
    and the compiled record splitter agrees with the pure one."""
    import logging

    from nsqpy.nsqd.diskqueue import DiskQueue, DiskQueueError

    _, payload = split_input(data)
    meta, segs, mn, mx, per_file = _dq_layout(payload)
    d = _dq_dir()
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    for i, seg in enumerate(segs):
        with open(os.path.join(d, "q.diskqueue.%06d.dat" % i), "wb") as f:
            f.write(seg)
    if meta is not None:
        with open(os.path.join(d, "q.diskqueue.meta.dat"), "wb") as f:
            f.write(meta)
    _split_records_both(segs[0], mn, mx)
    log = logging.getLogger("fuzz.diskqueue")
    log.disabled = True
    q = DiskQueue(
        "q",
        d,
        max_bytes_per_file=per_file,
        min_msg_size=mn,
        max_msg_size=mx,
        sync_every=1 << 30,
        sync_timeout=3600,
        log=log,
    )
    try:
        assert q.depth >= 0, q
        total = 0
        for step in range(10_000):
            if step % 2:
                got = q.read(7)
            else:
                box: list[bytes] = []
                q.read_into(5, box.extend)
                got = box
            for rec in got:
                assert mn <= len(rec) <= mx, (len(rec), mn, mx)
            total += len(got)
            if not got and q.depth == 0:
                break
        else:
            raise AssertionError(f"reading never ended: {q!r}")
        assert q.depth == 0, q
        marker = b"m" * max(mn, 1)
        if len(marker) <= mx:
            q.put(marker)
            assert q.read(10) == [marker], q
    except DiskQueueError:
        pass
    finally:
        q.close()


def _records(*recs: bytes) -> bytes:
    return b"".join(_INT32.pack(len(r)) + r for r in recs)


@seeds("diskqueue")
def seeds_diskqueue() -> list[bytes]:
    recs = _records(b"a" * 10, b"b" * 20, b"c" * 5)
    meta = b"3\n0,0\n0,%d\n" % len(recs)
    flags_meta = 1 | (2 << 4) | (2 << 6)
    return [
        b"\x00" + bytes([flags_meta, len(meta)]) + meta + recs,
        b"\x00" + bytes([0 | (2 << 4), 0]) + recs + b"\x00\x00",  # no metadata, torn tail
        b"\x00" + bytes([flags_meta | 2, len(meta)]) + meta + len(recs).to_bytes(2, "big") + recs + recs,
        b"\x00" + bytes([flags_meta, 12]) + b"9\n0,5\n0,3\nxx" + recs,
        b"\x00" + bytes([flags_meta, len(meta)]) + meta + _INT32.pack(-1) + recs,
        b"\x00"
        + bytes([flags_meta | 2, 14])
        + b"1\n0,0\n1,9999\n"
        + (4).to_bytes(2, "big")
        + recs[:4]
        + recs,
    ]


# --- nsqd's TCP protocol V2, whole connections ---------------------------------------------------


class _Nsqd:
    """One in-process NSQD (no listeners used) on a private event loop."""

    def __init__(self) -> None:
        import logging

        from nsqpy.nsqd.nsqd import NSQD
        from nsqpy.nsqd.options import Options

        logging.getLogger("nsqd").disabled = True
        self.dir = tempfile.mkdtemp(
            prefix="nsqpy-fuzz-nsqd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
        self.loop = asyncio.new_event_loop()
        opts = Options(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            data_path=self.dir,
            mem_queue_size=100,
            max_msg_size=4096,
            max_body_size=1 << 16,
        )
        self.nsqd = NSQD(opts)
        self.loop.run_until_complete(self.nsqd.start())
        self.runs = 0

    def turn(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0))

    def tidy(self) -> None:
        self.runs += 1
        if self.runs % 200 == 0:
            for name in list(self.nsqd.topics):
                self.nsqd.delete_topic(name)
            self.turn()


_NSQD: _Nsqd | None = None


def _nsqd() -> _Nsqd:
    global _NSQD
    if _NSQD is None:
        _NSQD = _Nsqd()
    return _NSQD


def _v2_connection(stream: bytes, sel: int) -> FakeTransport:
    """Feed one connection's bytes to a fresh ProtocolV2; nothing may escape."""
    from nsqpy.nsqd.protocol_v2 import ProtocolV2

    n = _nsqd()
    p = ProtocolV2(n.nsqd)
    t = FakeTransport(("127.0.0.1", 2000 + sel))
    p.connection_made(t)  # type: ignore[arg-type]
    try:
        for piece in cuts(stream, sel):
            if t.closed:
                break
            p.data_received(piece)
            n.turn()
        n.turn()
    finally:
        p.connection_lost(None)
        n.turn()
        n.tidy()
    return t


@target("nsqd_v2")
def fuzz_nsqd_v2(data: bytes) -> None:
    """A whole client connection to nsqd (``ProtocolV2`` on an in-process NSQD): the magic,
    then any commands. ``data_received`` must never raise (bad input costs the client an
    error frame and, for a fatal one, its connection, never the daemon)."""
    sel, payload = split_input(data)
    stream = payload if sel & 0x80 else b"  V2" + payload
    _v2_connection(stream, sel & 0x7F)


@seeds("nsqd_v2")
def seeds_nsqd_v2() -> list[bytes]:
    return [s[:1] + s[1:] for s in seeds_v2_commands()] + [
        b"\x80  V1PING\n",
        b"\x01" + b"SUB t c\nRDY 5\nPUB t\n" + _INT32.pack(3) + b"abc" + b"FIN 0000000000000000\nREQ x 10\n",
        b"\x00DPUB t 99999999999\n" + _INT32.pack(1) + b"x",
        b"\x00MPUB t\n" + _INT32.pack(9) + _INT32.pack(1) + _INT32.pack(1) + b"y",
    ]


@target("nsqd_identify")
def fuzz_nsqd_identify(data: bytes) -> None:
    """nsqd's IDENTIFY and AUTH bodies (JSON from the client): the input is the IDENTIFY
    body; a SUB/RDY/PUB and an AUTH with the same bytes follow, so the settings it applied
    are exercised (output buffering, heartbeats, sample rate, compression upgrades)."""
    sel, payload = split_input(data)
    stream = b"  V2" + body(b"IDENTIFY\n", payload)
    stream += b"SUB fuzz c\nRDY 3\n" + body(b"PUB fuzz\n", b"m") + body(b"AUTH\n", payload or b"x")
    _v2_connection(stream, sel)


@seeds("nsqd_identify")
def seeds_nsqd_identify() -> list[bytes]:
    docs: list[Any] = [
        {
            "client_id": "c",
            "hostname": "h",
            "feature_negotiation": True,
            "heartbeat_interval": 1000,
            "output_buffer_size": 65,
            "output_buffer_timeout": 10,
            "sample_rate": 50,
            "msg_timeout": 5000,
            "user_agent": "fuzz/1",
        },
        {"feature_negotiation": True, "snappy": True},
        {"feature_negotiation": True, "deflate": True, "deflate_level": 9},
        {"feature_negotiation": True, "deflate": True, "snappy": True},
        {"heartbeat_interval": -1, "output_buffer_size": -1, "output_buffer_timeout": -1},
        {"heartbeat_interval": 1.5, "tls_v1": "yes", "msg_timeout": 10**30},
        [1, 2, 3],
        None,
        "text",
    ]
    out = [bytes([i]) + json.dumps(d).encode() for i, d in enumerate(docs)]
    out += [b"\x00{", b"\x00" + b"[" * 50, b'\x00{"a":' * 20]
    return out


# --- HTTP: query strings and the daemons' handlers -------------------------------------------------


def _mk_request(loop: asyncio.AbstractEventLoop, method: str, url: str, payload: bytes) -> Any:
    from unittest import mock

    from aiohttp import streams
    from aiohttp.test_utils import make_mocked_request

    proto = mock.Mock()
    reader = streams.StreamReader(proto, 1 << 16, loop=loop)
    reader.feed_data(payload)
    reader.feed_eof()
    headers = {"Content-Length": str(len(payload))} if payload else {}
    return make_mocked_request(method, url, headers=headers, payload=reader, loop=loop)


_HTTP: dict[str, Any] = {}


def _http_servers() -> dict[str, Any]:
    if not _HTTP:
        from nsqpy.nsqd.http import HTTPServer as NsqdHTTP
        from nsqpy.nsqlookupd.http import HTTPServer as LookupdHTTP

        n = _nsqd()
        _HTTP["nsqd"] = NsqdHTTP(n.nsqd)
        _HTTP["lookupd"] = LookupdHTTP(_lookupd())
        import logging

        logging.getLogger("nsqlookupd").disabled = True
    return _HTTP


_PATHS = {
    "nsqd": [
        "/pub",
        "/mpub",
        "/topic/create",
        "/topic/delete",
        "/topic/empty",
        "/topic/pause",
        "/channel/create",
        "/channel/delete",
        "/channel/empty",
        "/channel/pause",
        "/stats",
        "/info",
        "/config/nsqlookupd_tcp_addresses",
        "/config/log_level",
        "/ping",
    ],
    "lookupd": [
        "/lookup",
        "/topics",
        "/channels",
        "/nodes",
        "/topic/create",
        "/topic/delete",
        "/channel/create",
        "/channel/delete",
        "/topic/tombstone",
        "/info",
        "/ping",
    ],
}


@target("http_query")
def fuzz_http_query(data: bytes) -> None:
    """The HTTP side: Go's ``url.ParseQuery`` (``parse_query``) never raises and keeps every
    well-formed pair; nsqd's and nsqlookupd's handlers answer any query string and body
    without an internal error (a 500 ``INTERNAL_ERROR`` is a handler that raised)."""
    from nsqpy.httpapi import parse_query

    sel, payload = split_input(data)
    query, _, rest = payload.partition(b"\x00")
    raw = query.decode("latin-1")
    values, ok = parse_query(raw)
    assert isinstance(values, dict)
    for k, vs in values.items():
        assert isinstance(k, str) and all(isinstance(v, str) for v in vs)
    if ok and "%" not in raw and "+" not in raw:
        for part in raw.split("&"):
            if part:
                k, _, v = part.partition("=")
                assert v in values[k]
    servers = _http_servers()
    which = "nsqd" if sel & 1 else "lookupd"
    paths = _PATHS[which]
    path = paths[(sel >> 1) % len(paths)]
    method = (
        "GET" if path in ("/stats", "/info", "/ping", "/lookup", "/topics", "/channels", "/nodes") else "POST"
    )
    if path.startswith("/config/") and sel & 0x40:
        method = "PUT"
    from urllib.parse import quote

    url = path + "?" + quote(raw, safe="=&%+;/:@!$'()*,")
    n = _nsqd()
    req = _mk_request(n.loop, method, url, rest)
    resp = n.loop.run_until_complete(servers[which].dispatch(req))
    text = getattr(resp, "body", b"") or b""
    assert not (resp.status == 500 and b"INTERNAL_ERROR" in bytes(text)), (
        method,
        url,
        rest[:100],
        resp.status,
    )
    n.tidy()
    if path.startswith("/config/") and method == "PUT":
        # keep the daemon as it was: no lookupd peers, default log level
        n.nsqd.lookup_peers.set_addresses([]) if n.nsqd.options.nsqlookupd_tcp_addresses else None


@seeds("http_query")
def seeds_http_query() -> list[bytes]:
    out = []
    queries = [
        b"topic=t",
        b"topic=t&channel=c",
        b"topic=t&channel=c#ephemeral",
        b"topic=%zz",
        b"a;b=c",
        b"topic=t&defer=100",
        b"topic=t&format=json&include_clients=false",
        b"topic=+&channel=%41",
        b"node=127.0.0.1:4151&topic=t",
        b"topic=t&binary=true",
    ]
    for i, q in enumerate(queries):
        out.append(bytes([i * 2]) + q + b"\x00hello\nworld")
        out.append(
            bytes([i * 2 + 1]) + q + b"\x00" + _INT32.pack(2) + _INT32.pack(1) + b"a" + _INT32.pack(1) + b"b"
        )
    return out


# --- JSON from peers and from disk ------------------------------------------------------------------


@target("peer_json")
def fuzz_peer_json(data: bytes) -> None:
    """JSON documents other machines (or the disk) hand us, through the code that reads
    them: a lookupd ``/lookup`` answer (``discovery.producers``), an nsqd ``nsqd.dat``
    (``metadata.read_metadata``), the client HTTP helpers' JSON. Only the documented
    errors may come out."""
    from nsqpy.nsqd import metadata
    from nsqpy.protocol.discovery import producers

    _, payload = split_input(data)
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        doc = None
    for p in producers(doc):
        assert p.tcp
    d = _dq_dir()
    path = metadata.metadata_path(d)
    with open(path, "wb") as f:
        f.write(payload)
    try:
        topics = metadata.read_metadata(d)
    except ValueError:
        return
    assert isinstance(topics, list)


@seeds("peer_json")
def seeds_peer_json() -> list[bytes]:
    lookup = {
        "channels": ["c"],
        "producers": [
            {"broadcast_address": "h", "tcp_port": 4150, "http_port": 4151},
            {"broadcast_address": "", "tcp_port": 1},
            "x",
            None,
        ],
    }
    meta = {
        "topics": [{"name": "t", "paused": False, "channels": [{"name": "c", "paused": True}]}],
        "version": "1.3.0",
    }
    return [
        b"\x00" + json.dumps(lookup).encode(),
        b"\x00" + json.dumps({"data": lookup}).encode(),
        b"\x00" + json.dumps(meta).encode(),
        b'\x00{"topics": 5}',
        b"\x00[]",
    ]


def all_seeds() -> Iterator[tuple[str, bytes]]:
    for name, fn in SEEDS.items():
        for s in fn():
            yield name, s


def cleanup() -> None:
    """Stop the in-process daemons and remove the temporary directories the targets made;
    the next target call starts afresh (a test module's teardown must not leave the next
    module's targets pointing at a removed directory)."""
    global _DQ_DIR, _NSQD, _LOOKUPD
    n, _NSQD = _NSQD, None
    _HTTP.clear()
    _LOOKUPD = None
    if n is not None:
        try:
            n.loop.run_until_complete(n.nsqd.stop())
        finally:
            n.loop.close()
            shutil.rmtree(n.dir, ignore_errors=True)
    if _DQ_DIR is not None:
        shutil.rmtree(_DQ_DIR, ignore_errors=True)
        _DQ_DIR = None
    import logging

    # the targets silence the daemons' loggers: give them back to the tests that follow
    # (tests/nsqd's read their log records)
    for name in ("nsqd", "nsqlookupd"):
        logging.getLogger(name).disabled = False
