"""What nsqadmin's pages show when the cluster answers badly, in headless Chromium: the
partial-failure ``WARNING: …`` beside the data of the nodes that answered (after a read and
after an action), 502 ``UPSTREAM_ERROR`` when nothing answers, 404 for an unknown node."""

from __future__ import annotations

import pytest
from browser_helpers import (  # noqa: F401
    Cluster,
    browser_fixture,
    expect,
    wait_until,
)
from support import FakeNsqd, closed_port

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("errors")).start()
    ghost = None
    try:
        c.nsqd_post(0, "/topic/create?topic=haunted")
        c.nsqd_post(0, "/channel/create?topic=haunted&channel=c")
        c.publish(0, "haunted", 2)
        assert c.lookupd is not None
        ghost = c.run(FakeNsqd.register(c.lookupd.tcp_port, closed_port(), "haunted"))
        c.registered("haunted", 2)
        c.add_admin("main")
        c.add_admin("broken", nsqlookupd_http_addresses=[f"127.0.0.1:{closed_port()}"])
        yield c
    finally:
        if ghost is not None:
            c.run(ghost.close())
        c.stop()


def test_partial_failure_warning(browser, env):
    page = browser.page()
    page.goto(env.url("main", "/topics/haunted"))
    warning = page.locator('[data-alert="warning"]')
    expect(warning).to_contain_text("WARNING:")
    expect(warning).to_have_attribute("role", "status")
    # what the live nsqd said is shown
    expect(page.locator(f'[data-table="topic-nodes"] tr[data-node="{env.nsqd_http(0)}"]')).to_have_count(1)
    expect(page.locator('[data-table="topic-nodes"] tr[data-node="*"] [data-col="depth"]')).to_have_text("0")
    expect(page.locator('[data-table="channels"] tr[data-channel="c"] [data-col="depth"]')).to_have_text("2")
    browser.shot(page, "error-partial-warning")

    # an action that reaches only part of the cluster: done where it could, the warning shown
    page.get_by_role("button", name="Pause Topic").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    wait_until(lambda: env.topic_stats(0, "haunted")["paused"], what="haunted paused on nsqd 0")
    expect(page.get_by_role("button", name="UnPause Topic")).to_be_visible()
    expect(page.locator('[data-alert="warning"]')).to_contain_text("WARNING:")
    browser.assert_no_errors()


def test_upstream_error(browser, env):
    page = browser.page()
    for path in ("/", "/nodes", "/topics/anything", "/counter"):
        page.goto(env.url("broken", path))
        error = page.locator('main [data-alert="error"]')
        expect(error).to_contain_text("UPSTREAM_ERROR:")
        expect(error).to_have_attribute("role", "alert")
    browser.shot(page, "error-upstream")
    browser.assert_no_errors()


def test_unknown_node(browser, env):
    page = browser.page()
    page.goto(env.url("main", "/nodes/127.0.0.1:1"))
    expect(page.locator('main [data-alert="error"]')).to_have_text("NODE_NOT_FOUND")
    browser.assert_no_errors()
