"""The RAG Studio tour in a real browser: upload the sample documents, watch them index, hit test, chat with a
cited answer, generate an eval set, and run and compare two configs, one of them judged. It is the suite's one run
of the LLM eval story (generation, runs, judging with SmolLM2), so it also checks what the pages stand for."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.services import Actor, create_workspace
from rag_studio.models import EvalRun, EvalSet, JobStatus
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush
from tests.e2e.conftest import sign_in
from tests.rag_studio.conftest import SAMPLE_FILES, SAMPLES

pytestmark = [pytest.mark.browser, pytest.mark.worker]


@pytest.fixture
def platform(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        ann = get_user_model().objects.create_user(username="ann", password="correct-horse-battery")
        create_workspace(actor=Actor(user=ann), name="Acme")
        yield web_server
        stop_engines_and_flush(keep=SMOLLM2)


def _save_config(page, name: str, template: str, retrieval_mode: str | None = None):
    page.goto("/rag/configs/new/")
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Template", exact=True).select_option(template)
    page.locator("input[name=max_tokens]").fill("48")
    if retrieval_mode:
        page.get_by_label("Override the knowledge base's retrieval settings").check()
        page.locator("select[name=mode]").select_option(retrieval_mode)
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".msg.success")).to_contain_text(f"Saved '{name}' (version 1)")


@pytest.mark.timeout(900)  # three jobs of SmolLM2 calls on a shared 2-core machine
def test_the_rag_studio_tour(platform, open_page, live_db):
    page = open_page(platform)
    page.set_default_timeout(30_000)
    sign_in(page)

    page.get_by_role("link", name="RAG Studio").click()
    page.get_by_label("Name", exact=True).fill("Northwind")
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("heading", name="Northwind")).to_be_visible()

    page.locator("#upload-files").set_input_files([str(SAMPLES / name) for name in SAMPLE_FILES])
    rows = page.locator("#documents tbody tr[data-document]")
    expect(rows).to_have_count(3)
    for name in SAMPLE_FILES:
        row = page.locator(f"tr[data-filename='{name}']")
        expect(row.locator("[data-field=status]")).to_have_text("indexed", timeout=120_000)
        expect(row.locator("progress")).to_have_attribute("value", "100")
    expect(page.locator("tr[data-filename='northwind-support-faq.md'] [data-field=findings]")).not_to_have_text("0")

    page.get_by_role("link", name="Hit testing").click()
    page.get_by_label("Query").fill("How many days of annual leave?")
    page.get_by_role("button", name="Search").click()
    first = page.locator("#hits tbody tr").first
    expect(first).to_contain_text("northwind-employee-handbook.pdf")
    for score in ("dense", "keyword", "fused"):
        expect(first.locator(f"[data-score={score}]")).not_to_have_text("—")

    _save_config(page, "Cited answers", "citations")
    page.get_by_placeholder("Ask your documents…").fill("What does error code E204 mean?")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#chat-sources li").first).to_contain_text("northwind-product-guide.docx")
    expect(page.locator(".turn.assistant[data-done='1']")).not_to_be_empty(timeout=60_000)
    _save_config(page, "Keyword only", "basic", retrieval_mode="keyword")

    page.get_by_role("link", name="Evaluation").click()
    generate = page.locator("#generate-form")
    generate.get_by_label("Name").fill("Generated")
    generate.get_by_label("Questions").fill("2")
    generate.get_by_role("button", name="Generate").click()
    generated = page.locator("tr[data-set='Generated']")
    expect(generated.locator(".badge")).to_have_text("done", timeout=120_000)
    expect(generated.locator("[data-field=items]")).to_have_text("2")
    eval_set = EvalSet.objects.get(name="Generated")
    items = list(eval_set.items.all())
    # Held to a JSON schema, even a 135M model's every reply parses, and each question knows its source chunk.
    assert eval_set.error == "", eval_set.error
    assert all(i.source_chunk_id and f"chunk:{i.source_chunk_id}" in i.expected_sources for i in items)

    run_form = page.locator("#run-form")
    for config, judge in (("Cited answers", None), ("Keyword only", SMOLLM2)):
        run_form.get_by_label("Config").select_option(label=f"{config} (v1)")
        run_form.get_by_label("Judge").select_option(judge or "")
        run_form.get_by_role("button", name="Run").click()
        expect(page.locator(".msg.success")).to_contain_text("started")
    runs = page.locator("#runs tbody tr[data-run]")
    expect(runs).to_have_count(2)
    for index in range(2):
        expect(runs.nth(index).locator(".badge")).to_have_text("done", timeout=300_000)
    expect(runs.first.locator("[data-metric='hit@k']")).not_to_be_empty()
    expect(page.locator("#compare-chart rect")).not_to_have_count(0)
    for run in EvalRun.objects.filter(eval_set=eval_set):
        assert run.status == JobStatus.DONE and run.results.count() == len(items), run.error
        assert {"hit@k", "recall@k", "mrr", "ndcg@k", "token_f1"} <= set(run.metrics)
    judged = EvalRun.objects.get(eval_set=eval_set, judge=SMOLLM2)
    assert judged.metrics.get("faithfulness", {}).get("n", 0) + judged.judge_unparseable >= len(items), \
        "every judge output is either scored or counted as unparseable"

    runs.first.get_by_role("link").click()
    expect(page.locator("#results tbody tr")).not_to_have_count(0)
