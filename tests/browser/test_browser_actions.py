"""Every nsqadmin action clicked in headless Chromium, confirmed in its dialog, and checked on
nsqd and nsqlookupd: pause/unpause, empty and delete a topic or a channel, tombstone a
topic's producer (Topic and Node pages), create and delete topics/channels (Lookup); a
cancelled dialog changes nothing; an API error is shown on the page."""

from __future__ import annotations

import re

import pytest
from browser_helpers import Cluster, browser_fixture, expect, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("actions")).start()
    try:
        c.add_admin("main")
        yield c
    finally:
        c.stop()


def topic_on_both(env, topic: str, n: int, channel: str = "") -> None:
    """``topic`` on both nsqd with ``n`` messages each (in ``channel`` if given)."""
    for i in (0, 1):
        env.nsqd_post(i, f"/topic/create?topic={topic}")
        if channel:
            env.nsqd_post(i, f"/channel/create?topic={topic}&channel={channel}")
        env.publish(i, topic, n)
    env.registered(topic, 2)


def confirm(page, button_name: str | re.Pattern, verb: str) -> None:
    """Click an action button and confirm its dialog."""
    page.get_by_role("button", name=button_name).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Are you sure you want to {verb}")
    dialog.locator("[data-confirm]").click()
    expect(dialog).to_have_count(0)


def open_page(browser, env, path: str):
    page = browser.page()
    page.goto(env.url("main", path))
    page.locator("main [data-page]").wait_for()
    return page


def test_topic_pause_unpause_empty_delete(browser, env):
    topic_on_both(env, "t1", 3)
    page = open_page(browser, env, "/topics/t1")
    total = page.locator('[data-table="topic-nodes"] tr[data-node="*"] [data-col="depth"]')
    expect(total).to_have_text("6")

    confirm(page, "Pause Topic", "pause")
    wait_until(lambda: all(env.topic_stats(i, "t1")["paused"] for i in (0, 1)), what="t1 paused")
    expect(page.get_by_role("button", name="UnPause Topic")).to_be_visible()
    expect(page.locator("h1 [data-paused]")).to_have_count(1)
    expect(page.locator('[data-table="topic-nodes"] tbody [data-paused]')).to_have_count(2)
    expect(page.locator('[data-alert="success"]')).to_have_text("Paused topic t1.")
    browser.shot(page, "action-topic-paused")

    confirm(page, "UnPause Topic", "unpause")
    wait_until(lambda: not any(env.topic_stats(i, "t1")["paused"] for i in (0, 1)), what="t1 unpaused")
    expect(page.get_by_role("button", name="Pause Topic")).to_be_visible()
    expect(page.locator("h1 [data-paused]")).to_have_count(0)

    confirm(page, "Empty Queue", "empty")
    wait_until(lambda: all(env.topic_stats(i, "t1")["depth"] == 0 for i in (0, 1)), what="t1 emptied")
    expect(total).to_have_text("0")

    confirm(page, "Delete Topic", "delete")
    expect(page).to_have_url(env.url("main", "/"))
    wait_until(lambda: all(env.topic_stats(i, "t1") is None for i in (0, 1)), what="t1 deleted on nsqd")
    wait_until(lambda: "t1" not in env.lookupd_get("/topics")["topics"], what="t1 deleted in nsqlookupd")
    expect(page.locator('tr[data-topic="t1"]')).to_have_count(0)
    browser.assert_no_errors()


def test_channel_pause_unpause_empty_delete(browser, env):
    topic_on_both(env, "t2", 4, channel="c")
    page = open_page(browser, env, "/topics/t2/c")
    total = page.locator('[data-table="channel-nodes"] tr[data-node="*"] [data-col="depth"]')
    expect(total).to_have_text("8")

    confirm(page, "Pause Channel", "pause")
    wait_until(lambda: all(env.channel_stats(i, "t2", "c")["paused"] for i in (0, 1)), what="c paused")
    expect(page.get_by_role("button", name="UnPause Channel")).to_be_visible()
    expect(page.locator('[data-table="channel-nodes"] tbody [data-paused]')).to_have_count(2)
    browser.shot(page, "action-channel-paused")

    confirm(page, "UnPause Channel", "unpause")
    wait_until(lambda: not any(env.channel_stats(i, "t2", "c")["paused"] for i in (0, 1)), what="c unpaused")
    expect(page.get_by_role("button", name="Pause Channel")).to_be_visible()

    confirm(page, "Empty Queue", "empty")
    wait_until(lambda: all(env.channel_stats(i, "t2", "c")["depth"] == 0 for i in (0, 1)), what="c emptied")
    expect(total).to_have_text("0")

    confirm(page, "Delete Channel", "delete")
    expect(page).to_have_url(env.url("main", "/topics/t2"))
    wait_until(lambda: all(env.channel_stats(i, "t2", "c") is None for i in (0, 1)), what="c deleted")
    wait_until(
        lambda: "c" not in env.lookupd_get("/channels?topic=t2")["channels"], what="c gone from nsqlookupd"
    )
    expect(page.locator("[data-notice]")).to_contain_text("No channels exist for this topic")
    browser.assert_no_errors()


def _producers(env, topic: str) -> list[int]:
    """The HTTP ports nsqlookupd lists as producers of ``topic``."""
    return sorted(p["http_port"] for p in env.lookupd_get(f"/lookup?topic={topic}")["producers"])


