"""The Messages panel in nsqadmin, clicked in headless Chromium: peeking 10/50/100 on a
channel shows each nsqd's queued, deferred and in-flight messages (tabs), rows labelled by
node, a node's own error; bodies as text, hex or pretty JSON ("not JSON" said), an HTML
body shown as text; an admin requeues and removes a message and redrives a topic's backlog,
each confirmed (checked on nsqd), with each node's error shown; non-admins (with
--admin-user) are told only admins may look."""

from __future__ import annotations

import base64
import re

import pytest
from browser_helpers import Cluster, browser_fixture, expect, get_json, http, wait_until  # noqa: F401

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(120)

#: a body that would run script and load an image if it were ever parsed as HTML
HTML_BODY = b'<img src="x" onerror="window.__pwned=1"><script>window.__pwned=2</script>'
JSON_BODY = b'{"sku":"A1","qty":2,"tags":["red"]}'


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("messages")).start()
    try:
        c.add_admin("main")
        c.add_admin("acl", admin_users=["boss"])
        yield c
    finally:
        c.stop()


def open_page(browser, env, path: str, admin: str = "main", user: str | None = None):
    page = browser.page(user)
    page.goto(env.url(admin, path))
    page.locator("main [data-page]").wait_for()
    return page


def pub(env, i: int, topic: str, body: bytes, defer_ms: int = 0) -> None:
    q = f"&defer={defer_ms}" if defer_ms else ""
    status, text = http("POST", f"http://{env.nsqd_http(i)}/pub?topic={topic}{q}", body)
    assert status == 200, text


def nsqd_peek(env, i: int, topic: str, channel: str = "") -> dict:
    if channel:
        return get_json(f"http://{env.nsqd_http(i)}/channel/peek?topic={topic}&channel={channel}&n=100")
    return get_json(f"http://{env.nsqd_http(i)}/topic/peek?topic={topic}&n=100")


def peek(page, n: int = 10):
    """Click "Peek n" and wait for the panel to draw the answer."""
    section = page.locator('[data-section="messages"]')
    section.get_by_role("button", name=f"Peek {n}", exact=True).click()
    expect(section.locator('[data-table="peek-nodes"]')).to_be_visible()
    expect(section.locator("[data-peek-body]")).not_to_have_attribute("aria-busy", "true")
    return section


def rows(section, node: str | None = None):
    sel = '[data-table="peek-messages"] tbody tr'
    return section.locator(f'{sel}[data-node="{node}"]' if node else sel)


def row_of(section, body: bytes):
    """The row whose body (text view) is ``body``."""
    return rows(section).filter(has=section.page.locator("pre.body", has_text=body.decode()))


def tab(section, name: str):
    return section.get_by_role("tab", name=re.compile(f"^{name}"))


def confirm(page, verb: str, target: str) -> None:
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Are you sure you want to {verb} {target}?")
    dialog.locator("[data-confirm]").click()
    expect(page.get_by_role("dialog")).to_have_count(0)


