"""Latency figures, defined once, with the meanings vLLM's benchmark gives them (DESIGN.md §4).

- TTFT: from the gateway receiving the request to the first content chunk.
- ITL: each gap between consecutive content chunks.
- E2E: from receiving the request to the last content chunk.
- TPOT: (E2E - TTFT) / (output tokens - 1); undefined for fewer than two output tokens, and for an answer that
  arrived in one piece (not streamed): there is no time between its tokens to measure.
- A percentile (p50, p90, p95, p99) of a set of figures is numpy's default: linear interpolation between the two
  nearest ranks, as vLLM's benchmark reports them. Serving's charts, a published app's monitoring, agent evaluation
  and the benchmarks all take it from `percentile` here.

Times are `time.perf_counter()` seconds; the figures are reported in milliseconds.
"""

from dataclasses import dataclass, field
from statistics import fmean

import numpy as np
from prometheus_client import Counter, Histogram

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LABELS = ["deployment", "replica"]

TTFT_SECONDS = Histogram("factory_ttft_seconds", "Time to first content chunk", LABELS, buckets=LATENCY_BUCKETS_S)
TPOT_SECONDS = Histogram("factory_tpot_seconds", "Time per output token after the first", LABELS,
                         buckets=LATENCY_BUCKETS_S)
ITL_SECONDS = Histogram("factory_itl_seconds", "Gap between content chunks", LABELS, buckets=LATENCY_BUCKETS_S)
E2E_SECONDS = Histogram("factory_e2e_seconds", "Request to last content chunk", LABELS, buckets=LATENCY_BUCKETS_S)
OUTPUT_TOKENS = Counter("factory_output_tokens", "Output tokens", LABELS)
INPUT_TOKENS = Counter("factory_input_tokens", "Input (prompt) tokens", LABELS)
REQUESTS = Counter("factory_requests", "Gateway requests by outcome", ["deployment", "replica", "status"])


@dataclass
class RequestTiming:
    received_at: float
    content_chunk_times: list[float] = field(default_factory=list)

    def content_chunk(self, at: float) -> None:
        self.content_chunk_times.append(at)

    @property
    def ttft_ms(self) -> float | None:
        if not self.content_chunk_times:
            return None
        return (self.content_chunk_times[0] - self.received_at) * 1000

    @property
    def e2e_ms(self) -> float | None:
        if not self.content_chunk_times:
            return None
        return (self.content_chunk_times[-1] - self.received_at) * 1000

    @property
    def itl_ms(self) -> list[float]:
        times = self.content_chunk_times
        return [(later - earlier) * 1000 for earlier, later in zip(times, times[1:])]

    def tpot_ms(self, output_tokens: int | None) -> float | None:
        if not output_tokens or output_tokens < 2 or len(self.content_chunk_times) < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (output_tokens - 1)

    def figures(self, output_tokens: int | None) -> dict:
        itl = self.itl_ms
        return {
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms(output_tokens),
            "itl_mean_ms": fmean(itl) if itl else None,
            "e2e_ms": self.e2e_ms,
        }


def percentile(values, percent: float) -> float | None:
    """The `percent`th (0-100) percentile of `values`, interpolated linearly between the nearest ranks; None when
    there are no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(values, percent))


def observe(*, deployment: str, replica: str, status: int, timing: RequestTiming, input_tokens: int | None,
            output_tokens: int | None) -> None:
    """Export one request's figures to the Prometheus histograms served at /metrics."""
    labels = (deployment, replica)
    REQUESTS.labels(*labels, str(status)).inc()
    if timing.ttft_ms is not None:
        TTFT_SECONDS.labels(*labels).observe(timing.ttft_ms / 1000)
        E2E_SECONDS.labels(*labels).observe(timing.e2e_ms / 1000)
    if gaps := timing.itl_ms:
        itl = ITL_SECONDS.labels(*labels)  # looked up once: a long answer has a gap per token
        for gap in gaps:
            itl.observe(gap / 1000)
    tpot = timing.tpot_ms(output_tokens)
    if tpot is not None:
        TPOT_SECONDS.labels(*labels).observe(tpot / 1000)
    if output_tokens:
        OUTPUT_TOKENS.labels(*labels).inc(output_tokens)
    if input_tokens:
        INPUT_TOKENS.labels(*labels).inc(input_tokens)
