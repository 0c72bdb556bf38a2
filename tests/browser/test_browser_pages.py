"""nsqadmin's pages in headless Chromium, checked against what nsqd's /stats and nsqlookupd
say: Streams, Topic, Channel (clients with snappy, deflate, TLS and AUTH), Nodes, Node,
Counter, Lookup; the live charts drawn from /api/series; a screenshot of each page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from browser_helpers import (  # noqa: F401
    Cluster,
    browser_fixture,
    expect,
    get_json,
    parse_int,
    wait_until,
)

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Two nsqd (the second with TLS and AUTH) and nsqadmin, with this state:

    - orders: channels archive (no consumer; paused on nsqd 1), work (a snappy consumer on
      nsqd 0 holding 3 in flight, 2 finished, 1 deferred; a TLS+deflate+AUTH consumer on
      nsqd 1 holding 1), slow on nsqd 0 (one message timed out);
    - quiet: 2 messages on nsqd 1, no channel;
    - bump: channel c on nsqd 0 (for the counter and the charts);
    - live#ephemeral with channel tap#ephemeral on nsqd 0 (names that need escaping in URLs).
    """
    c = Cluster(tmp_path_factory.mktemp("pages"), secure=True).start()
    try:
        for i in (0, 1):
            c.nsqd_post(i, "/topic/create?topic=orders")
            c.nsqd_post(i, "/channel/create?topic=orders&channel=archive")
            c.nsqd_post(i, "/channel/create?topic=orders&channel=work")
        c.nsqd_post(0, "/channel/create?topic=orders&channel=slow")
        c.nsqd_post(0, "/topic/create?topic=bump")
        c.nsqd_post(0, "/channel/create?topic=bump&channel=c")
        c.publish(0, "orders", 6, b"order from node 0")
        c.publish(1, "orders", 4, b"order from node 1")
        c.publish(1, "quiet", 2)
        c.nsqd_post(0, "/topic/create?topic=live%23ephemeral")
        c.nsqd_post(0, "/channel/create?topic=live%23ephemeral&channel=tap%23ephemeral")
        c.nsqd_post(1, "/channel/pause?topic=orders&channel=archive")

        a = c.subscribe(
            0,
            "orders",
            "work",
            snappy=True,
            user_agent="browser-test/snappy",
            client_id="worker-a",
            hostname="worker-a.example",
            msg_timeout=300_000,
        )
        c.call(lambda: a.send(commands.rdy(10)))
        msgs = c.run(a.wait_messages(6))
        c.call(lambda: [a.send(commands.fin(m.id)) for m in msgs[:2]])
        c.call(lambda: a.send(commands.req(msgs[2].id, 600_000)))

        b = c.subscribe(
            1,
            "orders",
            "work",
            tls_context=c.tls_context(),
            deflate=True,
            secret="good",
            user_agent="browser-test/tls",
            msg_timeout=300_000,
        )
        c.call(lambda: b.send(commands.rdy(1)))
        c.run(b.wait_messages(1))

        slow = c.subscribe(0, "orders", "slow", user_agent="browser-test/slow", msg_timeout=1000)
        c.call(lambda: slow.send(commands.rdy(1)))
        c.run(slow.wait_messages(1))
        c.call(lambda: slow.send(commands.rdy(0)))

        def settled() -> bool:
            work = c.channel_stats(0, "orders", "work")
            slow_ch = c.channel_stats(0, "orders", "slow")
            return bool(
                work
                and slow_ch
                and work["deferred_count"] == 1
                and work["in_flight_count"] == 3
                and slow_ch["timeout_count"] == 1
                and slow_ch["in_flight_count"] == 0
            )

        wait_until(settled, what="the consumers' state")
        c.registered("orders", 2)
        c.registered("quiet", 1)
        c.registered("bump", 1)
        c.registered("live%23ephemeral", 1)
        c.add_admin("main")
        yield c
    finally:
        c.stop()


def cell(row: Any, col: str) -> int:
    return parse_int(row.locator(f'[data-col="{col}"]').first.inner_text())


def open_page(browser, env, path: str):
    page = browser.page()
    page.goto(env.url("main", path))
    page.locator("main [data-page]").wait_for()
    return page


CHANNEL_COLS = [
    "depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
]


