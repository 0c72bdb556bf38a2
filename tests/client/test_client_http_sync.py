"""HTTP clients (nsqd, nsqlookupd) and the sync facade."""

from __future__ import annotations

import threading

import pytest
from client_helpers import opts
from support import wait_for

from nsqpy.client import (
    LookupdHTTPClient,
    NsqdHTTPClient,
    NSQHTTPError,
    SyncConsumer,
    SyncProducer,
)
from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(30)


async def test_nsqd_http_client(nsqd: NSQD) -> None:
    async with NsqdHTTPClient(f"127.0.0.1:{nsqd.http_port}") as h:
        assert await h.ping() == "OK"
        assert (await h.info())["version"]
        assert await h.publish("ht", b"one") == "OK"
        assert await h.multipublish("ht", [b"two", b"three\nwith newline"]) == "OK"
        assert await h.multipublish("ht", [b"four", b"five"], binary=False) == "OK"
        await h.publish("ht", b"later", defer=1.5)
        await h.create_channel("ht", "ch")
        await h.pause_channel("ht", "ch")
        stats = await h.stats(topic="ht")
        (t,) = stats["topics"]
        assert t["topic_name"] == "ht" and t["message_count"] == 6
        assert t["channels"][0]["paused"] is True
        await h.unpause_channel("ht", "ch")
        await h.empty_channel("ht", "ch")
        await h.pause_topic("ht")
        await h.unpause_topic("ht")
        await h.empty_topic("ht")
        await h.delete_channel("ht", "ch")
        with pytest.raises(NSQHTTPError) as ei:
            await h.delete_channel("ht", "ch")
        assert ei.value.status == 404 and ei.value.message == "CHANNEL_NOT_FOUND"
        await h.delete_topic("ht")
        with pytest.raises(NSQHTTPError, match="TOPIC_NOT_FOUND"):
            await h.delete_topic("ht")
        with pytest.raises(ValueError):
            await h.multipublish("ht", [b"a\nb"], binary=False)


async def test_lookupd_http_client(tmp_path) -> None:
    from nsqpy.nsqlookupd import NSQLookupd
    from nsqpy.nsqlookupd import Options as LookupdOptions

    async with NSQLookupd(LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")) as lk:
        o = opts(
            tmp_path,
            "d",
            nsqlookupd_tcp_addresses=[f"127.0.0.1:{lk.tcp_port}"],
            broadcast_address="127.0.0.1",
        )
        async with NSQD(o) as d, LookupdHTTPClient(f"http://127.0.0.1:{lk.http_port}") as h:
            assert await h.ping() == "OK"
            async with NsqdHTTPClient(f"127.0.0.1:{d.http_port}") as nsqd_http:
                await nsqd_http.create_topic("lt")
                await nsqd_http.create_channel("lt", "lc")

            async def registered() -> bool:
                try:
                    return bool((await h.lookup("lt"))["producers"])
                except NSQHTTPError:
                    return False

            await wait_for(registered)
            res = await h.lookup("lt")
            assert res["producers"][0]["tcp_port"] == d.tcp_port
            assert "lt" in await h.topics()
            await wait_for(lambda: _has_channel(h))
            assert any(n["tcp_port"] == d.tcp_port for n in await h.nodes())
            await h.create_topic("made")
            await h.create_channel("made", "mc")
            assert "mc" in await h.channels("made")
            await h.delete_channel("made", "mc")
            await h.delete_topic("made")
            await h.tombstone_topic("lt", f"127.0.0.1:{d.http_port}")
            with pytest.raises(NSQHTTPError):
                await h.lookup("missing")


async def _has_channel(h: LookupdHTTPClient) -> bool:
    return "lc" in await h.channels("lt")


async def test_sync_producer_and_consumer(nsqd: NSQD) -> None:
    port = nsqd.tcp_port
    result: dict[str, object] = {}

    def script() -> None:
        try:
            with SyncProducer(f"127.0.0.1:{port}") as p:
                p.publish("sy", b"hello")
                p.publish_many("sy", [b"a", b"b"])
            got = []
            with SyncConsumer("sy", "c", nsqd_tcp_addresses=[f"127.0.0.1:{port}"], max_in_flight=5) as c:
                for msg in c:
                    got.append(msg.body)
                    msg.fin()
                    if len(got) == 3:
                        break
                with pytest.raises(TimeoutError):
                    c.next(timeout=0.2)
            result["got"] = got
        except BaseException as e:
            result["error"] = e

    # The in-process nsqd runs on this test's loop: run the blocking script in a thread.
    t = threading.Thread(target=script)
    t.start()
    await wait_for(lambda: not t.is_alive(), timeout=20)
    assert "error" not in result, result.get("error")
    assert sorted(result["got"]) == [b"a", b"b", b"hello"]  # type: ignore[arg-type]
