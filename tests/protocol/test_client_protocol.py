"""protocol.client.ClientProtocol against our nsqd (in-process) over real sockets, through a
tiny asyncio shell: every combination of TLS, snappy, deflate and AUTH; wrong secrets, a
TLS verification failure, a server that refuses compression; heartbeats, answers in order,
message batches; and the pure state machine fed byte by byte."""

from __future__ import annotations

import asyncio
import json

import pytest
from support import GRANT, AuthServer
from transport.certs import make_pki

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options
from nsqpy.protocol import commands
from nsqpy.protocol.client import Answer, ClientProtocol, HandshakeError, Ready, ServerError
from nsqpy.protocol.errors import ProtocolError
from nsqpy.transport import TransportError, client_tls_context

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


class Shell:
    """The smallest asyncio shell: writes what the protocol wants sent, feeds it reads."""

    def __init__(self, proto: ClientProtocol, r: asyncio.StreamReader, w: asyncio.StreamWriter):
        self.p = proto
        self.r = r
        self.w = w
        self.events: list = []

    @classmethod
    async def open(cls, port: int, proto: ClientProtocol) -> Shell:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        s = cls(proto, r, w)
        proto.start()
        s.flush()
        return s

    def flush(self) -> None:
        out = self.p.data_to_send()
        if out:
            self.w.write(out)

    async def pump(self, timeout: float = 5.0) -> list:
        data = await asyncio.wait_for(self.r.read(65536), timeout)
        if not data:
            raise ConnectionError("closed")
        events = self.p.receive(data)
        self.flush()
        return events

    async def until(self, pred, timeout: float = 5.0):
        while True:
            for e in self.events:
                if pred(e):
                    self.events.remove(e)
                    return e
            self.events += await self.pump(timeout)

    async def ready(self) -> Ready:
        return await self.until(lambda e: isinstance(e, Ready))

    async def request(self, cmd: bytes, token: object) -> Answer:
        self.p.send_request(cmd, token)
        self.flush()
        return await self.until(lambda e: isinstance(e, Answer) and e.token is token)

    async def messages(self, n: int) -> list:
        """``n`` messages, each FIN'd as it arrives."""
        got: list = []
        while len(got) < n:
            for e in list(self.events):
                if isinstance(e, list):
                    got += e
                    self.events.remove(e)
                    for m in e:
                        self.p.send(commands.fin(m.id))
            self.flush()
            if len(got) < n:
                self.events += await self.pump()
        return got


IDENT = {"client_id": "t", "hostname": "t", "user_agent": "nsqpy-test", "heartbeat_interval": 1000}


def make_proto(pki=None, *, tls=False, snappy=False, deflate=False, secret=None, **kw):
    ident = dict(IDENT, tls_v1=tls, snappy=snappy, deflate=deflate, **kw)
    ctx = client_tls_context(root_ca_file=pki.ca_cert) if tls else None
    return ClientProtocol(ident, tls_context=ctx, server_hostname="127.0.0.1", auth_secret=secret)


COMBOS = [
    pytest.param(dict(), id="plain"),
    pytest.param(dict(tls=True), id="tls"),
    pytest.param(dict(snappy=True), id="snappy"),
    pytest.param(dict(deflate=True), id="deflate"),
    pytest.param(dict(tls=True, snappy=True), id="tls+snappy"),
    pytest.param(dict(tls=True, deflate=True), id="tls+deflate"),
]


