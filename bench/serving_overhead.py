"""Gateway overhead: the same prompts streamed straight to a llama.cpp replica and through the gateway, one at a
time, and what the gateway adds to TTFT and TPOT as the client measures them.

    .venv/bin/python -m bench.serving_overhead [--requests 40]
"""

import argparse
import asyncio
from statistics import median

import httpx

from bench.helpers.running_instance import (
    CLIENT_TIMEOUT,
    GATEWAY_URL,
    BenchDeployment,
    StreamResult,
    bench_deployment,
    chat_body,
    print_header,
    prompts,
    stream_chat,
)
from serving.metrics import percentile
from serving.models import RequestRecord

MAX_TOKENS = 32
WARMUP_PER_PATH = 3
THREADS = 2
# With llama-server's TTFT near 14 ms a ratio would hide the gateway, so its TTFT target is in milliseconds.
TTFT_TARGET_MS = 2.0
TPOT_TARGET_PERCENT = 5.0
DIRECT, GATEWAY = "direct", "gateway"


def _schedule(count: int) -> list[tuple[str, int]]:
    """(path, prompt index) in sending order: direct and gateway alternate, and each path gets every prompt once.
    llama.cpp reuses the KV cache of the prompt it has just seen, so the gateway's copy of a prompt is half the list
    away from the direct one; otherwise whichever path went second would look faster."""
    order = []
    for index in range(count):
        order += [(DIRECT, index), (GATEWAY, (index + count // 2) % count)]
    return order


async def _run(bench: BenchDeployment, replica_url: str, count: int) -> dict[str, dict[int, StreamResult]]:
    """Each path's results by prompt index, in sending order."""
    endpoints = {DIRECT: (replica_url, None), GATEWAY: (GATEWAY_URL, bench.api_key)}
    questions = prompts(count)
    results: dict[str, dict[int, StreamResult]] = {DIRECT: {}, GATEWAY: {}}
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT) as client:
        for warmup in range(WARMUP_PER_PATH):
            for path, (base_url, api_key) in endpoints.items():
                body = chat_body(model=bench.name, prompt=f"Say hello ({warmup}).", max_tokens=MAX_TOKENS,
                                 stream=True)
                await stream_chat(client, base_url=base_url, api_key=api_key, body=body,
                                  to_llama_server=path == DIRECT)
        for path, index in _schedule(count):
            base_url, api_key = endpoints[path]
            body = chat_body(model=bench.name, prompt=questions[index], max_tokens=MAX_TOKENS, stream=True)
            results[path][index] = await stream_chat(client, base_url=base_url, api_key=api_key, body=body,
                                                     to_llama_server=path == DIRECT)
    return results


def _figures(path: str, results: dict[int, StreamResult]) -> dict[str, float]:
    succeeded = [r for r in results.values() if r.ok]
    for failed in (r for r in results.values() if not r.ok):
        print(f"  {path} request failed: {failed.error}")
    ttfts = [r.timing.ttft_ms for r in succeeded if r.timing.ttft_ms is not None]
    tpots = [tpot for tpot in (r.tpot_ms() for r in succeeded) if tpot is not None]
    print(f"{path}: {len(succeeded)}/{len(results)} succeeded, {len(tpots)} with a TPOT (>= 2 output tokens)")
    return {"TTFT p50": percentile(ttfts, 50), "TTFT p90": percentile(ttfts, 90),
            "TPOT p50": percentile(tpots, 50), "TPOT p90": percentile(tpots, 90)}


def _recorded_ttfts(bench: BenchDeployment, gateway_results: dict[int, StreamResult]) -> dict[int, float | None]:
    """The gateway's own TTFT of each measured request, by prompt index. At concurrency 1 its rows are written in
    sending order, so after the warm-ups' they line up with the gateway requests, if every request left one."""
    expected = WARMUP_PER_PATH + len(gateway_results)
    if bench.wait_for_records(expected) != expected:
        return {}
    rows = RequestRecord.objects.filter(deployment=bench.deployment).order_by("created_at", "id")
    ttfts = list(rows.values_list("ttft_ms", flat=True))[WARMUP_PER_PATH:]
    return dict(zip(gateway_results, ttfts))


def _print_ttft_breakdown(results: dict[str, dict[int, StreamResult]],
                          recorded: dict[int, float | None]) -> float | None:
    """Split the added TTFT at the gateway's own measurement, with medians of differences over the same prompts."""
    client_ttfts = {path: {index: r.timing.ttft_ms for index, r in by_prompt.items() if r.ok}
                    for path, by_prompt in results.items()}
    paired = [(client_ttfts[DIRECT][i], recorded[i], client_ttfts[GATEWAY][i]) for i in recorded
              if recorded[i] is not None and i in client_ttfts[DIRECT] and i in client_ttfts[GATEWAY]]
    if not paired:
        print("The gateway did not leave a RequestRecord row for every request, so its TTFT cannot be split.")
        return None
    inside = median(own - direct for direct, own, _ in paired)
    outside = median(seen - own for _, own, seen in paired)
    total = median(seen - direct for direct, _, seen in paired)
    print(f"Added TTFT, median over {len(paired)} prompts sent both ways: {total:+.2f} ms. Split at the gateway's own "
          f"TTFT (RequestRecord, timed from when its view starts):")
    print(f"  {inside:+.2f} ms inside the gateway view (auth, routing, opening the upstream stream)")
    print(f"  {outside:+.2f} ms outside it (ASGI server and routing, handing the first chunk back)")
    return total


def _overhead_percent(gateway: float, direct: float) -> float:
    return 100 * (gateway / direct - 1)


def _print_table(figures: dict[str, dict[str, float]]) -> None:
    columns = list(figures[DIRECT])
    print(f"{'(ms)':<18}" + "".join(f"{column:>11}" for column in columns))
    for path in (DIRECT, GATEWAY):
        print(f"{path:<18}" + "".join(f"{figures[path][column]:>11.2f}" for column in columns))
    print(f"{'gateway added':<18}" + "".join(f"{figures[GATEWAY][c] - figures[DIRECT][c]:>+11.2f}" for c in columns))
    print(f"{'gateway/direct':<18}" + "".join(
        f"{_overhead_percent(figures[GATEWAY][c], figures[DIRECT][c]):>+10.1f}%" for c in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40, help="prompts, each sent once per path")
    args = parser.parse_args()

    print_header("serving_overhead", f"TTFT and TPOT of {args.requests} streamed chat completions (max_tokens "
                                     f"{MAX_TOKENS}, temperature 0, concurrency 1) sent straight to the replica and "
                                     f"the same {args.requests} through the gateway, alternating, after "
                                     f"{WARMUP_PER_PATH} warm-up requests per path. Client-side timings with "
                                     f"serving.metrics.RequestTiming; output tokens from the engine's usage "
                                     f"chunk.")
    with bench_deployment(label="overhead", weights=[1.0], threads=THREADS) as bench:
        print(bench.describe())
        results = asyncio.run(_run(bench, bench.replicas()[0].base_url, args.requests))
        figures = {path: _figures(path, by_prompt) for path, by_prompt in results.items()}
        recorded = _recorded_ttfts(bench, results[GATEWAY])

    print()
    _print_table(figures)
    print()
    added_ttft = _print_ttft_breakdown(results, recorded)
    print()
    if added_ttft is not None:
        verdict = "met" if added_ttft <= TTFT_TARGET_MS else "NOT met"
        print(f"Target: the gateway adds <= {TTFT_TARGET_MS:g} ms to TTFT (median of paired prompts): "
              f"{added_ttft:+.2f} ms -> {verdict}")
    overhead = _overhead_percent(figures[GATEWAY]["TPOT p50"], figures[DIRECT]["TPOT p50"])
    verdict = "met" if overhead <= TPOT_TARGET_PERCENT else "NOT met"
    print(f"Target: the gateway adds <= {TPOT_TARGET_PERCENT:g}% to TPOT p50: {overhead:+.1f}% -> {verdict}")


if __name__ == "__main__":
    main()