def test_streams_page(browser, env):
    page = open_page(browser, env, "/")
    expect(page).to_have_title(re.compile("Streams"))
    expect(page.locator("h1")).to_have_text("Topics")
    topics = env.lookupd_get("/topics")["topics"]
    rows = page.locator('[data-table="topics"] tbody tr')
    expect(rows).to_have_count(len(topics))
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.topic)")) == sorted(topics)
    # live figures from /api/series: the messages published to each topic on every nsqd
    for topic in topics:
        total = sum((env.topic_stats(i, topic) or {}).get("message_count", 0) for i in (0, 1))
        row = page.locator(f'tr[data-topic="{topic}"]')
        expect(row.locator('[data-col="message_count"]')).to_have_text(f"{total:,}")
        expect(row.locator('[data-col="rate"]')).to_have_text(re.compile(r"/s$"))
        expect(row.locator('[data-col="spark"] svg')).to_have_count(1)
    # the filter
    page.get_by_label("Filter topics").fill("qui")
    expect(page.locator('[data-table="topics"] tbody tr:visible')).to_have_count(1)
    page.get_by_label("Filter topics").fill("")
    browser.shot(page, "streams")
    browser.assert_no_errors()


def test_topic_page(browser, env):
    page = open_page(browser, env, "/topics/orders")
    expect(page.locator("h1")).to_contain_text("orders")
    stats = [env.topic_stats(i, "orders") for i in (0, 1)]
    table = page.locator('[data-table="topic-nodes"]')
    for i, t in enumerate(stats):
        row = table.locator(f'tr[data-node="{env.nsqd_http(i)}"]')
        expect(row).to_have_count(1)
        assert cell(row, "depth") == t["depth"]
        assert cell(row, "message_count") == t["message_count"]
        assert cell(row, "channels") == len(t["channels"])
        mem = t["depth"] - t["backend_depth"]
        expect(row.locator('[data-col="memory_disk"]')).to_have_text(f"{mem:,} + {t['backend_depth']:,}")
        expect(row.get_by_role("link", name=re.compile(str(env.nsqds[i].http_port)))).to_have_count(1)
    total = table.locator('tr[data-node="*"]')
    assert cell(total, "depth") == sum(t["depth"] for t in stats)
    assert cell(total, "message_count") == sum(t["message_count"] for t in stats)
    # e2e percentiles (nsqd runs with 0.5 and 0.99)
    heads = table.locator("thead").inner_text()
    assert (
        "E2E Processing Latency" in heads
        and "50th" in heads.replace("\n", "")
        and "99th" in heads.replace("\n", "")
    )
    # channels, summed across nodes
    names = sorted({c["channel_name"] for t in stats for c in t["channels"]})
    channels = page.locator('[data-table="channels"] tbody tr[data-channel]')
    expect(channels).to_have_count(len(names))
    for name in names:
        row = page.locator(f'[data-table="channels"] tr[data-channel="{name}"]')
        per_node = [c for t in stats for c in t["channels"] if c["channel_name"] == name]
        for col in CHANNEL_COLS:
            assert cell(row, col) == sum(c[col] for c in per_node), (name, col)
        paused = any(c["paused"] for c in per_node)
        expect(row.locator("[data-paused]")).to_have_count(1 if paused else 0)
        expect(row.get_by_role("link", name=name)).to_have_attribute("href", f"/topics/orders/{name}")
    assert page.locator('tr[data-channel="archive"] [data-paused]').count() == 1
    # admin actions and the tombstone buttons are offered
    for action in ("empty", "delete", "pause"):
        expect(page.locator(f'[data-actions="topic"] [data-action="{action}"]')).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("^Tombstone "))).to_have_count(2)
    # live rate cells filled from /api/series
    expect(page.locator('[data-table="channels"] tr[data-channel="work"] [data-col="rate"]')).to_have_text(
        re.compile(r"/s$")
    )
    browser.shot(page, "topic")
    browser.assert_no_errors()


def test_ephemeral_names_in_urls(browser, env):
    page = open_page(browser, env, "/")
    page.get_by_role("link", name="live#ephemeral").click()
    expect(page).to_have_url(env.url("main", "/topics/live%23ephemeral"))
    expect(page.locator("h1")).to_have_text("Topic: live#ephemeral")
    page.get_by_role("link", name="tap#ephemeral").click()
    expect(page).to_have_url(env.url("main", "/topics/live%23ephemeral/tap%23ephemeral"))
    total = page.locator('[data-table="channel-nodes"] tr[data-node="*"]')
    expect(total.locator('[data-col="depth"]')).to_have_text("0")
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=depth] svg')?.dataset.points) >= 1"
    )
    browser.assert_no_errors()


def test_topic_without_channels(browser, env):
    page = open_page(browser, env, "/topics/quiet")
    t = env.topic_stats(1, "quiet")
    row = page.locator(f'[data-table="topic-nodes"] tr[data-node="{env.nsqd_http(1)}"]')
    assert cell(row, "depth") == t["depth"] == 2
    expect(page.locator("[data-notice]")).to_contain_text("No channels exist for this topic")
    browser.assert_no_errors()


