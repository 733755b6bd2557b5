"""The chat engine under concurrent streams: llama-server with parallel slots, as the llamacpp engine launches it,
against the engine it replaced (llama-cpp-python's `python -m llama_cpp.server`, one request at a time), both
serving the SmolLM2 preset (Q4_1) with the same threads, straight to the engine without the gateway.

    .venv/bin/python -m bench.engine_concurrency [--threads 2] [--max-tokens 64] [--concurrency 1,4,8]

Needs no running instance: each engine is started on a free port, measured, and stopped. Each concurrency level
sends three times as many different prompts as it has streams in flight (at least 8) after one warm-up request.
"""

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.helpers.running_instance import (
    CLIENT_TIMEOUT,
    StreamResult,
    chat_body,
    count_tokens,
    print_header,
    prompts,
    stream_chat,
    wait_for,
)
from serving.engines import process
from serving.engines.base import LaunchSpec, Listen, auth_headers, engine
from serving.metrics import percentile
from serving.models import Model
from serving.presets import SMOLLM2, _smollm2_path

ALIAS = "bench"
ENGINE_KEY = secrets.token_urlsafe(24)
ENGINE_START_TIMEOUT_S = 180
TARGET_CONCURRENCY = 4
TTFT_TARGET_SHARE = 0.10
THROUGHPUT_TARGET_RATIO = 3.0


@dataclass
class Level:
    concurrency: int
    results: list[StreamResult]
    wall_s: float

    def output_tokens(self, model_path: str) -> list[int]:
        # The old engine streams no usage, so its answers are counted with the model's own tokenizer.
        return [r.output_tokens or count_tokens(model_path, r.text) for r in self.results if r.ok]

    def figures(self, model_path: str) -> dict[str, float | None]:
        succeeded = [r for r in self.results if r.ok]
        tokens = self.output_tokens(model_path)
        ttfts = [r.timing.ttft_ms for r in succeeded if r.timing.ttft_ms is not None]
        tpots = [tpot for r, n in zip(succeeded, tokens) if (tpot := r.timing.tpot_ms(n)) is not None]
        return {"ok": len(succeeded), "sent": len(self.results),
                "ttft_p50": percentile(ttfts, 50) if ttfts else None,
                "ttft_p95": percentile(ttfts, 95) if ttfts else None,
                "tpot_p50": percentile(tpots, 50) if tpots else None,
                "tokens_per_s": sum(tokens) / self.wall_s}


def _llama_server_launch(model_path: str, threads: int, port: int, key_file: Path) -> tuple[LaunchSpec, int]:
    """What the platform's llamacpp engine would launch for the SmolLM2 preset (with a replica's key), and its slot
    count."""
    model = Model(name=SMOLLM2, path=model_path, context_length=8192)
    adapter = engine("llamacpp")
    settings_ = {"threads": threads}
    process.write_key_file(key_file, ENGINE_KEY)
    spec = adapter.launch_spec(model=model, settings=settings_, served_name=ALIAS,
                               listen=Listen(host="127.0.0.1", port=port, key_file=key_file))
    return spec, adapter.slots(model=model, settings=settings_)


def _llama_cpp_python_launch(model_path: str, threads: int, port: int) -> LaunchSpec:
    """What the llamacpp engine launched before llama-server, with the same context per request."""
    return LaunchSpec(argv=[sys.executable, "-m", "llama_cpp.server", "--model", model_path, "--model_alias", ALIAS,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096", "--n_threads", str(threads),
            "--interrupt_requests", "False"])


async def _level(base_url: str, concurrency: int, max_tokens: int, offset: int) -> Level:
    questions = prompts(offset + max(8, 3 * concurrency))[offset:]
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, prompt: str) -> StreamResult:
        async with gate:
            body = chat_body(model=ALIAS, prompt=prompt, max_tokens=max_tokens, stream=True)
            # The old engine ignores the key; llama-server requires it, as a replica's does.
            return await stream_chat(client, base_url=base_url, api_key=ENGINE_KEY, body=body,
                                     to_llama_server=True)

    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT, limits=httpx.Limits(max_connections=64)) as client:
        await one(client, "Say hello.")
        started = time.perf_counter()
        results = await asyncio.gather(*(one(client, prompt) for prompt in questions))
    return Level(concurrency, list(results), time.perf_counter() - started)


