"""nsqadmin's login (``--htpasswd-file``, an nsqpy addition) in headless Chromium: a page
opened without a session goes to the login form and back after it; a wrong password is
said; signing out ends the session; a read-only user (not an ``--admin-user``) sees no
action anywhere; an admin acts; an action without the session's CSRF token is refused and
the page says so; a session ended on the server sends the page to the login; failed logins
from one address are slowed down (the form says for how long)."""

from __future__ import annotations

import re

import pytest
from browser_helpers import Cluster, browser_fixture, expect, wait_until  # noqa: F401
from support import write_htpasswd

pytestmark = pytest.mark.timeout(120)

USERS = {"ann": "ann-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("login")
    c = Cluster(tmp).start()
    try:
        for i in (0, 1):
            c.nsqd_post(i, "/topic/create?topic=orders")
            c.nsqd_post(i, "/channel/create?topic=orders&channel=work")
            c.publish(i, "orders", 3)
        c.registered("orders", 2)
        pw = write_htpasswd(tmp / "htpasswd", USERS)
        c.add_admin("login", htpasswd_file=pw, admin_users=["ann"])
        # its own failed-login counts: the slow-down test does not lock the others out
        c.add_admin("slow", htpasswd_file=pw)
        yield c
    finally:
        c.stop()


@pytest.fixture
def browser_page(browser):
    """A tab with no session (the cookies of earlier tests cleared)."""
    browser.context.clear_cookies()
    page = browser.page()
    yield page
    page.close()
    browser.context.clear_cookies()


def sign_in(page, user: str, password: str) -> None:
    form = page.locator('form[data-form="login"]')
    form.get_by_label("User").fill(user)
    form.get_by_label("Password").fill(password)
    form.get_by_role("button", name="Sign in").click()


def login_as(env, page, user: str, path: str = "/topics/orders") -> None:
    page.goto(env.url("login", path))
    sign_in(page, user, USERS[user])
    expect(page).to_have_url(env.url("login", path))
    page.locator("main [data-page]").wait_for()


def test_login_wrong_password_and_logout(browser, browser_page, env):
    page = browser_page
    page.goto(env.url("login", "/topics/orders"))
    expect(page).to_have_url(env.url("login", "/login?next=/topics/orders"))
    expect(page.get_by_role("heading", name="Sign in to nsqadmin")).to_be_visible()
    expect(page.get_by_label("User")).to_be_focused()
    browser.shot(page, "login-page")

    sign_in(page, "ann", "not-her-password")
    expect(page.locator('[data-alert="error"]')).to_have_text("Wrong user name or password.")
    expect(page.get_by_label("User")).to_have_value("ann")
    expect(page.get_by_label("Password")).to_be_focused()
    browser.shot(page, "login-wrong-password")

    sign_in(page, "ann", "ann-secret")
    expect(page).to_have_url(env.url("login", "/topics/orders"))
    expect(page.locator("h1")).to_contain_text("orders")
    expect(page.locator("[data-user]")).to_have_text("ann")
    expect(page.locator("[data-readonly]")).to_have_count(0)
    # the cookie the page cannot read
    [cookie] = [c for c in browser.context.cookies() if c["name"] == "nsqadmin_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    assert page.evaluate("document.cookie") == ""
    browser.shot(page, "login-signed-in")

    # the login page sends a signed-in user on
    page.goto(env.url("login", "/login?next=/nodes"))
    expect(page).to_have_url(env.url("login", "/nodes"))

    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(env.url("login", "/login?signed_out=1"))
    expect(page.locator('[data-alert="success"]')).to_have_text("You have signed out.")
    browser.shot(page, "login-signed-out")
    assert not [c for c in browser.context.cookies() if c["name"] == "nsqadmin_session"]
    page.goto(env.url("login", "/nodes"))
    expect(page).to_have_url(env.url("login", "/login?next=/nodes"))
    browser.assert_no_errors()


def test_read_only_user_sees_no_action(browser, browser_page, env):
    page = browser_page
    login_as(env, page, "bob", "/")
    node = env.nsqd_http(0)
    for path, name in [
        ("/", "streams"),
        ("/topics/orders", "topic"),
        ("/topics/orders/work", "channel"),
        (f"/nodes/{node}", "node"),
        ("/lookup", "lookup"),
    ]:
        page.goto(env.url("login", path))
        expect(page.locator(f'main [data-page="{name}"]')).to_have_count(1)
        expect(page.locator("[data-user]")).to_have_text("bob")
        expect(page.locator("[data-readonly]")).to_have_text("read-only")
        expect(page.locator("[data-action]")).to_have_count(0)
        expect(page.locator(".btn-cross")).to_have_count(0)
        expect(page.locator('form[data-form="create"]')).to_have_count(0)
        if name in ("topic", "lookup"):
            browser.shot(page, f"login-read-only-{name}")
    # the data is there
    page.goto(env.url("login", "/topics/orders"))
    depth = page.locator('[data-table="channels"] tr[data-channel="work"] [data-col="depth"]')
    expect(depth).to_have_text("6")
    browser.assert_no_errors()


def test_admin_acts(browser, browser_page, env):
    page = browser_page
    login_as(env, page, "ann", "/topics/orders/work")
    page.get_by_role("button", name="Pause Channel").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    wait_until(
        lambda: all(env.channel_stats(i, "orders", "work")["paused"] for i in (0, 1)),
        what="orders/work paused by ann",
    )
    expect(page.get_by_role("button", name="UnPause Channel")).to_be_visible()
    browser.shot(page, "login-admin-paused")
    page.get_by_role("button", name="UnPause Channel").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    wait_until(
        lambda: not any(env.channel_stats(i, "orders", "work")["paused"] for i in (0, 1)),
        what="orders/work unpaused",
    )
    browser.assert_no_errors()


def test_csrf_refusal_shown(browser, browser_page, env):
    page = browser_page
    login_as(env, page, "ann")

    def strip_token(route):
        headers = {k: v for k, v in route.request.headers.items() if k.lower() != "x-csrf-token"}
        route.continue_(headers=headers)

    page.route(re.compile(r"/api/topics/orders$"), strip_token)
    page.get_by_role("button", name="Pause Topic").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    error = page.locator('[data-alert="error"]')
    expect(error).to_contain_text("INVALID_CSRF_TOKEN")
    expect(error).to_contain_text("Reload the page and try again.")
    browser.shot(page, "login-csrf-refused")
    assert not any(env.topic_stats(i, "orders")["paused"] for i in (0, 1))
    # the page's own requests carry it
    page.unroute(re.compile(r"/api/topics/orders$"))
    page.reload()
    page.get_by_role("button", name="Pause Topic").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    wait_until(lambda: all(env.topic_stats(i, "orders")["paused"] for i in (0, 1)), what="orders paused")
    page.get_by_role("button", name="UnPause Topic").click()
    page.get_by_role("dialog").locator("[data-confirm]").click()
    wait_until(lambda: not any(env.topic_stats(i, "orders")["paused"] for i in (0, 1)), what="unpaused")
    browser.assert_no_errors()


def test_ended_session_goes_to_login(browser, browser_page, env):
    page = browser_page
    login_as(env, page, "ann")
    login = env.admins["login"].login
    env.call(login.sessions.clear)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Nodes").click()
    expect(page).to_have_url(env.url("login", "/login?next=%2Fnodes"))
    sign_in(page, "ann", "ann-secret")
    expect(page).to_have_url(env.url("login", "/nodes"))
    expect(page.locator('main [data-page="nodes"]')).to_have_count(1)
    browser.assert_no_errors()


def test_failed_logins_slowed_down(browser, browser_page, env):
    page = browser_page
    page.goto(env.url("slow", "/"))
    expect(page).to_have_url(env.url("slow", "/login?next=/"))
    for i in range(5):
        sign_in(page, "bob", f"guess-{i}")
        expect(page.locator('[data-alert="error"]')).to_have_text("Wrong user name or password.")
    # the right password now waits too
    sign_in(page, "bob", "bob-secret")
    alert = page.locator('[data-alert="error"]')
    expect(alert).to_have_text(
        re.compile(r"^Too many failed sign-ins from your address: try again in \d+ s\.$")
    )
    seconds = int(re.search(r"in (\d+) s", alert.inner_text())[1])
    assert 1 <= seconds <= 60
    expect(page.locator("main [data-page]")).to_have_count(0)
    browser.shot(page, "login-slowed-down")
    browser.assert_no_errors()
