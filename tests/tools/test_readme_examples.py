"""The README's client and tool examples, run as written against real nsqlookupd and nsqd
processes. Each example is the fenced block after a ``<!-- readme-example: NAME -->`` line;
the only change made to it is the addresses (the README's 127.0.0.1:4150 / :4161 become the
test daemons' ports, which the OS picks) and ``.venv/bin/`` (this Python's bin directory)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.proc import BIN_DIR, lookupd_and_nsqd
from tools_helpers import ToolProcess, channels, message_count, wait_until

pytestmark = pytest.mark.timeout(90)

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE_RE = re.compile(
    r"<!-- readme-example: (?P<name>[\w-]+) -->\n```(?P<lang>\w+)\n(?P<code>.*?)```", re.S
)


def examples() -> dict[str, str]:
    return {m["name"]: m["code"] for m in EXAMPLE_RE.finditer(README.read_text())}


def test_readme_has_the_examples():
    ex = examples()
    assert set(ex) >= {"producer", "consumer", "sync", "tools", "inprocess"}
    # short, and aimed at the node of `bash scripts/run.sh`
    for name in ("producer", "consumer", "sync"):
        assert len([ln for ln in ex[name].splitlines() if ln.strip()]) <= 8, name
    assert "127.0.0.1:4150" in ex["producer"] and "127.0.0.1:4161" in ex["consumer"]


@pytest.fixture
def cluster(tmp_path):
    with lookupd_and_nsqd(tmp_path, check_exit=True) as (lookupd, nsqd):
        yield lookupd, nsqd


def test_readme_examples_run(cluster, tmp_path):
    lookupd, nsqd = cluster
    ex = examples()

    def localize(code: str) -> str:
        return (
            code.replace("127.0.0.1:4150", nsqd.tcp_address)
            .replace("127.0.0.1:4161", lookupd.http_address)
            .replace(".venv/bin/", f"{BIN_DIR}/")
        )

    def run_python(name: str) -> str:
        res = subprocess.run(
            [sys.executable, "-c", localize(ex[name])],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
        )
        assert res.returncode == 0, f"{name}:\n{res.stdout}\n{res.stderr}"
        return res.stdout

    # as the README orders them, on a node whose topic already has another channel (the
    # quickstart's): the consumer subscribes first, then the producer publishes
    assert nsqd.http_post("/topic/create?topic=test")[0] == 200
    assert nsqd.http_post("/channel/create?topic=test&channel=quickstart")[0] == 200

    def registered() -> bool:
        status, body = lookupd.http_get("/lookup?topic=test")
        return status == 200 and bool(json.loads(body)["producers"])

    wait_until(registered, what="topic test in nsqlookupd")

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with ToolProcess(
        "consumer", [], tmp_path, argv=[sys.executable, "-c", localize(ex["consumer"])], env=env
    ) as consumer:
        wait_until(lambda: "readme" in channels(nsqd, "test"), what="the consumer's channel")
        run_python("producer")
        assert message_count(nsqd, "test") == 1
        wait_until(lambda: consumer.stdout() == b"hello\n", what="the consumer to print hello")
        run_python("sync")
        wait_until(
            lambda: consumer.stdout() == b"hello\nhello from blocking code\n",
            what="the consumer to print the sync message",
        )
        wait_until(lambda: channels(nsqd, "test")["readme"]["in_flight_count"] == 0, what="FIN")
        consumer.signal(signal.SIGTERM)
        consumer.wait()

    tail_line, to_nsq_line = [ln for ln in ex["tools"].splitlines() if ln.strip()]
    with ToolProcess("nsq_tail", [], tmp_path, argv=["bash", "-c", "exec " + localize(tail_line)]) as tail:
        wait_until(
            lambda: any(c.endswith("#ephemeral") for c in channels(nsqd, "test")), what="nsq_tail's channel"
        )
        res = subprocess.run(
            ["bash", "-c", localize(to_nsq_line)], capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 0, res.stderr
        assert tail.wait(30) == 0, tail.describe()
        assert tail.stdout() == b"one\ntwo\nthree\n"


def test_readme_inprocess_example_runs(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", examples()["inprocess"]],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    tcp, http = res.stdout.split()
    assert int(tcp) > 0 and int(http) > 0
    assert os.listdir(tmp_path) == []  # nothing left behind


def test_readme_quickstart_runs(cluster, tmp_path):
    """The Quickstart's curl publishes, then its pynsq consumer, as written (on a fresh node:
    its channel is the topic's first, so it receives what was published before it)."""
    _, nsqd = cluster
    ex = examples()

    def localize(code: str) -> str:
        return (
            code.replace("127.0.0.1:4151", nsqd.http_address)
            .replace("127.0.0.1:4150", nsqd.tcp_address)
            .replace(".venv/bin/", f"{BIN_DIR}/")
        )

    res = subprocess.run(
        ["bash", "-c", localize(ex["quickstart-publish"])], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("OKOKOK{"), res.stdout
    assert json.loads(res.stdout[len("OKOKOK") :])["topics"][0]["depth"] == 5
    with ToolProcess(
        "pynsq",
        [],
        tmp_path,
        argv=["bash", "-c", localize(ex["quickstart-consume"])],
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    ) as consumer:
        want = b"hello world 1\nhello world 2\none\ntwo\nthree\n"
        wait_until(lambda: consumer.stdout() == want, what="the pynsq consumer's five lines")
        wait_until(lambda: channels(nsqd, "test")["quickstart"]["depth"] == 0, what="FINs")


def test_readme_policies_example_runs(cluster):
    """The Queue policies curls, as written: the settings set, the last line's answer the one
    the README prints, and the channel's settings kept in nsqd.dat."""
    _, nsqd = cluster
    code = examples()["policies"].replace("127.0.0.1:4151", nsqd.http_address)
    res = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    shown = re.search(r"The last one answers\n`(\{.*?\})`", README.read_text())
    assert shown is not None
    # curl prints the bodies one after another: the last one is the GET's
    last = res.stdout[res.stdout.rindex('{"max_depth"') :]
    assert json.loads(last) == json.loads(shown[1])
    status, body = nsqd.http_get("/topic/config?topic=orders")
    assert status == 200
    assert json.loads(body) == {
        "max_depth": 100000,
        "max_bytes": None,
        "overflow": "drop_oldest",
        "max_age": None,
    }


def test_readme_tls_example_runs(tmp_path):
    """The TLS section as written: openssl makes the certificate, nsqd starts with it (on
    free ports), and the pynsq consumer (TLS + snappy, verifying the certificate) prints
    what was published over HTTP."""
    ex = examples()
    res = subprocess.run(
        ["bash", "-c", ex["tls-cert"]], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    mkdir, cmd = ex["tls-nsqd"].split("\n", 1)
    subprocess.run(["bash", "-c", mkdir], cwd=tmp_path, check=True, timeout=10)
    cmd = (
        cmd.replace("127.0.0.1:4150", "127.0.0.1:0")
        .replace("127.0.0.1:4151", "127.0.0.1:0")
        .replace("127.0.0.1:4152", "127.0.0.1:0")
        .replace(".venv/bin/", f"{BIN_DIR}/")
        .replace("\\\n", " ")
    )
    nsqd = ToolProcess("nsqd", [], tmp_path, argv=["bash", "-c", "exec " + cmd], cwd=tmp_path)
    with nsqd:
        wait_until(lambda: b"nsqd HTTPS address:" in nsqd.stdout(), what="nsqd listening")
        addrs = dict(
            line.split(" address: ") for line in nsqd.stdout().decode().splitlines() if " address: " in line
        )
        tcp, http = addrs["nsqd TCP"], addrs["nsqd HTTP"]
        import urllib.request

        for body in (b"over tls 1", b"over tls 2"):
            urllib.request.urlopen(
                urllib.request.Request(f"http://{http}/pub?topic=test", data=body, method="POST"), timeout=5
            ).read()
        code = ex["tls-consumer"].replace("127.0.0.1:4150", tcp)
        with ToolProcess(
            "tls-consumer",
            [],
            tmp_path,
            argv=[sys.executable, "-c", code],
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            cwd=tmp_path,
        ) as consumer:
            wait_until(
                lambda: consumer.stdout() == b"over tls 1\nover tls 2\n", what="the TLS consumer's two lines"
            )
            status = urllib.request.urlopen(f"http://{http}/stats?format=json&topic=test", timeout=5).read()
            client = json.loads(status)["topics"][0]["channels"][0]["clients"][0]
            assert client["tls"] is True and client["snappy"] is True, client


@pytest.mark.timeout(180)
async def test_readme_client_tools_and_spark_over_tls_and_auth(tmp_path):
    """The README's TLS + AUTH examples for our client, nsq_tail and nsq_spark, as written,
    against an nsqd with the README's certificate, --tls-required=tcp-https and an auth
    server (tests/support.AuthServer) that knows the secret."""
    from support import GRANT, AuthServer, wait_for

    from nsqpy.nsqd.nsqd import NSQD
    from nsqpy.nsqd.options import Options

    ex = examples()
    res = subprocess.run(
        ["bash", "-c", ex["tls-cert"]], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    authd = await AuthServer().start()
    authd.answers["good"] = dict(
        GRANT,
        authorizations=[{"topic": "^test$", "channels": [".*"], "permissions": ["publish", "subscribe"]}],
    )
    (tmp_path / "data").mkdir()
    opts = Options(
        tcp_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        https_address="127.0.0.1:0",
        data_path=str(tmp_path / "data"),
        tls_cert=str(tmp_path / "nsqd.crt"),
        tls_key=str(tmp_path / "nsqd.key"),
        tls_required="tcp-https",
        auth_http_addresses=[authd.address],
    )
    env = dict(os.environ, NSQ_AUTH_SECRET="good", PYTHONUNBUFFERED="1")
    try:
        async with NSQD(opts) as d:
            tcp = f"127.0.0.1:{d.tcp_port}"
            d.get_topic("test").get_channel("archive")

            def localize(code: str) -> str:
                return code.replace("127.0.0.1:4150", tcp).replace(".venv/bin/", f"{BIN_DIR}/")

            async def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=tmp_path,
                    env=env,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                out, err = await asyncio.wait_for(proc.communicate(), timeout)
                return subprocess.CompletedProcess(argv, proc.returncode, out.decode(), err.decode())

            tail = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                localize(ex["tools-tls"]).replace("\\\n", " "),
                cwd=tmp_path,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                await wait_for(
                    lambda: any(c.endswith("#ephemeral") for c in d.topics["test"].channels), timeout=30
                )
                res = await run([sys.executable, "-c", localize(ex["client-tls"])], 60)
                assert res.returncode == 0, res.stderr
                out, err = await asyncio.wait_for(tail.communicate(), 30)
            finally:
                if tail.returncode is None:
                    tail.kill()
                    await tail.wait()
            assert (tail.returncode, out) == (0, b"hello over TLS\n"), err
            res = await run(["bash", "-c", localize(ex["spark-tls"]).replace("\\\n", " ")], 170)
            assert res.returncode == 0, res.stderr[-3000:]
            assert "rows in 1, rows out 1" in res.stdout, res.stdout
            import pyarrow.dataset as ds

            table = ds.dataset(str(tmp_path / "out/tls"), format="parquet", partitioning="hive").to_table()
            assert table.column("body").to_pylist() == [b"hello over TLS"]
            assert {r["secret"] for r in authd.requests} == {"good"}
            assert {r["tls"] for r in authd.requests} == {"true"}
    finally:
        await authd.stop()


@pytest.mark.timeout(120)
def test_readme_other_tools_run(cluster, tmp_path):
    """The README's nsq_to_file, nsq_to_http, nsq_to_nsq and nsq_stat lines, as written (the
    addresses localised; port 8080 is a test web server that records what it is sent)."""
    import http.server
    import threading

    lookupd, nsqd = cluster
    posted: list[bytes] = []

    class Ingest(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ingest)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    lines = [ln for ln in examples()["tools-more"].splitlines() if ln.strip()]
    localized = [
        ln.replace("127.0.0.1:4161", lookupd.http_address)
        .replace("127.0.0.1:4150", nsqd.tcp_address)
        .replace("127.0.0.1:8080", f"127.0.0.1:{web.server_address[1]}")
        .replace(".venv/bin/", f"{BIN_DIR}/")
        for ln in lines
    ]
    assert nsqd.http_post("/topic/create?topic=test")[0] == 200
    procs = []
    try:
        for i, line in enumerate(localized[:3]):
            procs.append(
                ToolProcess(f"tool{i}", [], tmp_path, argv=["bash", "-c", "exec " + line], cwd=tmp_path)
            )
        want = {"nsq_to_file", "nsq_to_http", "nsq_to_nsq"}
        wait_until(lambda: want <= set(channels(nsqd, "test")), what="the three tools' channels")
        body = b"\n".join(b"event %d" % i for i in range(20))
        assert nsqd.http_post("/mpub?topic=test", body)[0] == 200
        wait_until(lambda: len(posted) == 20, what="nsq_to_http's 20 POSTs")
        assert sorted(posted) == sorted(body.split(b"\n"))
        wait_until(lambda: message_count(nsqd, "test-copy") == 20, what="nsq_to_nsq's copies")
        res = subprocess.run(
            ["bash", "-c", localized[3]], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.count("\n") >= 3, res.stdout  # a header and two polls
        for p in procs:
            p.signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(30) == 0, p.describe()
        files = list((tmp_path / "archive").iterdir())
        lines_out = b"".join(f.read_bytes() for f in files).splitlines()
        assert sorted(lines_out) == sorted(body.split(b"\n")), files
    finally:
        for p in procs:
            p.stop()
        web.shutdown()


def test_readme_peek_example_runs(cluster):
    """The Peek section's curls, as written: the peek shows the first message without taking
    it, and the redrive answers what the README says and moves both."""
    _, nsqd = cluster
    code = examples()["peek"].replace("127.0.0.1:4151", nsqd.http_address)
    res = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    text = README.read_text()
    assert res.stdout.startswith("OKOK{"), res.stdout
    peeked, _, moved = res.stdout[len("OKOK") :].partition("}{")
    doc = json.loads(peeked + "}")
    shown = re.search(r"The peek answers\n`(\{.*?\})`", text)
    assert shown is not None
    want = json.loads(shown[1].replace('"…"', '"x"').replace("…", "0"))
    (msg,) = doc["messages"]
    want["messages"][0].update(id=msg["id"], timestamp=msg["timestamp"])
    assert doc == want
    assert json.loads("{" + moved) == {"moved": 2}
    assert 'and the redrive `{"moved":2}`' in text
    status, body = nsqd.http_get("/topic/peek?topic=orders")
    assert status == 200
    assert [m["body_preview"] for m in json.loads(body)["messages"]] == ["first", "second"]


@pytest.mark.timeout(120)
def test_readme_securing_a_cluster_runs(tmp_path):
    """ "Securing a cluster" as written: the token and htpasswd files (Apache's htpasswd),
    nsqlookupd, nsqd and nsqadmin with them (nsqadmin over HTTPS with the TLS example's
    certificate), and the curls: no token refused, the token accepted, nsqadmin refusing
    whoever has not signed in and a user who is not an admin, and carrying the token to nsqd
    for an admin's pause."""
    from contextlib import ExitStack

    from support import free_port

    ex = examples()
    env = dict(os.environ, ANN_PASSWORD="ann's secret", BOB_PASSWORD="bob-pw-2")
    for name in ("tls-cert", "secure-files"):
        res = subprocess.run(
            ["bash", "-c", ex[name]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, (name, res.stderr)
    assert oct((tmp_path / "admin.token").stat().st_mode & 0o777) == "0o600"
    assert [ln.split(":")[0] for ln in (tmp_path / "nsqadmin.htpasswd").read_text().split()] == ["ann", "bob"]
    ports = {p: str(free_port()) for p in ("4160", "4161", "4150", "4151", "4171")}

    def localize(code: str) -> str:
        for old, new in ports.items():
            code = code.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
        return code

    commands = localize(ex["secure-daemons"]).replace("\\\n", " ").strip().splitlines()
    assert len(commands) == 3
    for cmd, name in zip(commands, ("nsqlookupd", "nsqd", "nsqadmin"), strict=True):
        assert f".venv/bin/{name} " in cmd
    with ExitStack() as stack:
        for i, cmd in enumerate(commands):
            cmd = cmd.replace(".venv/bin/", f"exec {BIN_DIR}/")
            proc = stack.enter_context(
                ToolProcess(f"secure{i}", [], tmp_path, argv=["bash", "-c", cmd], env=env, cwd=tmp_path)
            )
            wait_until(lambda p=proc: b" address: " in p.stdout(), what=f"daemon {i} listening")
        assert b"nsqadmin HTTPS address:" in proc.stdout()
        res = subprocess.run(
            ["bash", "-c", localize(ex["secure-curl"])],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        out = res.stdout
        unauthorized, forbidden = '{"message":"UNAUTHORIZED"}', '{"message":"FORBIDDEN"}'
        assert out.startswith(unauthorized + unauthorized + forbidden), out
        import urllib.request

        stats = urllib.request.urlopen(
            f"http://127.0.0.1:{ports['4151']}/stats?format=json&topic=orders", timeout=5
        ).read()
        (topic,) = json.loads(stats)["topics"]
        assert topic["topic_name"] == "orders" and topic["paused"] is True
