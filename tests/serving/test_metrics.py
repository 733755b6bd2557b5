"""The latency definitions, pinned on a recorded stream (times in seconds since the request arrived), and the
scrape of several web worker processes."""

import os
import subprocess
import sys

import pytest

from serving.metrics import RequestTiming

# Content chunks of a 5-token answer as the gateway saw them, request received at t=10.000.
RECORDED_CHUNKS = [10.150, 10.180, 10.215, 10.245, 10.290]


def test_figures_follow_vllms_definitions():
    timing = RequestTiming(received_at=10.0)
    for at in RECORDED_CHUNKS:
        timing.content_chunk(at)

    assert timing.ttft_ms == pytest.approx(150.0)
    assert timing.e2e_ms == pytest.approx(290.0)
    assert timing.itl_ms == pytest.approx([30.0, 35.0, 30.0, 45.0])
    # TPOT = (E2E - TTFT) / (output tokens - 1) = 140 ms / 4
    assert timing.tpot_ms(5) == pytest.approx(35.0)
    figures = timing.figures(5)
    assert figures["itl_mean_ms"] == pytest.approx(35.0)


def test_tpot_uses_token_count_not_chunk_count():
    timing = RequestTiming(received_at=0.0)
    for at in (0.1, 0.3):
        timing.content_chunk(at)
    # Two chunks carried 5 tokens: 200 ms of decoding over 4 later tokens.
    assert timing.tpot_ms(5) == pytest.approx(50.0)


def test_a_request_without_content_has_no_latency_figures():
    timing = RequestTiming(received_at=0.0)
    assert timing.figures(0) == {"ttft_ms": None, "tpot_ms": None, "itl_mean_ms": None, "e2e_ms": None}
    one_token = RequestTiming(received_at=0.0)
    one_token.content_chunk(0.2)
    assert one_token.tpot_ms(1) is None


def test_the_scrape_sums_every_web_worker_process(tmp_path):
    """`make run` starts several uvicorn workers; /metrics, answered by any one of them, must count all."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "factory.settings",
           "FACTORY_METRICS_TOKEN": "scrape-secret"}
    count_one = ("from serving.metrics import REQUESTS, TTFT_SECONDS; "
                 "REQUESTS.labels('chat', '7', '200').inc(); TTFT_SECONDS.labels('chat', '7').observe(0.2)")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", count_one], env=env, check=True)
    scrape = ("import django; django.setup(); from django.test import RequestFactory; "
              "from serving.views import prometheus_metrics; "
              "request = RequestFactory().get('/metrics', HTTP_AUTHORIZATION='Bearer scrape-secret'); "
              "print(prometheus_metrics(request).content.decode())")
    text = subprocess.run([sys.executable, "-c", scrape], env=env, check=True, capture_output=True, text=True).stdout
    assert 'factory_requests_total{deployment="chat",replica="7",status="200"} 2.0' in text
    assert 'factory_ttft_seconds_count{deployment="chat",replica="7"} 2.0' in text
