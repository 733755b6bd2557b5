"""Weighted routing: two replicas weighted 3:1, quick non-streaming requests through the gateway, and the split that
the gateway's own RequestRecord rows show against the expected 75/25.

    .venv/bin/python -m bench.weighted_split [--requests 400] [--concurrency 4]
"""

import argparse
import asyncio
import os
import time
from collections import Counter

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.helpers.running_instance import (
    CLIENT_TIMEOUT,
    GATEWAY_URL,
    PLATFORM_URL,
    BenchDeployment,
    bench_deployment,
    chat_body,
    print_header,
    prompts,
)
from serving.models import RequestRecord

WEIGHTS = (3.0, 1.0)
TOLERANCE_POINTS = 5.0
# Two llama.cpp replicas on two cores: one thread each, so they do not fight over the cores.
THREADS_PER_REPLICA = 1


def _scraped_requests_by_replica(deployment_name: str) -> Counter[int]:
    """The gateway's own count of answered requests per replica, from its Prometheus scrape."""
    token = os.environ.get("FACTORY_METRICS_TOKEN", "")
    if not token:
        raise SystemExit("Set FACTORY_METRICS_TOKEN to the platform's metrics token: /metrics needs it.")
    scrape = httpx.get(f"{PLATFORM_URL}/metrics", timeout=10, headers={"Authorization": f"Bearer {token}"}).text
    counts: Counter[int] = Counter()
    for family in text_string_to_metric_families(scrape):
        if family.name != "factory_requests":
            continue
        for sample in family.samples:
            if sample.name == "factory_requests_total" and sample.labels["deployment"] == deployment_name:
                counts[int(sample.labels["replica"])] += int(sample.value)
    return counts


async def _send(bench: BenchDeployment, *, count: int, concurrency: int) -> Counter[str]:
    """Send `count` requests, `concurrency` at a time; returns how many ended with each outcome."""
    slots = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {bench.api_key}"}

    async def one(client: httpx.AsyncClient, prompt: str) -> str:
        async with slots:
            body = chat_body(model=bench.name, prompt=prompt, max_tokens=1, stream=False)
            try:
                response = await client.post(f"{GATEWAY_URL}/chat/completions", json=body, headers=headers)
            except httpx.HTTPError as exc:
                return exc.__class__.__name__
            return f"HTTP {response.status_code}"

    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT, limits=httpx.Limits(max_connections=concurrency)) as client:
        return Counter(await asyncio.gather(*(one(client, prompt) for prompt in prompts(count))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    print_header("weighted_split", f"Share of {args.requests} gateway requests (non-streaming chat, max_tokens 1, "
                                   f"concurrency {args.concurrency}) served by each of 2 replicas weighted "
                                   f"{WEIGHTS[0]:g}:{WEIGHTS[1]:g}, counted from the deployment's RequestRecord rows "
                                   f"(from the gateway's request counter if rows are missing).")
    with bench_deployment(label="split", weights=list(WEIGHTS), threads=THREADS_PER_REPLICA) as bench:
        print(bench.describe())
        print(f"Both replicas run with engine setting threads={THREADS_PER_REPLICA} so that they do not fight over "
              f"the cores.")
        started = time.perf_counter()
        outcomes = asyncio.run(_send(bench, count=args.requests, concurrency=args.concurrency))
        elapsed = time.perf_counter() - started
        print(f"Sent {args.requests} requests in {elapsed:.1f}s ({args.requests / elapsed:.1f} req/s); outcomes: "
              + ", ".join(f"{outcome} x{n}" for outcome, n in sorted(outcomes.items())))

        recorded = bench.wait_for_records(args.requests)
        rows_by_replica = Counter(RequestRecord.objects.filter(deployment=bench.deployment)
                                  .values_list("replica_id", flat=True))
        scraped_by_replica = _scraped_requests_by_replica(bench.name)
        print(f"RequestRecord rows: {recorded} of {args.requests}; gateway counter factory_requests_total "
              f"(/metrics): {sum(scraped_by_replica.values())} of {args.requests}")
        if recorded == args.requests:
            basis, served_by = "RequestRecord rows", rows_by_replica
        else:
            # The rows are the source the brief asks for; when the gateway lost some, its counter still has them.
            print(f"  WARNING: {args.requests - recorded} requests left no RequestRecord row; the verdict uses the "
                  f"gateway's Prometheus counter instead.")
            basis, served_by = "factory_requests_total", scraped_by_replica
        counted = sum(served_by.values())
        total_weight = sum(WEIGHTS)
        print(f"{'replica':>8} {'weight':>6} {'expected':>9} {'rows':>5} {'counter':>7} {'observed':>9} "
              f"{'within ±5 pts':>14}")
        for replica in bench.replicas():
            expected = 100 * replica.weight / total_weight
            observed = 100 * served_by[replica.pk] / counted if counted else 0.0
            within = counted > 0 and abs(observed - expected) <= TOLERANCE_POINTS
            print(f"{replica.pk:>8} {replica.weight:>6g} {expected:>8.1f}% {rows_by_replica[replica.pk]:>5} "
                  f"{scraped_by_replica[replica.pk]:>7} {observed:>8.1f}% {'yes' if within else 'NO':>14}")
        print(f"(observed = share of {counted} requests counted from {basis})")

if __name__ == "__main__":
    main()