def test_channel_peek_tabs_and_body_formats(browser, env):
    for i in (0, 1):
        env.nsqd_post(i, "/topic/create?topic=shop")
        env.nsqd_post(i, "/channel/create?topic=shop&channel=work")
    env.registered("shop", 2)
    n0, n1 = env.nsqd_http(0), env.nsqd_http(1)
    pub(env, 0, "shop", JSON_BODY)
    pub(env, 0, "shop", HTML_BODY)
    pub(env, 0, "shop", b"tomorrow", defer_ms=3_600_000)
    pub(env, 1, "shop", b"taken")
    pub(env, 1, "shop", b"\x00\x01\xfe plain")
    worker = env.subscribe(1, "shop", "work", client_id="picker-3")
    env.call(lambda: worker.send(commands.rdy(1)))
    [taken] = env.run(worker.wait_messages(1))

    page = open_page(browser, env, "/topics/shop/work")
    section = page.locator('[data-section="messages"]')
    expect(section.locator("[data-peek-body]")).to_contain_text("Nothing is consumed")
    section = peek(page)
    expect(section.get_by_role("button", name="Peek 10", exact=True)).to_have_attribute(
        "aria-pressed", "true"
    )
    summary = section.locator('[data-table="peek-nodes"]')
    expect(summary.locator(f'tr[data-node="{n0}"] [data-col="depth"]')).to_have_text("2")
    expect(summary.locator(f'tr[data-node="{n0}"] [data-col="deferred_count"]')).to_have_text("1")
    expect(summary.locator(f'tr[data-node="{n1}"] [data-col="in_flight_count"]')).to_have_text("1")

    # Queued: both nodes' rows, labelled by node, oldest first
    expect(tab(section, "Queued")).to_have_attribute("aria-selected", "true")
    expect(tab(section, "Queued").locator("[data-count]")).to_have_text("3")
    expect(rows(section, n0)).to_have_count(2)
    expect(rows(section, n1)).to_have_count(1)
    expect(rows(section, n0).first.locator('[data-col="node"]')).to_contain_text(n0.split(":")[1])
    first = nsqd_peek(env, 0, "shop", "work")["messages"][0]
    expect(rows(section, n0).first.locator('[data-col="id"]')).to_have_text(first["id"])
    expect(rows(section, n0).first.locator('[data-col="attempts"]')).to_have_text("0")
    expect(rows(section, n0).first.locator('[data-col="timestamp"] time')).to_have_text(
        re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$")
    )

    # an HTML-looking body is text: nothing parsed, nothing run
    html_row = row_of(section, HTML_BODY)
    expect(html_row.locator("pre.body")).to_have_text(HTML_BODY.decode())
    expect(section.locator('[data-table="peek-messages"] img')).to_have_count(0)
    expect(section.locator('[data-table="peek-messages"] script')).to_have_count(0)
    assert page.evaluate("window.__pwned") is None
    browser.shot(page, "messages-channel-queued")

    # JSON: pretty-printed where it parses, "not JSON" elsewhere
    section.get_by_role("button", name="JSON", exact=True).click()
    json_pre = rows(section, n0).first.locator('pre[data-body="json"]')
    expect(json_pre).to_have_text('{\n  "sku": "A1",\n  "qty": 2,\n  "tags": [\n    "red"\n  ]\n}')
    expect(rows(section, n0).nth(1).locator("[data-not-json]")).to_have_text("not JSON: shown as text")
    expect(rows(section, n0).nth(1).locator('pre[data-body="text"]')).to_have_text(HTML_BODY.decode())
    expect(rows(section, n1).locator("[data-not-json]")).to_be_visible()
    browser.shot(page, "messages-channel-json")

    # hex: a dump of the bytes
    section.get_by_role("button", name="Hex", exact=True).click()
    expect(section.get_by_role("button", name="Hex", exact=True)).to_have_attribute("aria-pressed", "true")
    expect(rows(section, n1).locator('pre[data-body="hex"]')).to_have_text(
        "00000000  00 01 fe 20 70 6c 61 69  6e                       |... plain|"
    )
    expect(rows(section, n0).first.locator('pre[data-body="hex"]')).to_contain_text("7b 22 73 6b 75 22")
    browser.shot(page, "messages-channel-hex")
    section.get_by_role("button", name="Text", exact=True).click()
    expect(rows(section, n1).locator('pre[data-body="text"]')).to_contain_text("\ufffd plain")

    # Deferred: the due time and, for an admin, Requeue and Remove
    tab(section, "Deferred").click()
    expect(tab(section, "Deferred")).to_have_attribute("aria-selected", "true")
    [deferred] = rows(section).all()
    expect(deferred).to_have_attribute("data-node", n0)
    expect(deferred.locator('[data-col="due"]')).to_have_text(re.compile(r"^in (59m|1h)"))
    expect(deferred.locator("pre.body")).to_have_text("tomorrow")
    expect(deferred.get_by_role("button", name=re.compile("^Requeue message"))).to_be_visible()
    expect(deferred.get_by_role("button", name=re.compile("^Remove message"))).to_be_visible()

    # In flight: the client and its timeout, no actions; the arrow keys move between tabs
    tab(section, "Deferred").press("ArrowRight")
    expect(tab(section, "In flight")).to_have_attribute("aria-selected", "true")
    [flying] = rows(section).all()
    expect(flying).to_have_attribute("data-node", n1)
    expect(flying.locator('[data-col="id"]')).to_have_text(taken.id.decode())
    expect(flying.locator('[data-col="client"]')).to_contain_text("picker-3")
    expect(flying.locator('[data-col="timeout"]')).to_have_text(re.compile(r"^in \d"))
    expect(flying.locator('[data-col="attempts"]')).to_have_text("1")
    expect(flying.locator("button")).to_have_count(0)
    browser.shot(page, "messages-channel-in-flight")

    # Peek 50 keeps the tab; nothing was consumed by any of it
    peek(page, 50)
    expect(section.get_by_role("button", name="Peek 50")).to_have_attribute("aria-pressed", "true")
    expect(tab(section, "In flight")).to_have_attribute("aria-selected", "true")
    assert env.channel_stats(0, "shop", "work")["depth"] == 2
    assert env.channel_stats(1, "shop", "work")["depth"] == 1
    browser.assert_no_errors()