def test_channel_page(browser, env):
    page = open_page(browser, env, "/topics/orders/work")
    expect(page.locator("h1")).to_contain_text("work")
    stats = [env.channel_stats(i, "orders", "work") for i in (0, 1)]
    table = page.locator('[data-table="channel-nodes"]')
    for i, ch in enumerate(stats):
        row = table.locator(f'tr[data-node="{env.nsqd_http(i)}"]')
        for col in CHANNEL_COLS:
            assert cell(row, col) == ch[col], (i, col)
        mem = ch["depth"] - ch["backend_depth"]
        expect(row.locator('[data-col="memory_disk"]')).to_have_text(f"{mem:,} + {ch['backend_depth']:,}")
    total = table.locator('tr[data-node="*"]')
    for col in CHANNEL_COLS:
        assert cell(total, col) == sum(ch[col] for ch in stats), col
    assert cell(total, "deferred_count") == 1 and cell(total, "in_flight_count") == 4

    # the clients of both nodes, as nsqd reports them
    clients = [(i, cl) for i, ch in enumerate(stats) for cl in ch["clients"]]
    assert len(clients) == 2
    rows = page.locator('[data-table="clients"] tbody tr')
    expect(rows).to_have_count(2)
    for i, cl in clients:
        row = page.locator(f'[data-table="clients"] tr[data-client="{cl["remote_address"]}"]')
        expect(row.locator('[data-col="user_agent"]')).to_have_text(cl["user_agent"])
        expect(row.locator('[data-col="node"]')).to_have_text(env.nsqd_http(i))
        for col in ("in_flight_count", "ready_count", "finish_count", "requeue_count", "message_count"):
            assert cell(row, col) == cl[col], col
        expect(row.locator('[data-col="connected"]')).to_have_text(re.compile(r"^\d[\d.hmsnu]*$"))
        attrs = row.locator('[data-col="attributes"]')
        expect(attrs.locator(".label", has_text="Snappy")).to_have_count(1 if cl["snappy"] else 0)
        expect(attrs.locator(".label", has_text="Deflate")).to_have_count(1 if cl["deflate"] else 0)
        expect(attrs.locator(".label", has_text="TLS")).to_have_count(1 if cl["tls"] else 0)
        expect(attrs.locator(".label", has_text="Auth")).to_have_count(1 if cl.get("authed") else 0)
    secure = next(cl for _, cl in clients if cl["tls"])
    assert secure["deflate"] and secure.get("authed") and secure["auth_identity"] == "ann"
    tls_label = page.locator(f'tr[data-client="{secure["remote_address"]}"] .label', has_text="TLS")
    expect(tls_label).to_have_attribute("title", re.compile("TLS"))
    auth = page.locator(f'tr[data-client="{secure["remote_address"]}"] a.label', has_text="Auth: ann")
    expect(auth).to_have_attribute("href", "http://people.example/ann")
    snappy = next(cl for _, cl in clients if cl["snappy"])
    expect(page.locator(f'tr[data-client="{snappy["remote_address"]}"] [data-col="host"]')).to_have_text(
        f"worker-a.example:{snappy['remote_address'].rsplit(':', 1)[1]}"
    )
    for action in ("empty", "delete", "pause"):
        expect(page.locator(f'[data-actions="channel"] [data-action="{action}"]')).to_be_visible()
    browser.shot(page, "channel")
    browser.assert_no_errors()


def test_paused_channel_and_timeouts(browser, env):
    page = open_page(browser, env, "/topics/orders/archive")
    expect(page.locator("h1 [data-paused]")).to_have_count(1)
    expect(page.locator(f'tr[data-node="{env.nsqd_http(1)}"] [data-paused]')).to_have_count(1)
    expect(page.locator(f'tr[data-node="{env.nsqd_http(0)}"] [data-paused]')).to_have_count(0)
    expect(page.locator('[data-action="unpause"]')).to_have_text("UnPause Channel")
    expect(page.locator("[data-notice]")).to_contain_text("No clients connected")

    page.goto(env.url("main", "/topics/orders/slow"))
    row = page.locator('[data-table="channel-nodes"] tr[data-node="*"]')
    expect(row.locator('[data-col="timeout_count"]')).to_have_text("1")
    browser.assert_no_errors()


