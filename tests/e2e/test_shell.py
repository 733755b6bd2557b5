import re

import pytest
from playwright.sync_api import expect

from cluster import inventory
from cluster.services import register_node
from tests.e2e.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_sign_in_see_the_pool_and_create_an_api_key(browser_page, make_workspace):
    make_workspace("Acme", owner="ann")
    register_node(name="local-box", resources=inventory.probe())
    page = browser_page

    sign_in(page, password="wrong")
    expect(page.get_by_role("alert")).to_have_text("Wrong username or password.")
    sign_in(page)

    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.locator("tr[data-node='local-box']")).to_contain_text("healthy")
    expect(page.get_by_label("Workspace")).to_contain_text("Acme")
    for section in ["RAG Studio", "Agent Studio", "Work Bridge", "Models & Serving", "Apps", "Cluster", "Settings"]:
        expect(page.get_by_role("navigation", name="Main").get_by_role("link", name=section)).to_be_visible()

    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Name").fill("intranet-bot")
    page.get_by_role("button", name="Create key").click()

    secret = page.get_by_label("New API key").input_value()
    assert re.fullmatch(r"afk_[0-9a-f]{12}\.[\w-]+", secret)
    row = page.locator("tr[data-key='intranet-bot']")
    expect(row).to_contain_text("active")
    expect(row).to_contain_text(f"afk_{secret[4:16]}")

    page.reload()
    expect(page.locator("tr[data-key='intranet-bot']")).to_be_visible()
    expect(page.get_by_label("New API key")).to_have_count(0)

    page.locator("tr[data-key='intranet-bot']").get_by_role("button", name="Revoke").click()
    expect(page.locator("tr[data-key='intranet-bot']")).to_contain_text("revoked")