def test_requeue_and_remove_as_admin(browser, env):
    for i in (0, 1):
        env.nsqd_post(i, "/topic/create?topic=fix")
        env.nsqd_post(i, "/channel/create?topic=fix&channel=c")
    env.registered("fix", 2)
    n0 = env.nsqd_http(0)
    pub(env, 0, "fix", b"first")
    pub(env, 0, "fix", b"second")
    pub(env, 0, "fix", b"parked", defer_ms=3_600_000)

    page = open_page(browser, env, "/topics/fix/c")
    section = peek(page)
    parked_id = nsqd_peek(env, 0, "fix", "c")["deferred"][0]["id"]

    # requeue the deferred one: confirmed, done on nsqd 0, the panel peeks again
    tab(section, "Deferred").click()
    rows(section).first.get_by_role("button", name=f"Requeue message {parked_id} on {n0}").click()
    confirm(page, "requeue", f"message {parked_id}")
    expect(section.locator("[data-peek-done]")).to_have_text(f"Requeued message {parked_id} on {n0}.")
    expect(tab(section, "Deferred").locator("[data-count]")).to_have_text("0")
    expect(section.locator("[data-peek-none]")).to_have_text("No deferred messages.")
    after = nsqd_peek(env, 0, "fix", "c")
    assert [m["body_preview"] for m in after["messages"]] == ["first", "second", "parked"]
    assert after["deferred"] == []
    # the page's tables follow
    node_row = page.locator(f'[data-table="channel-nodes"] tr[data-node="{n0}"]')
    expect(node_row.locator('[data-col="deferred_count"]')).to_have_text("0")
    expect(node_row.locator('[data-col="depth"]')).to_have_text("3")

    # remove one: a cancelled dialog changes nothing; a confirmed one removes it
    tab(section, "Queued").click()
    expect(tab(section, "Queued").locator("[data-count]")).to_have_text("3")
    second = row_of(section, b"second")
    second.get_by_role("button", name=re.compile("^Remove message")).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("never delivered")
    browser.shot(page, "messages-remove-confirm")
    dialog.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("dialog")).to_have_count(0)
    assert len(nsqd_peek(env, 0, "fix", "c")["messages"]) == 3
    second_id = second.get_attribute("data-id")
    second.get_by_role("button", name=re.compile("^Remove message")).click()
    confirm(page, "remove", f"message {second_id}")
    expect(section.locator("[data-peek-done]")).to_have_text(f"Removed message {second_id} on {n0}.")
    expect(rows(section)).to_have_count(2)
    assert [m["body_preview"] for m in nsqd_peek(env, 0, "fix", "c")["messages"]] == ["first", "parked"]
    expect(node_row.locator('[data-col="depth"]')).to_have_text("2")

    # a message gone meanwhile: the node's error is shown, and the panel peeks again
    first_id = row_of(section, b"first").get_attribute("data-id")
    status, text = http("POST", f"http://{n0}/channel/remove?topic=fix&channel=c&id={first_id}", b"")
    assert status == 200, text
    row_of(section, b"first").get_by_role("button", name=re.compile("^Remove message")).click()
    confirm(page, "remove", f"message {first_id}")
    errors = section.locator("[data-peek-errors]")
    expect(errors).to_contain_text("Not every nsqd could remove")
    expect(errors.locator(f'li[data-node="{n0}"]')).to_have_text(f"{n0}: MESSAGE_NOT_FOUND")
    expect(rows(section)).to_have_count(1)
    browser.shot(page, "messages-remove-error")
    browser.assert_no_errors()