def test_nodes_page(browser, env):
    page = open_page(browser, env, "/nodes")
    expect(page.locator("h1")).to_have_text("NSQd Nodes (2)")
    for i in (0, 1):
        info = get_json(f"http://{env.nsqd_http(i)}/info")
        row = page.locator(f'[data-table="nodes"] tr[data-node="{env.nsqd_http(i)}"]')
        expect(row.locator('[data-col="hostname"]')).to_have_text(info["hostname"])
        expect(row.locator('[data-col="broadcast_address"]')).to_have_text(info["broadcast_address"])
        expect(row.locator('[data-col="tcp_port"]')).to_have_text(str(info["tcp_port"]))
        expect(row.locator('[data-col="http_port"]')).to_have_text(str(info["http_port"]))
        expect(row.locator('[data-col="version"]')).to_have_text(info["version"])
        expect(row.locator('[data-col="lookupd_conns"]')).to_have_text("1")
        topics = sorted(t["topic_name"] for t in env.stats(i)["topics"])
        got = row.locator("[data-topic]").evaluate_all("ls => ls.map(l => l.dataset.topic)")
        assert sorted(got) == topics
    # the lookupd connection list opens
    button = page.locator('[data-col="lookupd_conns"]').first
    button.click()
    expect(button).to_have_attribute("aria-expanded", "true")
    expect(page.locator(".conn-list").first).to_contain_text(env.lookupd_http)
    browser.shot(page, "nodes")
    browser.assert_no_errors()


def test_node_page_by_navigation(browser, env):
    """The node link of the Nodes page opens the Node page without reloading (History API)."""
    page = open_page(browser, env, "/nodes")
    page.evaluate("window.__same_document = true")
    node = env.nsqd_http(0)
    page.locator(f'tr[data-node="{node}"] [data-col="broadcast_address"] a').click()
    expect(page).to_have_url(env.url("main", f"/nodes/{node}"))
    expect(page.locator("h1")).to_contain_text(node)
    assert page.evaluate("window.__same_document") is True

    stats = env.stats(0)
    topics = stats["topics"]
    expect(page.locator('[data-stat="topics"]')).to_have_text(str(len(topics)))
    messages = sum(t["message_count"] for t in topics)
    expect(page.locator('[data-stat="messages"]')).to_have_text(f"{messages:,}")
    n_clients = sum(len(c["clients"]) for t in topics for c in t["channels"])
    expect(page.locator('[data-stat="clients"]')).to_have_text(str(n_clients))
    for t in topics:
        section = page.locator(f'section[data-topic="{t["topic_name"]}"]')
        summary = section.locator("[data-topic-row]")
        expect(summary.locator('[data-col="depth"]')).to_have_text(f"{t['depth']:,}")
        expect(summary.locator('[data-col="message_count"]')).to_have_text(f"{t['message_count']:,}")
        for ch in t["channels"]:
            row = section.locator(f'tr[data-channel="{ch["channel_name"]}"]')
            for col in (
                "depth",
                "in_flight_count",
                "deferred_count",
                "requeue_count",
                "timeout_count",
                "message_count",
            ):
                assert cell(row, col) == ch[col], (t["topic_name"], ch["channel_name"], col)
            assert cell(row, "client_count") == len(ch["clients"])
            expect(section.locator(f'tr[data-clients-of="{ch["channel_name"]}"] tbody tr')).to_have_count(
                len(ch["clients"])
            )
        expect(section.get_by_role("button", name=re.compile("^Tombstone topic"))).to_have_count(1)
    client_row = page.locator('section[data-topic="orders"] tr[data-clients-of="work"] tbody tr')
    expect(client_row.locator('[data-col="user_agent"]')).to_have_text("browser-test/snappy")
    expect(client_row.locator('[data-col="ready_count"]')).to_have_text("10")
    browser.shot(page, "node")
    # back goes to the Nodes page, in the same document
    page.go_back()
    expect(page.locator("h1")).to_have_text("NSQd Nodes (2)")
    assert page.evaluate("window.__same_document") is True
    # the paused channel and the TLS client of nsqd 1
    page.goto(env.url("main", f"/nodes/{env.nsqd_http(1)}"))
    archive = page.locator('section[data-topic="orders"] tr[data-channel="archive"]')
    expect(archive.locator("[data-paused]")).to_have_count(1)
    expect(page.locator('tr[data-clients-of="work"] .label', has_text="TLS")).to_have_count(1)
    browser.assert_no_errors()


