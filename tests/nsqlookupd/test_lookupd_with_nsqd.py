"""Our nsqd registering with our nsqlookupd, both in-process: what /lookup, /channels and
/nodes show as topics and channels come and go, and when nsqd leaves."""

from __future__ import annotations

import aiohttp
import pytest
from conftest import make_options
from lookupd_helpers import HTTP, lookupd_fixture  # noqa: F401  (fixture)
from support import wait_for

from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(30)


async def test_nsqd_registers_and_unregisters(tmp_path, lookupd):
    opts = make_options(
        tmp_path,
        nsqlookupd_tcp_addresses=[lookupd.tcp_addr_str],
        broadcast_address="nsqd.example",
    )
    async with aiohttp.ClientSession() as s:
        http = HTTP(s, lookupd.http_port)
        nsqd = NSQD(opts)
        await nsqd.start()
        try:
            topic = nsqd.get_topic("orders")
            topic.get_channel("archive")

            async def registered():
                status, _, _ = await http.get("/lookup?topic=orders")
                if status != 200:
                    return None
                doc = await http.json("/lookup?topic=orders")
                return doc if doc["producers"] and doc["channels"] == ["archive"] else None

            doc = await wait_for(registered)
            [producer] = doc["producers"]
            assert producer["broadcast_address"] == "nsqd.example"
            assert (producer["tcp_port"], producer["http_port"]) == (nsqd.tcp_port, nsqd.http_port)
            assert producer["version"] == "1.3.0"
            nodes = (await http.json("/nodes"))["producers"]
            assert [n["topics"] for n in nodes] == [["orders"]]

            nsqd.delete_topic("orders")

            async def unregistered():
                doc = await http.json("/lookup?topic=orders")
                return doc["producers"] == []

            await wait_for(unregistered)
        finally:
            await nsqd.stop()

        async def gone():
            return (await http.json("/nodes"))["producers"] == []

        await wait_for(gone)