@pytest.mark.parametrize("auth", [False, True], ids=["noauth", "auth"])
@pytest.mark.parametrize("combo", COMBOS)
async def test_every_combination_publishes_and_consumes(tmp_path, pki, combo, auth):
    authd = await AuthServer().start() if auth else None
    opts = Options(
        tcp_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        data_path=str(tmp_path),
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        https_address="127.0.0.1:0",
        auth_http_addresses=[authd.address] if authd else [],
    )
    try:
        async with NSQD(opts) as d:
            pub = await Shell.open(d.tcp_port, make_proto(pki, secret="good" if auth else None, **combo))
            ready = await pub.ready()
            assert bool(ready.settings["tls_v1"]) is combo.get("tls", False)
            assert pub.p.stack.compression == (
                "snappy" if combo.get("snappy") else "deflate" if combo.get("deflate") else None
            )
            assert (ready.auth or {}).get("identity") == ("ann" if auth else None)
            bodies = [b"body %d " % i + bytes(range(256)) for i in range(500)]
            a = await pub.request(commands.pub("orders", bodies[0]), "pub")
            assert (a.data, a.error) == (b"OK", None)
            a = await pub.request(commands.mpub("orders", bodies[1:]), "mpub")
            assert a.data == b"OK"

            sub = await Shell.open(d.tcp_port, make_proto(pki, secret="good" if auth else None, **combo))
            await sub.ready()
            assert (await sub.request(commands.sub("orders", "c"), "sub")).data == b"OK"
            sub.p.send(commands.rdy(200))
            sub.flush()
            msgs = await sub.messages(500)
            assert [m.body for m in msgs] == bodies
            a = await sub.request(b"CLS\n", "cls")
            assert a.data == b"CLOSE_WAIT"
    finally:
        if authd is not None:
            await authd.stop()


async def test_answers_in_order_heartbeats_and_non_fatal_errors(tmp_path):
    async with NSQD(Options(tcp_address="127.0.0.1:0", http_address="", data_path=str(tmp_path))) as d:
        s = await Shell.open(d.tcp_port, make_proto())
        await s.ready()
        for i in range(5):
            s.p.send_request(commands.pub("t", b"m%d" % i), i)
        s.p.send_request(commands.sub("t", "c"), "sub")
        s.flush()
        answers = [await s.until(lambda e, i=i: isinstance(e, Answer) and e.token == i) for i in range(5)]
        assert [a.data for a in answers] == [b"OK"] * 5
        assert (await s.until(lambda e: isinstance(e, Answer) and e.token == "sub")).data == b"OK"
        s.p.send(commands.fin(b"0" * 16))  # not in flight: a non-fatal error, owned by nobody
        s.flush()
        err = await s.until(lambda e: isinstance(e, ServerError))
        assert err.error.code == "E_FIN_FAILED" and not err.error.fatal
        assert s.p.pending == 0
        # heartbeats (1 s) are answered by the protocol itself: the connection stays open
        while s.p.heartbeats < 2:
            s.events += await s.pump(timeout=3)
        a = await s.request(commands.pub("t", b"after heartbeats"), "late")
        assert a.data == b"OK"


async def test_fatal_error_answers_the_pending_command(tmp_path):
    async with NSQD(Options(tcp_address="127.0.0.1:0", http_address="", data_path=str(tmp_path))) as d:
        s = await Shell.open(d.tcp_port, make_proto())
        await s.ready()
        a = await s.request(commands.sub("t", "c"), "sub")
        a = await s.request(b"CLS\n", "cls")
        s.p.send_request(b"SUB t c\n", "again")
        s.flush()
        a = await s.until(lambda e: isinstance(e, Answer) and e.token == "again")
        assert a.error is not None and a.error.code == "E_INVALID" and a.error.fatal


@pytest.mark.parametrize(
    "secret,code",
    [("wrong", "E_AUTH_FAILED"), ("empty", "E_UNAUTHORIZED")],
)
async def test_auth_refused_raises_the_servers_error(tmp_path, secret, code):
    authd = await AuthServer().start()
    authd.answers["empty"] = dict(GRANT, authorizations=[])
    try:
        opts = Options(
            tcp_address="127.0.0.1:0",
            http_address="",
            data_path=str(tmp_path),
            auth_http_addresses=[authd.address],
        )
        async with NSQD(opts) as d:
            s = await Shell.open(d.tcp_port, make_proto(secret=secret))
            with pytest.raises(ProtocolError) as e:
                await s.ready()
            assert e.value.code == code
    finally:
        await authd.stop()


