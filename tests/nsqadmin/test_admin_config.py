"""GET/PUT /config/:opt with --allow-config-from-cidr, --base-path, and the Graphite parts
(/api/graphite, the /render proxy) against a fake graphite server."""

from __future__ import annotations

import base64
import json

import pytest
from admin_helpers import Recorder, cluster_fixture, running_admin  # noqa: F401
from aiohttp import web
from support import closed_port

pytestmark = pytest.mark.timeout(60)


async def test_config_get_put(cluster):
    dead = f"127.0.0.1:{closed_port()}"
    async with running_admin(nsqlookupd_http_addresses=[dead], admin_users=["ann"]) as (
        admin,
        http,
    ):
        assert await http.json("/config/log_level") == 2
        assert await http.json("/config/nsqlookupd_http_addresses") == [dead]
        assert await http.json("/config/nsqd_http_addresses") == []
        assert await http.json("/config/admin_users") == ["ann"]
        assert await http.json("/config/statsd_interval") == 60_000_000_000
        assert await http.json("/config/http_client_connect_timeout") == 2_000_000_000
        # a string is written as text (Go's RespondV1)
        assert (await http.get("/config/acl_http_header"))[::2] == (200, b"X-Forwarded-User")
        assert (await http.get("/config/base_path"))[::2] == (200, b"/")
        assert await http.json("/config/stats_sample_interval") == 0
        for path in ("/config/nosuch", "/config/version", "/config/config"):
            assert await http.json(path, 400) == {"message": "INVALID_OPTION"}

        status, _, body = await http.put("/config/log_level", b"WARN")
        assert (status, json.loads(body)) == (200, 3)
        assert admin.options.log_level == "warn"
        for data, expected in (
            (b"loud", (400, "INVALID_VALUE")),
            (b"", (413, "INVALID_VALUE")),
            (b"x" * (1024 * 1024 + 1), (413, "INVALID_VALUE")),
        ):
            status, _, body = await http.put("/config/log_level", data)
            assert (status, json.loads(body)["message"]) == expected
        status, _, body = await http.put("/config/http_address", b"0.0.0.0:1")
        assert (status, json.loads(body)) == (400, {"message": "INVALID_OPTION"})

        # the lookupd list takes effect at once
        assert (await http.get("/api/topics"))[0] == 502
        cluster.nsqds[0].get_topic("orders")
        await cluster.registered("orders", 1)
        new = json.dumps([cluster.lookupd_http]).encode()
        status, _, body = await http.put("/config/nsqlookupd_http_addresses", new)
        assert (status, json.loads(body)) == (200, [cluster.lookupd_http])
        assert await http.json("/api/topics") == {"topics": ["orders"], "message": ""}
        for bad in (b"nope", b'"a:1"', b"[1]", b"{}"):
            status, _, body = await http.put("/config/nsqlookupd_http_addresses", bad)
            assert (status, json.loads(body)) == (400, {"message": "INVALID_VALUE"}), bad


async def test_config_cidr(cluster):
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http], allow_config_from_cidr="10.0.0.0/8"
    ) as (_, http):
        assert await http.json("/config/log_level", 403) == {"message": "FORBIDDEN"}
        status, _, body = await http.put("/config/log_level", b"debug")
        assert (status, json.loads(body)) == (403, {"message": "FORBIDDEN"})
        # everything else is not limited
        assert (await http.get("/api/topics"))[0] == 200
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http], allow_config_from_cidr="127.0.0.1/32"
    ) as (_, http):
        assert (await http.get("/config/allow_config_from_cidr"))[::2] == (200, b"127.0.0.1/32")
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], allow_config_from_cidr="") as (
        _,
        http,
    ):
        assert await http.json("/config/log_level") == 2


