"""Queue settings in nsqadmin, clicked in headless Chromium: the Settings section of the
channel and topic pages shows each nsqd's settings; an admin's "Edit Settings" dialog sets
them on every nsqd that has the topic (checked on each nsqd's /channel/config and
/topic/config); a refused value keeps the dialog open with each node's error and changes
nothing; a node without the channel shows its own error while the other saves; the
counters appear as table columns and as lines of the live chart; non-admins get no button."""

from __future__ import annotations

import json

import pytest
from browser_helpers import Cluster, browser_fixture, expect, get_json, http, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("settings")).start()
    try:
        c.add_admin("main")
        c.add_admin("acl", admin_users=["boss"])
        yield c
    finally:
        c.stop()


def config_of(env, i: int, topic: str, channel: str = "") -> dict:
    if channel:
        return get_json(f"http://{env.nsqd_http(i)}/channel/config?topic={topic}&channel={channel}")
    return get_json(f"http://{env.nsqd_http(i)}/topic/config?topic={topic}")


def open_page(browser, env, path: str, admin: str = "main", user: str | None = None):
    page = browser.page(user)
    page.goto(env.url(admin, path))
    page.locator("main [data-page]").wait_for()
    return page


def settings_cell(page, node: str, key: str):
    return page.locator(f'[data-table="settings"] tr[data-node="{node}"] [data-col="{key}"]')


def test_channel_settings_dialog(browser, env):
    for i in (0, 1):
        env.nsqd_post(i, "/topic/create?topic=orders")
        env.nsqd_post(i, "/channel/create?topic=orders&channel=archive")
    env.registered("orders", 2)
    n0, n1 = env.nsqd_http(0), env.nsqd_http(1)

    page = open_page(browser, env, "/topics/orders/archive")
    section = page.locator('[data-section="settings"]')
    expect(section.locator('[data-table="settings"] tbody tr')).to_have_count(2)
    expect(section.locator("[data-settings-none]")).to_be_visible()
    expect(settings_cell(page, n0, "overflow")).to_have_text("reject")
    expect(settings_cell(page, n1, "max_age")).to_have_text("–")
    # no settings: the tables have Go's columns only
    expect(page.locator('[data-table="channel-nodes"] [data-col="dropped_count"]')).to_have_count(0)

    # a value nsqd refuses: the dialog stays open with each node's error, nothing changes
    page.get_by_role("button", name="Edit Settings").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Settings of orders/archive")
    dialog.get_by_label("Max attempts").fill("lots")
    dialog.get_by_role("button", name="Save").click()
    errors = dialog.locator("[data-settings-errors]")
    expect(errors).to_contain_text("Not every nsqd took the settings")
    for node in (n0, n1):
        expect(errors.locator(f'li[data-node="{node}"]')).to_contain_text('invalid max_attempts "lots"')
    assert config_of(env, 0, "orders", "archive")["max_attempts"] is None
    browser.shot(page, "settings-dialog-errors")
    dialog.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("dialog")).to_have_count(0)

    # set several keys at once: saved on both nsqd, shown in the section
    page.get_by_role("button", name="Edit Settings").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_label("Max depth").fill("2")
    dialog.get_by_label("Overflow").select_option("drop_oldest")
    dialog.get_by_label("Max age").fill("90s")
    dialog.get_by_label("Max attempts").fill("5")
    dialog.get_by_label("Dead-letter topic").fill("orders_dlq")
    dialog.get_by_label("Max rate").fill("2.5")
    browser.shot(page, "settings-dialog")
    dialog.get_by_role("button", name="Save").click()
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(page.locator('[data-alert="success"]')).to_have_text(
        "Saved the settings of orders/archive on 2 nsqd."
    )
    want = {
        "max_depth": 2,
        "max_bytes": None,
        "overflow": "drop_oldest",
        "max_age": "1m30s",
        "max_attempts": 5,
        "dead_letter_topic": "orders_dlq",
        "max_rate": 2.5,
    }
    assert config_of(env, 0, "orders", "archive") == want
    assert config_of(env, 1, "orders", "archive") == want
    expect(settings_cell(page, n0, "max_age")).to_have_text("1m30s")
    expect(settings_cell(page, n1, "dead_letter_topic")).to_have_text("orders_dlq")
    expect(settings_cell(page, n1, "max_rate")).to_have_text("2.5")
    expect(page.locator('[data-section="settings"] [data-settings-none]')).to_have_count(0)

    # the dialog starts from the settings; emptying a field unsets that key only
    page.get_by_role("button", name="Edit Settings").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_label("Max age")).to_have_value("1m30s")
    expect(dialog.get_by_label("Overflow")).to_have_value("drop_oldest")
    dialog.get_by_label("Max rate").fill("")
    dialog.get_by_role("button", name="Save").click()
    expect(page.get_by_role("dialog")).to_have_count(0)
    wait_until(
        lambda: config_of(env, 1, "orders", "archive") == {**want, "max_rate": None}, what="max_rate unset"
    )
    assert config_of(env, 0, "orders", "archive") == {**want, "max_rate": None}

    # the counters: 5 published on each nsqd, 3 of each dropped by max_depth 2
    env.publish(0, "orders", 5)
    env.publish(1, "orders", 5)
    page.reload()
    page.locator("main [data-page]").wait_for()
    total = page.locator('[data-table="channel-nodes"] tr[data-node="*"]')
    expect(total.locator('[data-col="dropped_count"]')).to_have_text("6")
    expect(total.locator('[data-col="expired_count"]')).to_have_text("0")
    expect(total.locator('[data-col="dead_letter_count"]')).to_have_text("0")
    expect(total.locator('[data-col="depth"]')).to_have_text("4")
    expect(page.get_by_role("columnheader", name="Dropped")).to_be_visible()
    # the live chart gets a line for them once the sampler has seen them
    expect(page.locator('[data-chart="rate"] .legend-name', has_text="dropped")).to_be_visible(timeout=15_000)
    browser.shot(page, "settings-channel-counters")

    # the topic page lists the channel's counters too
    page.goto(env.url("main", "/topics/orders"))
    page.locator("main [data-page]").wait_for()
    row = page.locator('[data-table="channels"] tr[data-channel="archive"]')
    expect(row.locator('[data-col="dropped_count"]')).to_have_text("6")
    browser.assert_no_errors()


