"""nsqadmin behind a path prefix and an ACL, and with Graphite, in headless Chromium:

- ``--base-path=/admin/``: every page opens by link and by URL under /admin, every request the
  page makes (assets, API, time series) stays under it, and an action works there;
- ``--admin-user``: without the ACL header the UI is read-only (no action anywhere);
- ``--graphite-url``: Go's Graphite sparklines, large graphs and rate column, and the graph
  timeframe menu (``off`` hides them).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

import pytest
from browser_helpers import Cluster, browser_fixture, expect, wait_until  # noqa: F401

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(90)

BASE = "/admin"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("access")).start()
    try:
        for i in (0, 1):
            c.nsqd_post(i, "/topic/create?topic=orders")
            c.nsqd_post(i, "/channel/create?topic=orders&channel=work")
            c.publish(i, "orders", 3)
        sub = c.subscribe(0, "orders", "work", user_agent="browser-test/plain")
        c.call(lambda: sub.send(commands.rdy(1)))
        c.run(sub.wait_messages(1))
        c.registered("orders", 2)
        c.add_admin("prefixed", base_path="/admin/", admin_users=["boss"])
        graphite = c.start_graphite()
        c.add_admin("graphite", graphite_url=graphite.url)
        yield c
    finally:
        c.stop()


def admin_requests(page, env, admin: str) -> list[str]:
    """Record the paths of every request the page sends to nsqadmin ``admin``."""
    host = env.admins[admin].http_addr_str
    seen: list[str] = []

    def on_request(request):
        parts = urlsplit(request.url)
        if parts.netloc == host:
            seen.append(parts.path)

    page.on("request", on_request)
    return seen


def main_links(page) -> list[str]:
    return page.locator("main a[href]:not([data-external])").evaluate_all(
        "as => as.map(a => a.getAttribute('href'))"
    )


def test_base_path_every_page(browser, env):
    page = browser.page(user="boss")
    seen = admin_requests(page, env, "prefixed")
    page.goto(env.url("prefixed", BASE))
    expect(page.locator("h1")).to_have_text("Topics")
    page.evaluate("window.__same_document = true")
    node = env.nsqd_http(0)
    nav = page.get_by_role("navigation", name="Main")

    steps = [
        (
            lambda: page.get_by_role("link", name="orders", exact=True).click(),
            f"{BASE}/topics/orders",
            "topic",
        ),
        (
            lambda: page.locator('[data-table="channels"]').get_by_role("link", name="work").click(),
            f"{BASE}/topics/orders/work",
            "channel",
        ),
        (lambda: nav.get_by_role("link", name="Nodes").click(), f"{BASE}/nodes", "nodes"),
        (
            lambda: page.locator(f'tr[data-node="{node}"] [data-col="broadcast_address"] a').click(),
            f"{BASE}/nodes/{node}",
            "node",
        ),
        (lambda: nav.get_by_role("link", name="Counter").click(), f"{BASE}/counter", "counter"),
        (lambda: nav.get_by_role("link", name="Lookup").click(), f"{BASE}/lookup", "lookup"),
        (lambda: nav.get_by_role("link", name="Streams").click(), BASE, "streams"),
    ]
    for click, path, name in steps:
        click()
        expect(page).to_have_url(env.url("prefixed", path))
        expect(page.locator(f'main [data-page="{name}"]')).to_have_count(1)
        expect(nav.get_by_role("link", name="Streams")).to_have_attribute("href", BASE)
        expect(nav.get_by_role("link", name="Nodes")).to_have_attribute("href", f"{BASE}/nodes")
        for href in main_links(page):
            assert href == BASE or href.startswith(f"{BASE}/"), (name, href)
        browser.shot(page, f"base-path-{name}")
    assert page.evaluate("window.__same_document") is True

    # every page also opens from its URL (the server answers index.html under the prefix)
    for path, name in [
        (f"{BASE}/topics/orders/work", "channel"),
        (f"{BASE}/nodes/{node}", "node"),
        (f"{BASE}/lookup", "lookup"),
        (f"{BASE}/", "streams"),
    ]:
        page.goto(env.url("prefixed", path))
        expect(page.locator(f'main [data-page="{name}"]')).to_have_count(1)

    # the live charts poll the time series under the prefix too
    page.goto(env.url("prefixed", f"{BASE}/topics/orders"))
    page.wait_for_function(
        "() => Number(document.querySelector('[data-chart=rate] svg')?.dataset.points) >= 2"
    )
    assert any(p.startswith(f"{BASE}/api/series/topics/orders") for p in seen), seen
    assert any(p.startswith(f"{BASE}/static/") for p in seen), seen
    outside = [p for p in seen if p != BASE and not p.startswith(f"{BASE}/")]
    assert not outside, outside
    browser.assert_no_errors()


def test_action_under_base_path(browser, env):
    page = browser.page(user="boss")
    seen = admin_requests(page, env, "prefixed")
    page.goto(env.url("prefixed", f"{BASE}/topics/orders/work"))
    page.get_by_role("button", name="Pause Channel").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    wait_until(
        lambda: all(env.channel_stats(i, "orders", "work")["paused"] for i in (0, 1)),
        what="orders/work paused through /admin/api",
    )
    expect(page.get_by_role("button", name="UnPause Channel")).to_be_visible()
    assert f"{BASE}/api/topics/orders/work" in seen
    page.get_by_role("button", name="UnPause Channel").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    wait_until(
        lambda: not any(env.channel_stats(i, "orders", "work")["paused"] for i in (0, 1)),
        what="orders/work unpaused",
    )
    browser.assert_no_errors()


def test_read_only_ui(browser, env):
    """No ACL header (not an --admin-user): every page shows its data and no action."""
    page = browser.page()
    node = env.nsqd_http(0)
    env.lookupd_post("/topic/create?topic=idle")
    env.lookupd_post("/channel/create?topic=idle&channel=c")
    pages = [
        ("", "streams"),
        ("/topics/orders", "topic"),
        ("/topics/orders/work", "channel"),
        ("/nodes", "nodes"),
        (f"/nodes/{node}", "node"),
        ("/counter", "counter"),
        ("/lookup", "lookup"),
    ]
    for path, name in pages:
        page.goto(env.url("prefixed", BASE + path))
        expect(page.locator(f'main [data-page="{name}"]')).to_have_count(1)
        expect(page.locator("[data-readonly]")).to_have_text("read-only")
        expect(page.locator("[data-action]")).to_have_count(0)
        expect(page.locator(".btn-cross")).to_have_count(0)
        expect(page.locator('form[data-form="create"]')).to_have_count(0)
        browser.shot(page, f"read-only-{name}")
    # the data is still there
    page.goto(env.url("prefixed", f"{BASE}/topics/orders"))
    expect(page.locator('[data-table="topic-nodes"] tbody tr[data-node]')).to_have_count(3)
    page.goto(env.url("prefixed", f"{BASE}/lookup"))
    expect(page.locator('[data-tree="inactive"] li[data-topic="idle"] li[data-channel="c"]')).to_have_count(1)
    # an admin sees the actions on the same nsqadmin
    admin = browser.page(user="boss")
    admin.goto(env.url("prefixed", f"{BASE}/lookup"))
    expect(admin.locator('form[data-form="create"]')).to_be_visible()
    expect(admin.locator("[data-readonly]")).to_have_count(0)
    expect(admin.locator("#user-slot")).to_contain_text("boss")
    browser.assert_no_errors()


def _render_targets(env) -> list[str]:
    assert env.graphite is not None
    out = []
    for q in env.graphite.queries:
        pairs = (p.split("=", 1) for p in q.split("&"))
        out += [unquote(v.replace("+", " ")) for k, v in pairs if k == "target"]
    return out


def test_graphite(browser, env):
    page = browser.page()
    page.goto(env.url("graphite", "/topics/orders"))
    expect(page.locator("#graph-interval")).to_have_value("2h")
    node = env.nsqd_http(0)
    host_key = node.replace(".", "_").replace(":", "_")
    # the rate column asks /api/graphite, which asks graphite (120 per 60s interval)
    expect(page.locator(f'tr[data-node="{node}"] [data-col="rate"]')).to_have_text("2.00")
    total_rate = page.locator('[data-table="topic-nodes"] tr[data-node="*"] [data-col="rate"]')
    expect(total_rate).to_have_text("2.00")
    expect(page.locator('[data-table="channels"] tr[data-channel="work"] [data-col="rate"]')).to_have_text(
        "2.00"
    )
    # sparklines under each row, linking to the large graphs
    images = page.locator("img.graphite")
    expect(images.first).to_be_visible()
    srcs = images.evaluate_all("is => is.map(i => i.src)")
    assert srcs and all(s.startswith(f"{env.graphite.url}/render?") for s in srcs)
    depth = f'summarize(sumSeries(stats.gauges.nsq.{host_key}.topic.orders.depth),"60sec","avg")'
    wait_until(lambda: depth in _render_targets(env), what="the browser loading the depth sparkline")
    assert "sumSeries(stats.counters.nsq.*.topic.orders.message_count.count)" in _render_targets(env)
    link = page.locator('[data-table="topic-nodes"] tr.graph-row a').first
    expect(link).to_have_attribute("href", re.compile(r"/render\?.*width=800"))
    expect(page.locator('[data-table="topic-nodes"] tr.graph-row img').first).to_have_attribute(
        "src", re.compile(r"from=-2h")
    )
    browser.shot(page, "graphite-topic")

    # the timeframe menu: another interval redraws, "off" hides the graphs
    page.select_option("#graph-interval", "12h")
    expect(page.locator('[data-table="topic-nodes"] tr.graph-row img').first).to_have_attribute(
        "src", re.compile(r"from=-12h")
    )
    page.select_option("#graph-interval", "off")
    expect(page.locator("img.graphite")).to_have_count(0)
    expect(total_rate).to_have_text(re.compile(r"/s$"))
    page.select_option("#graph-interval", "2h")

    page.goto(env.url("graphite", f"/nodes/{node}"))
    expect(page.locator(".graph-grid img.graphite")).to_have_count(4)
    page.goto(env.url("graphite", "/counter"))
    expect(page.locator("img.big-graph")).to_have_attribute("src", re.compile(r"/render\?.*_uniq="))
    page.goto(env.url("graphite", "/"))
    expect(page.locator('tr[data-topic="orders"] img.graphite')).to_have_count(2)
    expect(page.locator('tr[data-topic="orders"] td.rate')).to_have_text("2.00")
    browser.shot(page, "graphite-streams")
    browser.assert_no_errors()