async def test_base_path(cluster):
    cluster.nsqds[0].get_topic("orders").get_channel("archive")
    await cluster.registered("orders", 1)
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        base_path="admin/",
        stats_sample_interval=0.05,
    ) as (admin, http):
        assert admin.options.base_path == "/admin"
        assert (await http.get("/admin/config/base_path"))[::2] == (200, b"/admin")
        status, _, body = await http.get("/admin/ping")
        assert (status, body) == (200, b"OK")
        assert await http.json("/admin/api/topics") == {"topics": ["orders"], "message": ""}
        assert (await http.json("/admin/api/topics/orders/archive"))["channel_name"] == "archive"
        status, body = await http.post_json("/admin/api/topics/orders", {"action": "pause"})
        assert status == 200
        assert (await http.json("/admin/api/series/topics"))["message"] == ""
        for path in ("/api/topics", "/ping", "/static/index.html", "/admin/admin/ping"):
            assert (await http.get(path))[0] == 404, path
        status, headers, page = await http.get("/admin")
        assert status == 200 and headers["Content-Type"] == "text/html"
        assert b"var BASE_PATH = '/admin';" in page
        assert b'href="/admin/api/topics"' in page
        assert (await http.get("/admin/topics/orders/archive"))[0] == 200
        assert (await http.get("/admin/static/index.html"))[0] == 200
        status, headers, _ = await http.get("/admin/")
        assert (status, headers["Location"]) == (301, "/admin")


async def test_graphite(cluster):
    async with (
        Recorder() as graphite,
        running_admin(
            nsqlookupd_http_addresses=[cluster.lookupd_http],
            graphite_url=f"http://{graphite.address}",
            statsd_interval=30.0,
        ) as (_, http),
    ):
        graphite.answer = lambda r: web.json_response([{"target": "x", "datapoints": [[45.0, 1700000000]]}])
        assert await http.json("/api/graphite?metric=rate&target=sumSeries(a.b)") == {"rate": "1.50"}
        [req] = graphite.requests
        assert req["path"] == "/render"
        assert req["query"] == "format=json&from=-60sec&target=sumSeries%28a.b%29&until=-30sec"
        assert req["headers"]["Accept"] == "application/vnd.nsq; version=1.0"

        graphite.answer = lambda r: web.json_response([{"target": "x", "datapoints": [[-1, 0]]}])
        assert await http.json("/api/graphite?metric=rate&target=t") == {"rate": "N/A"}
        assert await http.json("/api/graphite?target=t", 400) == {"message": "INVALID_ARG_METRIC"}
        assert await http.json("/api/graphite?metric=sum&target=t", 400) == {"message": "INVALID_ARG_METRIC"}
        assert await http.json("/api/graphite?metric=rate", 400) == {"message": "INVALID_ARG_TARGET"}
        graphite.answer = lambda r: web.Response(status=500, text="boom")
        assert await http.json("/api/graphite?metric=rate&target=t", 500) == {"message": "INTERNAL_ERROR"}
        # no --proxy-graphite: no /render route
        assert (await http.get("/render?target=t"))[0] == 404


async def test_graphite_proxy(cluster):
    async with (
        Recorder() as graphite,
        running_admin(
            nsqlookupd_http_addresses=[cluster.lookupd_http],
            graphite_url=f"http://reader:pw@{graphite.address}",
            proxy_graphite=True,
        ) as (_, http),
    ):
        graphite.answer = lambda r: web.Response(body=b"PNG...", headers={"Content-Type": "image/png"})
        status, headers, body = await http.get("/render?target=a.b&from=-2h")
        assert (status, body, headers["Content-Type"]) == (200, b"PNG...", "image/png")
        [req] = graphite.requests
        assert (req["path"], req["query"]) == ("/render", "target=a.b&from=-2h")
        assert req["headers"]["Authorization"] == "Basic " + base64.b64encode(b"reader:pw").decode()
        status, _, page = await http.get("/")
        assert b"var GRAPH_ENABLED = true;" in page
        assert b"var GRAPHITE_URL = '';" in page  # the page goes through nsqadmin's /render
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        graphite_url=f"http://127.0.0.1:{closed_port()}",
        proxy_graphite=True,
    ) as (_, http):
        status, _, body = await http.get("/render?target=a")
        assert (status, body) == (502, b"")
