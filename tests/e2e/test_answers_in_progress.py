"""Answers that show they are coming, in Chromium with SmolLM2: the RAG chat shows an indicator at once and a Stop
button that ends the stream; the Playground sends its sampling settings and the whole conversation, turn after
turn, until "New chat". Stop, in the RAG chat, the Playground and an app's web chat, keeps what was written and
frees the engine's slot (tests/runtime/test_hang_up_frees_the_engine.py measures each server path)."""

import re

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.services import Actor, create_workspace
from rag_studio import services as rag_services
from rag_studio.models import DocumentStatus, RagConfig
from runtime import services as runtime_services
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush, wait_for
from tests.e2e.conftest import sign_in
from tests.rag_studio.conftest import SAMPLE_FILES, sample
from tests.runtime.test_hang_up_frees_the_engine import COUNTING, busy_slots

pytestmark = [pytest.mark.browser, pytest.mark.worker]


@pytest.fixture(scope="module")
def platform(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        ann = Actor(user=get_user_model().objects.create_user(username="ann", password="correct-horse-battery"))
        workspace = create_workspace(actor=ann, name="Acme")
        kb = rag_services.create_knowledge_base(actor=ann, workspace=workspace, name="Northwind")
        rag_services.upload_documents(actor=ann, kb=kb, uploads=[sample(n) for n in SAMPLE_FILES])
        wait_for(lambda: kb.documents.filter(status=DocumentStatus.INDEXED).count() == 3, timeout=120,
                 what="the worker to index the samples")
        # A long answer, so that there is time to stop it.
        rag_services.save_rag_config(actor=ann, workspace=workspace, name="Handbook", knowledge_base=kb,
                                     template="citations", model=SMOLLM2, generation={"max_tokens": 400})
        # An app whose answers go on and on, so that only Stop ends them early.
        counter = rag_services.save_rag_config(
            actor=ann, workspace=workspace, name="Counter", knowledge_base=kb, template="basic", model=SMOLLM2,
            prompt="{context}\n\n" + COUNTING + " {question}", generation={"temperature": 0, "max_tokens": 2000})
        runtime_services.publish_app(actor=ann, config=counter, slug="counter")
        yield web_server
        stop_engines_and_flush(keep=SMOLLM2)


@pytest.mark.timeout(900)  # indexing and SmolLM2 answers on a shared 2-core machine
def test_the_playground_chats_over_several_turns_with_its_sampling_settings(platform, open_page, live_db):
    page = open_page(platform)
    page.set_default_timeout(60_000)
    sign_in(page)
    page.goto(f"/serving/playground/?deployment={SMOLLM2}")
    page.get_by_label("Temperature").fill("0.2")
    page.get_by_label("Top-p").fill("0.9")
    page.get_by_label("Max tokens").fill("12")

    def send(message: str) -> dict:
        page.get_by_label("Message").fill(message)
        with page.expect_request("**/playground/chat") as sent:
            page.get_by_role("button", name="Send").click()
        expect(page.locator("#pg-figures")).to_be_visible(timeout=120_000)
        return sent.value.post_data_json

    first = send("My name is Ada.")
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (0.2, 0.9, 12)
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    first_answer = page.locator("#pg-answer").inner_text()
    assert first_answer

    second = send("What is my name?")
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == first_answer
    log = page.locator("#pg-log .turn")
    expect(log).to_have_count(3)  # Ada, the first answer, the second question; the second answer below them
    expect(page.locator("#pg-turns")).to_contain_text("2 earlier turns")  # both exchanges go with the next

    page.get_by_role("button", name="New chat").click()
    expect(log).to_have_count(0)
    third = send("Hello.")
    assert [m["role"] for m in third["messages"]] == ["system", "user"]


def _engine_freed() -> None:
    # The browser's Stop reaches the engine: its slot frees. How fast is bounded (5 s, per path) by
    # tests/runtime/test_hang_up_frees_the_engine.py; here, with a browser on 2 cores too, it once took longer.
    wait_for(lambda: busy_slots() == 0, timeout=20, interval=0.1, what="the engine's slot to be freed after Stop")


@pytest.mark.timeout(900)
def test_the_rag_chat_shows_it_is_working_and_stops_on_request(platform, open_page, live_db):
    page = open_page(platform)
    sign_in(page)
    page.goto(f"/rag/configs/{RagConfig.objects.get(name='Handbook').pk}/")
    page.get_by_placeholder("Ask your documents…").fill("Describe every policy in the handbook in detail.")
    page.get_by_role("button", name="Send").click()

    answer = page.locator(".turn.assistant").last
    expect(answer.get_by_role("status")).to_be_visible(timeout=2_000)  # at once, before any token
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_visible()
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    # The sources came: the stream is live and the model is at work (its first words may take a while on 2 cores).
    expect(answer.get_by_role("status")).to_have_text(re.compile("Writing the answer"), timeout=60_000)
    expect(page.locator("#chat-sources li").first).to_be_visible()
    stop.click()

    expect(answer).to_have_attribute("data-stopped", "1")
    expect(answer).to_contain_text("(stopped)")
    expect(stop).to_be_hidden()
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    _engine_freed()
    stopped_text = answer.inner_text()
    page.wait_for_timeout(1_500)
    assert answer.inner_text() == stopped_text, "the answer kept growing after Stop"


@pytest.mark.timeout(900)
def test_stop_in_the_playground_keeps_the_answer_so_far_and_frees_the_engine(platform, open_page, live_db):
    page = open_page(platform)
    sign_in(page)
    page.goto(f"/serving/playground/?deployment={SMOLLM2}")
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("2000")
    page.get_by_label("Message").fill(COUNTING)
    page.get_by_role("button", name="Send").click()

    answer = page.locator("#pg-answer")
    expect(answer).not_to_be_empty(timeout=120_000)
    stop = page.get_by_role("button", name="Stop")
    stop.click()

    expect(page.locator("#pg-error")).to_have_text("(stopped)")
    expect(stop).to_be_hidden()
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    _engine_freed()
    stopped_text = answer.inner_text()
    page.wait_for_timeout(1_500)
    assert stopped_text and answer.inner_text() == stopped_text, "the answer kept growing after Stop"


@pytest.mark.timeout(900)
def test_stop_in_an_apps_web_chat_keeps_the_answer_so_far_and_frees_the_engine(platform, open_page, live_db):
    from runtime.models import App

    page = open_page(platform)
    page.goto(f"/apps/counter/widget?token={App.objects.get(slug='counter').widget_token}")
    page.get_by_placeholder("Ask a question").fill("Start now.")
    page.get_by_role("button", name="Send").click()

    answer = page.locator(".turn.assistant").last
    expect(answer).not_to_be_empty(timeout=120_000)
    stop = page.get_by_role("button", name="Stop")
    stop.click()

    expect(answer).to_have_attribute("data-stopped", "1")
    expect(answer).to_contain_text("(stopped)")
    expect(stop).to_be_hidden()
    _engine_freed()
