"""Deploy a model in one click, chat with it in the Playground, and see the request's figures."""

import re

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.services import Actor, create_workspace
from cluster import inventory
from cluster.services import register_node
from serving.presets import SMOLLM2, register_presets
from tests.conftest import WORKER_NODE, stop_engines_and_flush
from tests.e2e.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.worker]


@pytest.fixture
def platform(celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        register_node(name=WORKER_NODE, resources=inventory.probe())
        register_presets(lambda line: None)
        ann = get_user_model().objects.create_user(username="ann", password="correct-horse-battery")
        create_workspace(actor=Actor(user=ann), name="Acme")
        yield web_server
        stop_engines_and_flush()


def test_deploy_chat_in_the_playground_and_see_the_metrics(platform, open_page):
    page = open_page(platform)
    sign_in(page)

    page.get_by_role("link", name="Models & Serving").click()
    page.locator(f"tr[data-model='{SMOLLM2}']").get_by_role("button", name="Deploy").click()
    expect(page.get_by_role("heading", name=re.compile(SMOLLM2))).to_be_visible()
    expect(page.locator("#deployment-state")).to_have_text("ready", timeout=90_000)

    page.get_by_role("link", name="Open in Playground").click()
    expect(page.get_by_label("Deployment")).to_have_value(SMOLLM2)
    page.get_by_label("Message").fill("Name a colour.")
    page.get_by_label("Max tokens").fill("16")
    page.get_by_role("button", name="Send").click()

    expect(page.locator("#pg-answer")).not_to_be_empty(timeout=30_000)
    figures = page.locator("#pg-figures")
    expect(figures).to_be_visible(timeout=15_000)
    assert float(figures.locator("[data-figure='ttft_ms']").inner_text()) > 0
    assert int(figures.locator("[data-figure='output_tokens']").inner_text()) > 0

    page.goto(f"/serving/deployments/{SMOLLM2}/")
    row = page.locator("table.requests tbody tr").first
    expect(row).to_contain_text("chat/completions (stream)")
    expect(row).to_contain_text("200")
    expect(page.locator("#overall")).to_contain_text("1 requests, 0 errors")
    # The replica's own llama-server reports its slots and KV cache, polled every 2 s.
    replica = page.locator("tr[data-replica]").first
    expect(replica.locator("[data-field='slots']")).to_have_text(re.compile(r"^0 / [1-9]\d*$"), timeout=10_000)
    expect(replica.locator("[data-field='kv_cache']")).to_contain_text("0.0% of")