async def test_auth_required_without_a_secret(tmp_path):
    authd = await AuthServer().start()
    try:
        opts = Options(
            tcp_address="127.0.0.1:0",
            http_address="",
            data_path=str(tmp_path),
            auth_http_addresses=[authd.address],
        )
        async with NSQD(opts) as d:
            s = await Shell.open(d.tcp_port, make_proto())
            with pytest.raises(HandshakeError, match="requires AUTH"):
                await s.ready()
    finally:
        await authd.stop()


async def test_tls_verification_failure(tmp_path, pki):
    other = make_pki(tmp_path / "other")  # a CA that did not sign nsqd's certificate
    opts = Options(
        tcp_address="127.0.0.1:0",
        http_address="",
        data_path=str(tmp_path),
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        https_address="",
    )
    async with NSQD(opts) as d:
        proto = ClientProtocol(
            dict(IDENT, tls_v1=True),
            tls_context=client_tls_context(root_ca_file=other.ca_cert),
            server_hostname="127.0.0.1",
        )
        s = await Shell.open(d.tcp_port, proto)
        with pytest.raises(TransportError, match="certificate verify failed"):
            await s.ready()


async def test_server_that_refuses_compression_and_tls(tmp_path, pki):
    """nsqd without a certificate and with --snappy=false/--deflate=false answers false: the
    connection carries on in plain text."""
    opts = Options(
        tcp_address="127.0.0.1:0", http_address="", data_path=str(tmp_path), snappy=False, deflate=False
    )
    async with NSQD(opts) as d:
        s = await Shell.open(d.tcp_port, make_proto(pki, tls=True, snappy=True))
        ready = await s.ready()
        assert ready.settings["tls_v1"] is False and ready.settings["snappy"] is False
        assert s.p.stack.layers == []
        assert (await s.request(commands.pub("t", b"plain"), 1)).data == b"OK"


def test_byte_by_byte_handshake_and_frames():
    """The state machine alone, fed one byte at a time: the IDENTIFY answer, the snappy
    upgrade (its OK in the same stream), then a heartbeat, an answer and a message."""
    from nsqpy.protocol.frames import encode_message_frame, encode_response
    from nsqpy.transport import SnappyLayer

    p = ClientProtocol(dict(IDENT, snappy=True))
    p.start()
    assert p.data_to_send().startswith(b"  V2IDENTIFY\n")
    server = SnappyLayer()
    settings = {"snappy": True, "max_rdy_count": 2500}
    wire = encode_response(json.dumps(settings).encode())
    wire += server.encode(encode_response(b"OK"))
    events = []
    for i in range(len(wire)):
        events += p.receive(wire[i : i + 1])
    assert len(events) == 1 and isinstance(events[0], Ready) and events[0].settings == settings
    p.send_request(commands.pub("t", b"x"), "pub")
    client_stream = SnappyLayer()  # what the server decodes the client's bytes with
    assert client_stream.decode(p.data_to_send()) == commands.pub("t", b"x")
    wire = server.encode(
        encode_response(b"_heartbeat_")
        + encode_response(b"OK")
        + encode_message_frame(1, 1, b"a" * 16, b"hello")
    )
    events = []
    for i in range(len(wire)):
        events += p.receive(wire[i : i + 1])
    assert isinstance(events[0], Answer) and events[0].token == "pub" and events[0].data == b"OK"
    assert events[1][0].body == b"hello" and p.heartbeats == 1
    assert client_stream.decode(p.data_to_send()) == commands.NOP  # the heartbeat's answer


def test_unrequested_upgrade_is_a_handshake_error():
    from nsqpy.protocol.frames import encode_response

    p = ClientProtocol(dict(IDENT))
    p.start()
    with pytest.raises(HandshakeError, match="snappy"):
        p.receive(encode_response(b'{"snappy": true}'))
    with pytest.raises(ValueError):
        ClientProtocol(dict(IDENT, tls_v1=True))
