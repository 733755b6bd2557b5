"""The deployment page's figures, computed from the right requests: TPOT only from streamed answers, output
tokens/s from each request's own time; and the page carries the charts."""

import pytest
from django.test import Client
from django.urls import reverse

from serving import selectors
from serving.metrics import RequestTiming
from serving.models import Deployment, RequestRecord
from serving.presets import SMOLLM2, register_presets

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(make_workspace) -> Deployment:
    make_workspace("Acme", owner="ann")
    model = register_presets(lambda line: None)[SMOLLM2]
    return Deployment.objects.create(workspace=None, name="chat", model=model, engine="llamacpp")


def record(deployment, *, stream: bool, ttft: float, e2e: float, tokens: int, status: int = 200) -> None:
    timing = RequestTiming(received_at=0.0)
    for at in ([ttft / 1000, e2e / 1000] if stream else [e2e / 1000]):
        timing.content_chunk(at)
    RequestRecord.objects.create(deployment=deployment, endpoint="chat/completions", stream=stream, status=status,
                                 output_tokens=tokens, **timing.figures(tokens))


def test_a_whole_answer_has_no_tpot():
    whole = RequestTiming(received_at=0.0)
    whole.content_chunk(2.0)
    assert whole.figures(40)["tpot_ms"] is None
    assert whole.figures(40)["ttft_ms"] == whole.figures(40)["e2e_ms"] == pytest.approx(2000.0)


def test_tpot_comes_only_from_streamed_requests_and_tokens_per_s_from_each_requests_time(deployment):
    # Streamed: 100 ms to the first token, 11 tokens in 1.1 s: TPOT (1100 - 100) / 10 = 100 ms.
    record(deployment, stream=True, ttft=100, e2e=1100, tokens=11)
    # Whole answers: 40 tokens in 2 s, 9 tokens in 1 s; their TTFT equals their E2E.
    record(deployment, stream=False, ttft=2000, e2e=2000, tokens=40)
    record(deployment, stream=False, ttft=1000, e2e=1000, tokens=9)
    # A failed request generated nothing.
    RequestRecord.objects.create(deployment=deployment, endpoint="chat/completions", stream=False, status=502)
    # An old row stored before whole answers lost their TPOT: 0 ms must not count.
    RequestRecord.objects.create(deployment=deployment, endpoint="chat/completions", stream=False, status=200,
                                 ttft_ms=500, e2e_ms=500, tpot_ms=0.0, output_tokens=5)

    overall = selectors.metrics_summary(deployment=deployment)["overall"]

    assert (overall["requests"], overall["errors"]) == (5, 1)
    assert overall["tpot_p50_ms"] == overall["tpot_p99_ms"] == pytest.approx(100.0)
    # (11 + 40 + 9 + 5) tokens over (1.1 + 2 + 1 + 0.5) s of their own requests.
    assert overall["tokens_per_s"] == pytest.approx(65 / 4.6)
    assert overall["output_tokens"] == 65


def test_only_whole_answers_give_no_tpot_at_all(deployment):
    record(deployment, stream=False, ttft=300, e2e=300, tokens=30)
    summary = selectors.metrics_summary(deployment=deployment, buckets=4)
    assert summary["overall"]["tpot_p50_ms"] is None
    assert summary["overall"]["tokens_per_s"] == pytest.approx(100.0)
    # Every bucket has its start time for the time axis; the request falls in the last one.
    assert [bucket["requests"] for bucket in summary["series"]] == [0, 0, 0, 1]
    assert all(bucket["start"] for bucket in summary["series"])


def test_the_deployment_page_loads_the_chart_helper_and_its_figures(deployment):
    record(deployment, stream=True, ttft=100, e2e=1100, tokens=11)
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    page = client.get("/serving/deployments/chat/").content.decode()
    assert 'id="chart-tpot"' in page and "js/charts.js" in page
    data = client.get(reverse("deployment-metrics", args=["chat"])).json()
    assert data["overall"]["tpot_p50_ms"] == pytest.approx(100.0)