def test_topic_backlog_and_redrive(browser, env):
    for i in (0, 1):
        env.nsqd_post(i, "/topic/create?topic=dlq")
        env.nsqd_post(i, "/topic/create?topic=orders2")
        env.nsqd_post(i, "/channel/create?topic=orders2&channel=work")
    env.publish(0, "dlq", 2, body=b"poison")
    env.publish(1, "dlq", 1, body=b'{"bad":true}')
    pub(env, 1, "dlq", b"held back", defer_ms=30_000)
    env.registered("dlq", 2)
    n0, n1 = env.nsqd_http(0), env.nsqd_http(1)

    page = open_page(browser, env, "/topics/dlq")
    section = peek(page, 100)
    # a topic has no in-flight tab, and no per-message actions
    expect(section.get_by_role("tab")).to_have_count(2)
    expect(rows(section, n0)).to_have_count(2)
    expect(rows(section, n1)).to_have_count(1)
    expect(section.locator('[data-table="peek-messages"] button')).to_have_count(0)
    tab(section, "Deferred").click()
    expect(rows(section, n1).locator('[data-col="due"]')).to_have_text("delay 30s")
    browser.shot(page, "messages-topic")

    # a channel no node has: each node's error, nothing moved
    form = section.locator('[data-form="redrive"]')
    form.get_by_label("Destination topic").fill("orders2")
    form.get_by_label("From channel").fill("nope")
    form.get_by_role("button", name="Redrive").click()
    confirm(page, "redrive", "dlq/nope → orders2")
    errors = section.locator("[data-peek-errors]")
    for node in (n0, n1):
        expect(errors.locator(f'li[data-node="{node}"]')).to_have_text(f"{node}: CHANNEL_NOT_FOUND")

    # the backlog, 2 at most: the nodes in turn
    form.get_by_label("From channel").fill("")
    form.get_by_label("How many").fill("2")
    browser.shot(page, "messages-redrive-form")
    form.get_by_role("button", name="Redrive").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(
        "Up to 2 messages queued in dlq (in all: the nsqd in turn) are published to orders2"
    )
    confirm(page, "redrive", "dlq → orders2")
    done = section.locator("[data-peek-done]")
    expect(done).to_contain_text("Moved 2 messages from dlq to orders2.")
    moved = sum(env.channel_stats(i, "orders2", "work")["depth"] for i in (0, 1))
    assert moved == 2

    # then everything (empty: all)
    form.get_by_label("How many").fill("")
    form.get_by_role("button", name="Redrive").click()
    confirm(page, "redrive", "dlq → orders2")
    expect(done).to_contain_text("Moved 2 messages from dlq to orders2.")
    expect(done.locator(f'li[data-node="{n1}"]')).to_contain_text("moved")
    wait_until(
        lambda: sum(env.channel_stats(i, "orders2", "work")["depth"] for i in (0, 1)) == 4,
        what="4 messages in orders2/work",
    )
    bodies = sorted(
        base64.b64decode(m["body_base64"])
        for i in (0, 1)
        for m in nsqd_peek(env, i, "orders2", "work")["messages"]
    )
    assert bodies == [b"held back", b"poison", b"poison", b'{"bad":true}']
    tab(section, "Queued").click()
    expect(tab(section, "Queued").locator("[data-count]")).to_have_text("0")
    browser.shot(page, "messages-redrive-done")
    browser.assert_no_errors()


def test_only_admins_see_messages(browser, env):
    """With --admin-user, bodies (which can be sensitive) and the actions are the admins';
    a visitor is told so, on the channel and on the topic page."""
    env.nsqd_post(0, "/topic/create?topic=ro")
    env.nsqd_post(1, "/topic/create?topic=ro")
    env.nsqd_post(0, "/channel/create?topic=ro&channel=c")  # on nsqd 0 only
    pub(env, 0, "ro", b"look")
    pub(env, 0, "ro", b"later", defer_ms=600_000)
    env.registered("ro", 2)
    n1 = env.nsqd_http(1)
    denied = "Only admin users may see the messages of a queue."
    for path in ("/topics/ro/c", "/topics/ro"):
        page = open_page(browser, env, path, admin="acl", user="visitor")
        section = page.locator('[data-section="messages"]')
        expect(section.locator("[data-peek-denied]")).to_have_text(denied)
        expect(section.locator("[data-peek]")).to_have_count(0)
        expect(page.locator('[data-form="redrive"]')).to_have_count(0)
        if path == "/topics/ro/c":
            browser.shot(page, "messages-not-admin")
        page.close()
    page = open_page(browser, env, "/topics/ro/c", admin="acl", user="boss")
    section = peek(page)
    expect(rows(section)).to_have_count(1)
    # the node without the channel says so
    expect(
        section.locator(f'[data-table="peek-nodes"] tr[data-node="{n1}"] [data-col="error"]')
    ).to_have_text("CHANNEL_NOT_FOUND")
    expect(section.locator('[data-action="remove"]')).to_have_count(1)
    tab(section, "Deferred").click()
    expect(rows(section)).to_have_count(1)
    expect(section.locator('[data-action="requeue"]')).to_have_count(1)
    page.goto(env.url("acl", "/topics/ro"))
    page.locator("main [data-page]").wait_for()
    expect(page.locator('[data-section="messages"]')).to_be_visible()
    expect(page.locator('[data-form="redrive"]')).to_have_count(1)
    page.close()
    browser.assert_no_errors()
