"""The charts in Chromium, drawn by the one chart helper (static/js/charts.js): a single figure shows as a point, a
chart has its unit, a time axis and a legend, a chart without figures says so, and a tiny learning rate is
readable."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from cluster import inventory
from cluster.services import register_node
from enhancement.models import EnhancementJob, JobKind, MetricSample
from runtime.models import Channel, Feedback, Trace, TraceStatus
from serving.models import Deployment, RequestRecord
from serving.presets import SMOLLM2
from tests.e2e.conftest import sign_in
from tests.rag_studio.conftest import acme, ann, presets  # noqa: F401  (fixtures)
from tests.runtime.conftest import app, config, kb, smollm2  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CLOCK = re.compile(r"\d{1,2}:\d{2}")


def test_one_call_draws_points_on_the_monitoring_charts_with_units_times_and_legends(app, browser_page):  # noqa: F811
    trace = Trace.objects.create(app=app, release=app.current_release, channel=Channel.CHAT, query="q",
                                 status=TraceStatus.OK, latency_ms=420.0, ttft_ms=120.0)
    Feedback.objects.create(trace=trace, rating=1)
    page = browser_page
    sign_in(page)
    page.goto(f"/apps/{app.slug}/monitoring/")

    latency = page.locator("#chart-latency")
    expect(latency.locator("circle.chart-point")).to_have_count(2)  # p50 and p95 of the one bucket
    expect(latency.locator(".chart-unit")).to_have_text("ms")
    expect(latency.locator(".chart-legend")).to_have_text(["p50", "p95"])
    times = latency.locator(".chart-x").all_text_contents()
    assert len(times) == 3 and all(CLOCK.fullmatch(label) for label in times), times
    expect(page.locator("#chart-ttft circle.chart-point")).to_have_count(2)
    expect(page.locator("#chart-feedback circle.chart-point")).to_have_count(1)
    expect(page.locator("#chart-feedback .chart-unit")).to_have_text("%")
    # The error rate of a bucket with calls is 0 %, a point; the hours without calls have no rate, no point.
    expect(page.locator("#chart-errors circle.chart-point")).to_have_count(1)
    expect(page.locator("#chart-eval")).to_contain_text("no data yet")


def test_deployment_charts_have_no_tpot_for_whole_answers(presets, browser_page, acme):  # noqa: F811
    deployment = Deployment.objects.create(workspace=None, name="chat", model=presets[SMOLLM2], engine="llamacpp")
    RequestRecord.objects.create(deployment=deployment, endpoint="chat/completions", stream=False, status=200,
                                 ttft_ms=900, e2e_ms=900, output_tokens=30)
    page = browser_page
    sign_in(page)
    page.goto("/serving/deployments/chat/")
    expect(page.locator("#chart-ttft circle.chart-point")).to_have_count(3)
    expect(page.locator("#chart-tpot")).to_contain_text("no data yet")
    # 30 tokens in 0.9 s.
    expect(page.locator("#chart-tps circle.chart-point title")).to_contain_text(": 33 ")


def test_the_learning_rate_chart_reads_in_scientific_notation(acme, presets, browser_page):  # noqa: F811
    node = register_node(name="box", resources=inventory.probe())
    job = EnhancementJob.objects.create(workspace=acme, name="tune", kind=JobKind.FINETUNE, base_model=presets[SMOLLM2],
                                        hyperparameters={"learning_rate": 2e-4},
                                        node=node)
    start = timezone.now()
    for step, rate in enumerate((2e-4, 1.5e-4, 1e-4), start=1):
        MetricSample.objects.create(job=job, step=step, at=start + timedelta(seconds=step), learning_rate=rate,
                                    train_loss=2.0 / step)
    page = browser_page
    sign_in(page)
    page.goto(f"/enhancement/jobs/{job.pk}/")
    labels = page.locator("#chart-lr text.chart-axis:not(.chart-x)")
    expect(labels.first).to_be_visible()
    assert "2.0e-4" in labels.all_text_contents()
    expect(page.locator("#chart-lr circle.chart-point")).to_have_count(3)