def test_topic_settings_and_a_node_without_the_channel(browser, env):
    env.nsqd_post(0, "/topic/create?topic=audit")
    env.nsqd_post(1, "/topic/create?topic=audit")
    env.nsqd_post(0, "/channel/create?topic=audit&channel=only0")
    env.registered("audit", 2)
    # nsqd 1 creates the channels nsqlookupd knows of when it creates the topic (as Go's
    # does): if its query came after nsqd 0 registered only0, it has the channel too
    wait_until(
        lambda: "only0" in env.lookupd_get("/channels?topic=audit")["channels"],
        what="only0 in nsqlookupd",
    )
    if env.channel_stats(1, "audit", "only0") is not None:
        url = f"http://{env.nsqd_http(1)}/channel/delete?topic=audit&channel=only0"
        status, text = http("POST", url, b"")
        assert status in (200, 404), text
    n0, n1 = env.nsqd_http(0), env.nsqd_http(1)

    page = open_page(browser, env, "/topics/audit")
    page.get_by_role("button", name="Edit Settings").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Settings of audit")
    expect(dialog.get_by_label("Max attempts")).to_have_count(0)  # a channel's key
    dialog.get_by_label("Max bytes").fill("1048576")
    dialog.get_by_role("button", name="Save").click()
    expect(page.get_by_role("dialog")).to_have_count(0)
    for i in (0, 1):
        assert config_of(env, i, "audit")["max_bytes"] == 1048576
    expect(settings_cell(page, n0, "max_bytes")).to_have_text("1,048,576")

    # the channel is on one nsqd: that one saves, the other's error is shown for it
    page.goto(env.url("main", "/topics/audit/only0"))
    page.locator("main [data-page]").wait_for()
    expect(settings_cell(page, n1, "error")).to_have_text('unknown channel "audit:only0"')
    page.get_by_role("button", name="Edit Settings").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_label("Max age").fill("1h")
    dialog.get_by_role("button", name="Save").click()
    errors = dialog.locator("[data-settings-errors]")
    expect(errors.locator(f'li[data-node="{n1}"]')).to_contain_text('unknown channel "audit:only0"')
    expect(errors.locator(f'li[data-node="{n0}"]')).to_contain_text("saved")
    assert config_of(env, 0, "audit", "only0")["max_age"] == "1h0m0s"
    browser.assert_no_errors()


def test_non_admins_see_settings_but_cannot_edit(browser, env):
    env.nsqd_post(0, "/topic/create?topic=viewonly")
    env.nsqd_post(0, "/channel/create?topic=viewonly&channel=c")
    status, body = http(
        "POST",
        f"http://{env.nsqd_http(0)}/channel/config?topic=viewonly&channel=c",
        json.dumps({"max_age": "10m"}).encode(),
    )
    assert status == 200, body
    env.registered("viewonly", 1)
    for user, can_edit in (("visitor", False), ("boss", True)):
        page = open_page(browser, env, "/topics/viewonly/c", admin="acl", user=user)
        expect(settings_cell(page, env.nsqd_http(0), "max_age")).to_have_text("10m0s")
        expect(page.get_by_role("button", name="Edit Settings")).to_have_count(1 if can_edit else 0)
        page.close()
    browser.assert_no_errors()
