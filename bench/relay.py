"""Relay speed: streamed chat completions straight to a fake engine (bench/helpers/fake_engine.py: llama-server's
chunks at a fixed pace) and the same through the gateway as `make run` serves it (`scripts/proc.sh web`: uvicorn,
FACTORY_WEB_WORKERS processes, its flags), side by side at each concurrency: output tok/s and TTFT p50 as the client
sees them. Targets (issue 49): ≥ 95% of direct throughput at concurrency 64; TTFT within +10 ms at 32.

    .venv/bin/python -m bench.relay [--concurrency 32,64] [--tokens 128] [--rounds 6] [--repeats 3]
                                    [--token-delay-ms 3] [--keep]

Private: a fresh data dir and SQLite database (bench/helpers/private_instance.py), a redis-server of its own for
the rate limits, one deployment whose replica is the fake engine. Each repeat runs direct, then through the gateway,
`rounds` requests in a row per concurrent client; a path's figures are the medians over the repeats. The clients
start spread over one answer's time: every answer takes as long, so clients started at once would stay in step
and measure a burst of `concurrency` requests arriving together at every turn, not a steady load. The client, the
engine and the gateway share the box, as they would on one machine.
"""

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from urllib.parse import urlsplit

import httpx
import psutil
import uvloop

from bench.helpers.fake_engine import started as fake_engine_started
from bench.helpers.private_instance import DATA_DIR, bench_workspace, clean_up, print_header
from cluster.models import Node
from serving.metrics import percentile
from serving.models import Deployment, Model, ModelKind, Replica, ServingState

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "relay-fake"
THROUGHPUT_TARGET = 0.95
TTFT_TARGET_MS = 10.0
THROUGHPUT_AT, TTFT_AT = 64, 32
DIRECT, GATEWAY = "direct", "gateway"
# Every token's chunk from the fake engine carries this once; its role chunk's content is null.
CONTENT = b'"content":"'
# The bench measures relaying, not the rate limits: far above what it sends.
UNLIMITED = "1000000/minute"
SERVER_START_TIMEOUT_S = 120
# The web processes import torch in the background as they start (factory/asgi.py); measuring waits for it.
SETTLED_CPU_SHARE = 0.05


@dataclass
class Run:
    tokens: int
    seconds: float
    ttfts_ms: list[float]
    failures: int

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def ttft_p50(self) -> float:
        return percentile(self.ttfts_ms, 50) if self.ttfts_ms else float("nan")  # nan: every request failed


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_redis() -> str:
    port = _free_port()
    subprocess.run(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                    "--daemonize", "yes", "--dir", str(DATA_DIR), "--logfile", str(DATA_DIR / "redis.log"),
                    "--pidfile", str(DATA_DIR / "redis.pid")], check=True)
    return f"redis://127.0.0.1:{port}/0"


def _stop_redis() -> None:
    """Stopped and gone before the data dir is removed, where it writes its log on the way out."""
    pid_file = DATA_DIR / "redis.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not psutil.pid_exists(pid):
            return
        time.sleep(0.1)


def _deployment(engine_url: str) -> str:
    """A ready llama.cpp deployment whose one replica is the fake engine; returns an API key for it."""
    # Here rather than at the top, where sorting would put it above the import that sets Django up.
    from accounts.services import create_api_key

    actor, workspace = bench_workspace()
    node = Node.objects.create(name="relay-bench")
    model = Model.objects.create(name=MODEL, kind=ModelKind.GGUF, path="/dev/null", chat_template="{{ messages }}")
    deployment = Deployment.objects.create(name=MODEL, model=model, engine="llamacpp", state=ServingState.READY,
                                           settings={"context_length": 4096})
    Replica.objects.create(deployment=deployment, node=node, state=ServingState.READY, base_url=engine_url)
    return create_api_key(actor=actor, workspace=workspace, name="relay").secret


def _start_web(port: int, redis_url: str) -> subprocess.Popen:
    env = {**os.environ, "FACTORY_DATA_DIR": str(DATA_DIR), "FACTORY_PORT": str(port), "REDIS_URL": redis_url,
           "FACTORY_GATEWAY_RATE_PER_KEY": UNLIMITED, "FACTORY_GATEWAY_RATE_PER_WORKSPACE": UNLIMITED}
    env.pop("DATABASE_URL", None)
    web = subprocess.Popen([REPO_ROOT / "scripts" / "proc.sh", "web"], cwd=REPO_ROOT, env=env,
                           stdout=(DATA_DIR / "web.log").open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if web.poll() is not None:
            raise RuntimeError(f"The web server exited:\n{(DATA_DIR / 'web.log').read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return web
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError("The web server did not answer /healthz in time.")


def _wait_until_idle(web: subprocess.Popen, timeout_s: float = 90) -> None:
    """Until the web processes use under SETTLED_CPU_SHARE of a core for a second."""
    root = psutil.Process(web.pid)

    def cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)] if p.is_running())

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = cpu()
        time.sleep(1)
        if cpu() - before < SETTLED_CPU_SHARE:
            return


async def _stream(host: str, port: int, request: bytes) -> tuple[int, float | None]:
    """Output tokens and TTFT (ms) of one streamed chat. A bare HTTP/1.1 client that counts the tokens in the raw
    bytes and reads to the close it asked for: httpx would cost the client several times the gateway's share of the
    box, on both paths."""
    sent, first, tokens, carry = time.perf_counter(), None, 0, b""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            status_line = head.split(b"\r\n")[0].decode()
            raise RuntimeError(f"{status_line}: {(await reader.read(500))!r}")
        while data := await reader.read(65536):
            data = carry + data
            found = data.count(CONTENT)
            if found and first is None:
                first = time.perf_counter()
            tokens += found
            carry = data[-(len(CONTENT) - 1):]
    finally:
        writer.close()
    return tokens, None if first is None else (first - sent) * 1000