def _tombstoned(env, topic: str, i: int) -> bool:
    """As Go's nsqadmin does it: nsqlookupd no longer lists nsqd ``i`` as a producer of
    ``topic``, and that nsqd deleted it; the other nsqd keeps it."""
    other = 1 - i
    return (
        env.topic_stats(i, topic) is None
        and env.topic_stats(other, topic) is not None
        and _producers(env, topic) == [env.nsqds[other].http_port]
    )


def test_tombstone_from_topic_page(browser, env):
    topic_on_both(env, "t3", 1)
    node = env.nsqd_http(0)
    page = open_page(browser, env, "/topics/t3")
    confirm(page, f"Tombstone {node} for topic t3", "tombstone")
    wait_until(lambda: _tombstoned(env, "t3", 0), what="t3 tombstoned for nsqd 0")
    expect(page.locator('[data-alert="success"]')).to_have_text(f"Tombstoned {node} for t3.")
    node_rows = page.locator('[data-table="topic-nodes"] tbody tr[data-node]:not([data-node="*"])')
    expect(node_rows).to_have_count(1)
    # the Nodes page no longer lists the topic on that node
    page.goto(env.url("main", "/nodes"))
    expect(page.locator(f'tr[data-node="{node}"] [data-topic="t3"]')).to_have_count(0)
    expect(page.locator(f'tr[data-node="{env.nsqd_http(1)}"] [data-topic="t3"]')).to_have_count(1)
    # a tombstone nsqlookupd still holds (here set on it directly) is marked on the Nodes page
    other = env.nsqd_http(1)
    env.lookupd_post(f"/topic/tombstone?topic=t3&node={other}")
    page.reload()
    label = page.locator(f'tr[data-node="{other}"] [data-topic="t3"]')
    expect(label).to_have_attribute("data-tombstoned", "")
    expect(label).to_have_attribute("title", "this topic is currently tombstoned on this node")
    browser.shot(page, "action-nodes-tombstoned")
    browser.assert_no_errors()


def test_tombstone_from_node_page(browser, env):
    topic_on_both(env, "t5", 1)
    node = env.nsqd_http(1)
    page = open_page(browser, env, f"/nodes/{node}")
    confirm(page, f"Tombstone topic t5 on {node}", "tombstone")
    wait_until(lambda: _tombstoned(env, "t5", 1), what="t5 tombstoned for nsqd 1")
    expect(page.locator('section[data-topic="t5"]')).to_have_count(0)
    browser.assert_no_errors()


def test_cancelled_dialog_changes_nothing(browser, env):
    topic_on_both(env, "t4", 2)
    page = open_page(browser, env, "/topics/t4")
    page.get_by_role("button", name="Delete Topic").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Are you sure you want to delete t4?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    page.get_by_role("button", name="Pause Topic").click()
    expect(page.get_by_role("dialog")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(page).to_have_url(env.url("main", "/topics/t4"))
    # nothing was sent: the topic is still there, not paused, and the page did not change
    for i in (0, 1):
        t = env.topic_stats(i, "t4")
        assert t is not None and t["paused"] is False
    expect(page.get_by_role("button", name="Pause Topic")).to_be_visible()
    browser.assert_no_errors()


def test_lookup_create_and_delete(browser, env):
    page = open_page(browser, env, "/lookup")
    page.get_by_label("Topic name").fill("fresh")
    page.get_by_label("Channel name").fill("ch")
    page.get_by_role("button", name="Create").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Are you sure you want to create fresh/ch?")
    dialog.locator("[data-confirm]").click()
    wait_until(lambda: "fresh" in env.lookupd_get("/topics")["topics"], what="fresh in nsqlookupd")
    assert env.lookupd_get("/channels?topic=fresh")["channels"] == ["ch"]
    tree = page.locator('[data-tree="inactive"] > li[data-topic="fresh"]')
    expect(tree.locator('li[data-channel="ch"]')).to_have_count(1)
    expect(page.locator('[data-alert="success"]')).to_contain_text("Created topic fresh and channel ch")
    browser.shot(page, "action-lookup-created")

    confirm(page, "Delete channel fresh/ch", "delete")
    wait_until(lambda: env.lookupd_get("/channels?topic=fresh")["channels"] == [], what="ch deleted")
    expect(tree.locator('li[data-channel="ch"]')).to_have_count(0)
    confirm(page, "Delete topic fresh", "delete")
    wait_until(lambda: "fresh" not in env.lookupd_get("/topics")["topics"], what="fresh deleted")
    expect(page.locator('[data-tree="inactive"] li[data-topic="fresh"]')).to_have_count(0)
    browser.assert_no_errors()


def test_action_error_is_shown(browser, env):
    """A refused action shows nsqadmin's message (here 400 INVALID_TOPIC) on the page."""
    page = open_page(browser, env, "/lookup")
    page.get_by_label("Topic name").fill("no spaces allowed")
    page.get_by_role("button", name="Create").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    expect(page.locator('[data-alert="error"]')).to_have_text("INVALID_TOPIC")
    expect(page.get_by_role("alert")).to_be_visible()
    assert "no spaces allowed" not in env.lookupd_get("/topics")["topics"]
    browser.shot(page, "action-error")
    browser.assert_no_errors()
