"""Channels known to nsqlookupd are created with the topic (Go's GetTopic): a consumer whose
channel is registered before the first publish misses nothing, on any nsqd of the cluster.
Real nsqlookupd and nsqd console scripts."""

from __future__ import annotations

import json

import pytest
from e2e.proc import NsqdProcess, lookupd_and_nsqd
from support import RawClient, wait_until

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(60)


def channel_depths(p: NsqdProcess, topic: str) -> dict[str, int]:
    status, body = p.http_get(f"/stats?format=json&topic={topic}")
    assert status == 200
    topics = json.loads(body)["topics"] or []
    return {c["channel_name"]: c["depth"] for t in topics for c in t["channels"]}


def test_registered_channels_exist_before_the_first_message(tmp_path):
    with lookupd_and_nsqd(tmp_path, check_exit=True) as (lookupd, nsqd):
        wait_until(
            lambda: json.loads(lookupd.http_get("/nodes")[1])["producers"],
            what="nsqd registered with nsqlookupd",
        )
        # two consumers' channels (and an ephemeral one) registered before any publish
        for ch in ("archive", "metrics", "tail%23ephemeral"):
            assert lookupd.http_post(f"/channel/create?topic=orders&channel={ch}")[0] == 200
        body = b"\n".join(b"order %d" % i for i in range(50))
        assert nsqd.http_post("/mpub?topic=orders", body)[0] == 200
        # answered once both durable channels exist and have every message, as Go's GetTopic
        # (the ephemeral one is not made)
        assert channel_depths(nsqd, "orders") == {"archive": 50, "metrics": 50}
        # a topic nsqlookupd knows nothing about starts without channels, as before
        assert nsqd.http_post("/pub?topic=fresh", b"x")[0] == 200
        wait_until(
            lambda: json.loads(nsqd.http_get("/stats?format=json&topic=fresh")[1])["topics"][0]["depth"] == 1,
            what="the message held by the topic",
        )
        assert channel_depths(nsqd, "fresh") == {}


@pytest.mark.parametrize("strict", [False, True], ids=["memory", "crash-safe"])
async def test_tcp_pub_is_answered_after_the_channels_exist(tmp_path, strict):
    """Go's GetTopic creates the channels nsqlookupd knows before the PUB that created the
    topic is answered: /stats right after the OK shows them, holding the message."""
    args = ("--mem-queue-size=0", "--sync-every=1") if strict else ()
    with lookupd_and_nsqd(tmp_path, *args, check_exit=True) as (lookupd, nsqd):
        wait_until(
            lambda: json.loads(lookupd.http_get("/nodes")[1])["producers"],
            what="nsqd registered with nsqlookupd",
        )
        assert lookupd.http_post("/channel/create?topic=events&channel=archive")[0] == 200
        c = await RawClient.connect(nsqd.tcp_port)
        try:
            c.send(commands.pub("events", b"first"))
            c.send(commands.mpub("events", [b"second", b"third"]))
            assert await c.read_frame(timeout=10) == (0, b"OK")
            assert await c.read_frame(timeout=10) == (0, b"OK")
            assert channel_depths(nsqd, "events") == {"archive": 3}
        finally:
            await c.close()