async def _run(base_url: str, key: str | None, concurrency: int, rounds: int, tokens: int, spread_s: float) -> Run:
    url = urlsplit(f"{base_url}/chat/completions")
    body = (b'{"model": "%s", "stream": true, "max_tokens": %d, "messages": [{"role": "user", "content": "Go."}]}'
            % (MODEL.encode(), tokens))
    request = (f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n"
               + (f"Authorization: Bearer {key}\r\n" if key else "") + "\r\n").encode() + body
    ttfts, counted, failures = [], 0, 0

    async def client_loop(start_after_s: float) -> None:
        nonlocal counted, failures
        await asyncio.sleep(start_after_s)
        for _ in range(rounds):
            try:
                got, ttft = await _stream(url.hostname, url.port, request)
            except (OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
                failures += 1
                print(f"  request failed: {exc}")
                continue
            counted += got
            if ttft is not None:
                ttfts.append(ttft)

    started = time.perf_counter()
    await asyncio.gather(*(client_loop(spread_s * i / concurrency) for i in range(concurrency)))
    return Run(counted, time.perf_counter() - started, ttfts, failures)


def _measure(paths: dict[str, tuple[str, str | None]], concurrency: int, args) -> dict[str, list[Run]]:
    runs = {path: [] for path in paths}
    for repeat in range(args.repeats):
        for path, (base_url, key) in paths.items():
            run = uvloop.run(_run(base_url, key, concurrency, args.rounds, args.tokens,
                                  spread_s=args.tokens * args.token_delay_ms / 1000))
            runs[path].append(run)
            print(f"  concurrency {concurrency:>3} {path:<8} repeat {repeat + 1}: {run.tok_s:>9,.0f} tok/s, TTFT p50 "
                  f"{run.ttft_p50:7.2f} ms, {run.failures} failed; load {os.getloadavg()[0]:.2f}")
    return runs


def _summary(results: dict[int, dict[str, list[Run]]]) -> None:
    print()
    print(f"{'concurrency':>11} {'direct tok/s':>13} {'gateway tok/s':>14} {'ratio':>7} {'direct TTFT p50':>16} "
          f"{'gateway TTFT p50':>17} {'added':>9}")
    for concurrency, runs in results.items():
        tok_s = {path: median(r.tok_s for r in runs[path]) for path in runs}
        ttft = {path: median(r.ttft_p50 for r in runs[path]) for path in runs}
        print(f"{concurrency:>11} {tok_s[DIRECT]:>13,.0f} {tok_s[GATEWAY]:>14,.0f} "
              f"{tok_s[GATEWAY] / tok_s[DIRECT]:>7.1%} {ttft[DIRECT]:>13.2f} ms {ttft[GATEWAY]:>14.2f} ms "
              f"{ttft[GATEWAY] - ttft[DIRECT]:>+6.2f} ms")
    print()
    if THROUGHPUT_AT in results:
        runs = results[THROUGHPUT_AT]
        ratio = median(r.tok_s for r in runs[GATEWAY]) / median(r.tok_s for r in runs[DIRECT])
        print(f"Target: through the gateway >= {THROUGHPUT_TARGET:.0%} of direct throughput at concurrency "
              f"{THROUGHPUT_AT}: {ratio:.1%} -> {'met' if ratio >= THROUGHPUT_TARGET else 'NOT met'}")
    if TTFT_AT in results:
        runs = results[TTFT_AT]
        added = median(r.ttft_p50 for r in runs[GATEWAY]) - median(r.ttft_p50 for r in runs[DIRECT])
        print(f"Target: the gateway adds <= {TTFT_TARGET_MS:g} ms to TTFT p50 at concurrency {TTFT_AT}: "
              f"{added:+.2f} ms -> {'met' if added <= TTFT_TARGET_MS else 'NOT met'}")
    print(f"Load average at the end: {', '.join(f'{value:.2f}' for value in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default=f"{TTFT_AT},{THROUGHPUT_AT}")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--rounds", type=int, default=6, help="requests in a row per concurrent client")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--token-delay-ms", type=float, default=3.0, help="the fake engine's pace, per stream")
    parser.add_argument("--keep", action="store_true", help="keep the data dir (web.log, the database)")
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]

    print_header("relay", f"Streamed chats of {args.tokens} tokens from a fake engine, tokens due "
                          f"{args.token_delay_ms:g} ms apart, straight and through the gateway (scripts/proc.sh web, "
                          f"FACTORY_WEB_WORKERS={os.environ.get('FACTORY_WEB_WORKERS', '2')}); {args.rounds} "
                          f"requests per client, {args.repeats} repeats per path.")
    redis_url, web = _start_redis(), None
    try:
        with fake_engine_started(token_delay_ms=args.token_delay_ms) as engine_url:
            key = _deployment(engine_url)
            port = _free_port()
            web = _start_web(port, redis_url)
            _wait_until_idle(web)
            paths = {DIRECT: (engine_url, None), GATEWAY: (f"http://127.0.0.1:{port}/v1", key)}
            for base_url, path_key in paths.values():  # each web process's key and routing caches, and the engine's
                uvloop.run(_run(base_url, path_key, 8, 2, 8, spread_s=0))
            results = {level: _measure(paths, level, args) for level in levels}
    finally:
        if web is not None:
            web.terminate()
            web.wait(timeout=30)
        _stop_redis()
        clean_up(args.keep)
    _summary(results)


if __name__ == "__main__":
    main()