def test_counter_page(browser, env):
    def processed() -> int:
        return sum(c["message_count"] for i in (0, 1) for t in env.stats(i)["topics"] for c in t["channels"])

    page = open_page(browser, env, "/counter")
    counter = page.locator("[data-counter]")
    expect(counter).to_have_attribute("data-value", str(processed()))
    expect(page.get_by_text("Messages Processed", exact=True)).to_be_visible()
    browser.shot(page, "counter")
    env.publish(0, "bump", 4)
    expect(counter).to_have_attribute("data-value", str(processed()))
    expect(page.locator("[data-counter-rate]")).to_contain_text("/s")
    browser.assert_no_errors()


def test_lookup_page(browser, env):
    env.lookupd_post("/topic/create?topic=dormant")
    env.lookupd_post("/channel/create?topic=dormant&channel=sleeper")
    page = open_page(browser, env, "/lookup")
    expect(page.locator('[data-table="lookupd"] tbody')).to_have_text(env.lookupd_http)
    topic = page.locator('[data-tree="inactive"] > li[data-topic="dormant"]')
    expect(topic).to_have_count(1)
    expect(topic.locator('li[data-channel="sleeper"]')).to_have_count(1)
    expect(page.locator('[data-tree="inactive"] > li[data-topic="orders"]')).to_have_count(0)
    expect(topic.get_by_role("button", name="Delete topic dormant")).to_be_visible()
    expect(page.locator('form[data-form="create"]')).to_be_visible()
    browser.shot(page, "lookup")
    browser.assert_no_errors()


def test_live_charts(browser, env):
    """The topic and channel charts draw /api/series and keep polling it (since=)."""
    page = open_page(browser, env, "/topics/bump")
    series_urls: list[str] = []
    page.on("request", lambda r: series_urls.append(r.url) if "/api/series/" in r.url else None)
    rate_chart = page.locator('[data-chart="rate"] svg')
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=rate] svg')?.dataset.points) >= 3"
    )
    before = int(rate_chart.get_attribute("data-points"))
    depth_before = env.channel_stats(0, "bump", "c")["depth"]
    env.publish(0, "bump", 40)
    # the new depth shows in the legend, and the rate chart saw a non-zero rate
    expect(page.locator('[data-chart="depth"] .legend-value[data-series="c"]')).to_have_text(
        f"{depth_before + 40}"
    )
    page.wait_for_function("() => Number(document.querySelector('[data-chart=rate] svg').dataset.max) > 0")
    assert int(rate_chart.get_attribute("data-points")) > before
    assert any("since=" in u for u in series_urls), series_urls
    expect(page.locator('[data-chart="rate"] path[data-series="published"]')).to_have_attribute(
        "d", re.compile(r"^M[\d.]+ [\d.]+L")
    )
    expect(page.locator('tr[data-channel="c"] [data-col="spark"] svg')).to_have_count(2)
    browser.shot(page, "topic-charts")

    page.goto(env.url("main", "/topics/bump/c"))
    depth = env.channel_stats(0, "bump", "c")["depth"]
    expect(page.locator('[data-chart="depth"] .legend-value[data-series="depth"]')).to_have_text(str(depth))
    page.wait_for_function("() => Number(document.querySelector('[data-chart=rate] svg')?.dataset.max) > 0")
    browser.shot(page, "channel-charts")
    browser.assert_no_errors()


def test_number_formats(browser, env):
    """The UI's number and duration formats (Go's commafy and nanotohuman; compact rates)."""
    page = open_page(browser, env, "/nodes")
    got = page.evaluate("""async () => {
        const f = await import('/static/js/format.js');
        return {
            commafy: [0, 7, 1234, 1234567, null].map(f.commafy),
            nano: [0, 999, 1500, 2500000, 1.5e9, 61e9, 3723e9].map(f.nanotohuman),
            compact: [0, 0.25, 12.34, 950, 1234, 56789, 5.6e6].map(f.compact),
            rate: [null, 0, 1234.5].map(f.rate),
            pct: [0.5, 0.99, 0.999, 0.01, 0.11].map((q) => f.floatToPercent(q) + f.percSuffix(q)),
            seconds: [0.25, 5, 90, 600, 3600, 5400].map(f.seconds),
        };
    }""")
    assert got == {
        "commafy": ["0", "7", "1,234", "1,234,567", "0"],
        "nano": ["0ns", "999ns", "1.5us", "2.5ms", "1.5s", "1m1s", "1h2m3s"],
        "compact": ["0", "0.25", "12.3", "950", "1.2k", "56.8k", "5.6M"],
        "rate": ["–", "0/s", "1.2k/s"],
        "pct": ["50th", "99th", "99th", "1st", "11th"],
        "seconds": ["0.25s", "5s", "1m30s", "10m", "1h", "1h30m"],
    }
