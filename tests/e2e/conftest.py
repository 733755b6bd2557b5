import os

import pytest

CHROMIUM = "/usr/bin/chromium"
# Without these, Chromium keeps trying to reach Google's services, which this offline appliance cannot.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def open_page():
    """Opens pages in Debian's Chromium, driven by Playwright (never a downloaded browser)."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing; `make test` installs Debian's chromium package.")
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are still synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)

        def open_at(base_url: str):
            page = browser.new_page(base_url=base_url)
            page.set_default_timeout(15_000)
            return page

        yield open_at
        browser.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def browser_page(live_server, open_page):
    return open_page(live_server.url)


def sign_in(page, username="ann", password="correct-horse-battery"):
    page.goto("/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