def _measure(spec: LaunchSpec, port: int, levels: list[int], max_tokens: int, log: Path) -> list[Level]:
    """Start the engine as a replica would be started (serving.engines.process), measure each level, stop it."""
    argv = spec.argv
    pid = process.launch(argv, log_path=log, env=spec.env)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        def answers() -> bool:
            if not process.is_alive(pid):
                raise RuntimeError(f"{argv[0]} exited:\n{process.log_tail(log)}")
            try:
                return httpx.get(f"{base_url}/models", headers=auth_headers(ENGINE_KEY), timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, done=bool, timeout_s=ENGINE_START_TIMEOUT_S, what=f"{argv[0]} to answer")
        measured, offset = [], 0
        for concurrency in levels:
            measured.append(asyncio.run(_level(base_url, concurrency, max_tokens, offset)))
            offset += max(8, 3 * concurrency)
        return measured
    finally:
        process.terminate(pid)


def _cell(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,4,8")
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    model_path = str(_smollm2_path())
    count_tokens(model_path, "Load the tokenizer before any table is printed: llama.cpp logs as it loads.")

    server_port, old_port = process.free_port(), process.free_port()
    scratch_dir = tempfile.TemporaryDirectory()
    server_spec, slots = _llama_server_launch(model_path, args.threads, server_port,
                                              Path(scratch_dir.name) / "replica.key")
    engines = {f"llama-server, {slots} slots": server_spec,
               "llama_cpp.server (before)": _llama_cpp_python_launch(model_path, args.threads, old_port)}
    print_header("engine_concurrency", f"Streamed chat completions of {SMOLLM2} straight to the engine, "
                                       f"max_tokens {args.max_tokens}, temperature 0, {args.threads} threads, at "
                                       f"concurrency {args.concurrency}; TTFT and TPOT in ms as the client sees "
                                       f"them, tok/s = output tokens of all requests / wall time of the level.")
    by_engine = {}
    with scratch_dir as scratch:
        for (label, spec), port in zip(engines.items(), (server_port, old_port)):
            by_engine[label] = _measure(spec, port, levels, args.max_tokens, Path(scratch) / f"{port}.log")

    print(f"\n{'engine':<28}{'conc':>5}{'ok':>7}{'TTFT p50':>10}{'TTFT p95':>10}{'TPOT p50':>10}{'tok/s':>8}")
    for label, measured in by_engine.items():
        for level in measured:
            for failed in (r for r in level.results if not r.ok):
                print(f"{label}, concurrency {level.concurrency}: a request failed: {failed.error}")
    figures = {label: [level.figures(model_path) for level in measured] for label, measured in by_engine.items()}
    for label, rows in figures.items():
        for level, row in zip(levels, rows):
            print(f"{label:<28}{level:>5}{row['ok']:>4}/{row['sent']:<2}{_cell(row['ttft_p50']):>10}"
                  f"{_cell(row['ttft_p95']):>10}{_cell(row['tpot_p50'], 1):>10}{_cell(row['tokens_per_s'], 1):>8}")
    new, old = figures.values()
    print()
    for level, now, before in zip(levels, new, old):
        if None in (now["ttft_p50"], before["ttft_p50"]) or not before["tokens_per_s"]:
            continue
        share = now["ttft_p50"] / before["ttft_p50"]
        ratio = now["tokens_per_s"] / before["tokens_per_s"]
        line = f"concurrency {level}: TTFT p50 is {100 * share:.1f}% of before, throughput {ratio:.1f}x"
        if level == TARGET_CONCURRENCY:
            met = share < TTFT_TARGET_SHARE and ratio >= THROUGHPUT_TARGET_RATIO
            line += (f" (target at concurrency {TARGET_CONCURRENCY}: TTFT p50 < {100 * TTFT_TARGET_SHARE:.0f}% and "
                     f">= {THROUGHPUT_TARGET_RATIO:.0f}x: {'met' if met else 'NOT met'})")
        print(line)


if __name__ == "__main__":
    main()
