"""A published app under load: its public API, `/api/apps/<slug>/retrieve` (retrieval only) and `/chat` (full
answers with the SmolLM2 preset), at concurrency 1, 8 and 32, against the raw cost of the query embedding that
bounds the retrieval path.

    .venv/bin/python -m bench.app_api [--raw-queries 200] [--retrieve-requests 200,400,800]
                                      [--chat-requests 8,16,32]

Runs against a running instance (`make run`; FACTORY_URL says where) and reads its database. Sets up, or reuses,
`bench-app` in the admin's first workspace: a knowledge base of the three samples in rag_studio/samples (ingested
by the instance's worker), a config with the `citations` template on the SmolLM2 deployment, and the app published
from it; each run adds a throwaway app key, revoked at the end. The app keeps its traces (its logs and monitoring
pages show the run). Every query of the run is a different question, so nothing along the path sees one twice.
Each level's row is printed as soon as it is done.

The ceiling: all-MiniLM-L6-v2 embeds each query in the web process, so the retrieval path cannot serve more than
cores × 1000 / (CPU ms of one query embedding) requests per second. This process measures that CPU time with the
same model, call and torch thread count as the web process (`Embedder.embed` of one query at a time).
"""

import argparse
import asyncio
import io
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

# First: it reads the instance's settings and sets Django up, which the project's models need.
from bench.helpers.running_instance import (
    ADMIN_USERNAME,
    CLIENT_TIMEOUT,
    PLATFORM_URL,
    PRESET_MODEL,
    REPO_ROOT,
    count_tokens,
    print_header,
    wait_for,
)

# isort: split

from django.conf import settings
from django.contrib.auth import get_user_model

from accounts.models import Workspace
from accounts.services import Actor
from rag_studio import selectors as rag_selectors, services as rag_services
from rag_studio.embedding import Embedder
from rag_studio.models import Chunk, DocumentStatus, KnowledgeBase, RagConfig, RagTemplate
from rag_studio.pipeline.storage import UploadedFile
from runtime import services as runtime_services
from runtime.models import App
from runtime.services import IssuedAppKey
from serving.metrics import percentile
from serving.models import Model

# sentence-transformers draws a tqdm bar on every encode() while its logger is at INFO, the project's level. The
# raw measurement is of the model alone, as in bench.ingest.
logging.getLogger("sentence_transformers").setLevel(logging.WARNING)

BENCH_NAME = "bench-app"
KEY_NAME = "bench.app_api"
SAMPLES = REPO_ROOT / "rag_studio" / "samples"
SAMPLE_FILES = ("northwind-employee-handbook.pdf", "northwind-product-guide.docx", "northwind-support-faq.md")
INGEST_TIMEOUT_S = 600
MAX_TOKENS = 32
CONCURRENCY = (1, 8, 32)
RAW_WARMUP_QUERIES = 10
# Loads the pipeline, index and embedding model in the web process and opens the connections.
RETRIEVE_WARMUP = (16, 8)  # requests, concurrency
CHAT_WARMUP = (2, 1)
# An answer at concurrency 32 waits behind up to 31 others on a replica that serves one at a time.
ANSWER_TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=10.0, pool=600.0)
TARGET_CEILING_PERCENT = 70.0
TARGET_CONCURRENCY = 32

SUBJECTS = (
    "resetting the NW-7 robot", "firmware updates", "a flashing red status light", "cold stores",
    "contacting support", "the warranty", "returns and exchanges", "annual leave", "remote work", "expense claims",
    "travel costs", "passwords", "laptop security", "error code E204", "the charging contacts", "the fleet console",
    "the maintenance window", "the emergency stop button", "the robot's payload", "battery life", "zone assignment",
    "parental leave", "sick days", "the serial number label",
)
FORMS = ("What is the rule on {}?", "How does {} work?", "Tell me about {}.", "What should I know about {}?",
         "Where can I read about {}?", "Who handles {}?", "{}", "Explain {} in a sentence.")


class Questions:
    """Distinct questions about the samples, handed out once each: forms × subjects, then the same again with a
    case number."""

    def __init__(self):
        self.issued = 0

    def take(self, count: int) -> list[str]:
        combinations = len(FORMS) * len(SUBJECTS)
        taken = []
        for number in range(self.issued, self.issued + count):
            text = FORMS[number % len(FORMS)].format(SUBJECTS[number // len(FORMS) % len(SUBJECTS)])
            taken.append(text if number < combinations else f"{text} (case {number // combinations})")
        self.issued += count
        return taken


# ---- setup ----


def _admin() -> tuple[Actor, Workspace]:
    admin = get_user_model().objects.get(username=ADMIN_USERNAME)
    workspace = Workspace.objects.filter(memberships__user=admin).order_by("memberships__created_at").first()
    return Actor(user=admin), workspace


def _indexed_knowledge_base(actor: Actor, workspace: Workspace) -> KnowledgeBase:
    """The samples' knowledge base, once the instance's worker has ingested every document."""
    kb = (KnowledgeBase.objects.filter(workspace=workspace, name=BENCH_NAME).first()
          or rag_services.create_knowledge_base(actor=actor, workspace=workspace, name=BENCH_NAME))
    missing = [name for name in SAMPLE_FILES if not kb.documents.filter(filename=name).exists()]
    if missing:
        contents = {name: (SAMPLES / name).read_bytes() for name in missing}
        uploads = [UploadedFile(name, io.BytesIO(content), len(content))
                   for name, content in contents.items()]
        rag_services.upload_documents(actor=actor, kb=kb, uploads=uploads)
    statuses = wait_for(lambda: dict(kb.documents.values_list("filename", "status")),
                        done=lambda found: all(s in (DocumentStatus.INDEXED, DocumentStatus.FAILED)
                                               for s in found.values()),
                        timeout_s=INGEST_TIMEOUT_S, interval_s=1.0, what="the worker to ingest the samples")
    failed = kb.documents.filter(status=DocumentStatus.FAILED).values_list("filename", "error")
    if failed:
        raise RuntimeError(f"Samples failed to ingest: {dict(failed)}")
    print(f"Knowledge base {BENCH_NAME}: {len(statuses)} documents indexed, "
          f"{Chunk.objects.filter(knowledge_base=kb).count()} chunks, embeddings {kb.embedding_model.name}")
    return kb


def _published_app(actor: Actor, workspace: Workspace, kb: KnowledgeBase) -> App:
    """The app, serving the config's latest version (saving unchanged settings writes no new version)."""
    config = rag_services.save_rag_config(
        actor=actor, workspace=workspace, config=RagConfig.objects.filter(workspace=workspace, name=BENCH_NAME).first(),
        name=BENCH_NAME, knowledge_base=kb, template=RagTemplate.CITATIONS, model=PRESET_MODEL,
        generation={"temperature": 0, "max_tokens": MAX_TOKENS})
    app = App.objects.select_related("current_release__config_version").filter(slug=BENCH_NAME).first()
    if app is None:
        app = runtime_services.publish_app(actor=actor, config=config, slug=BENCH_NAME)
    elif app.current_release.config_version != rag_selectors.config_version(config):
        runtime_services.republish(actor=actor, app=app, note="bench.app_api")
    app.refresh_from_db()
    print(f"App {app.slug}: release {app.current_release.number} (config version "
          f"{app.current_release.config_version.number}: template {config.template}, model {config.model}, "
          f"max_tokens {MAX_TOKENS}, temperature 0, retrieval {kb.retrieval['mode']} top {kb.retrieval['top_k']})")
    return app


def _fresh_key(actor: Actor, app: App) -> IssuedAppKey:
    """This run's key, allowed as many requests as the platform allows; keys that killed runs left behind are
    revoked first."""
    for leftover in app.keys.filter(name=KEY_NAME, revoked_at__isnull=True):
        runtime_services.revoke_app_key(actor=actor, app_key=leftover)
    return runtime_services.create_app_key(actor=actor, app=app, name=KEY_NAME,
                                           rate_limit=runtime_services.MAX_RATE_LIMIT)


# ---- the raw ceiling ----


@dataclass
class RawEmbedding:
    queries: int
    cpu_ms: float  # process CPU time per query, all torch threads together
    wall_ms: list[float]
    torch_threads: int

    def ceiling(self, cores: int) -> float:
        return cores * 1000 / self.cpu_ms


def measure_raw_embedding(kb: KnowledgeBase, questions: list[str], torch_threads: int | None) -> RawEmbedding:
    """The query path's own call, one query at a time, in this process: the same model, and the web process's
    torch threads when it is known."""
    import torch

    if torch_threads:
        # Before the model loads: each thread fixes its torch thread count when it first runs an op.
        settings.TORCH_THREADS = torch_threads
    embedder = Embedder.for_knowledge_base(kb)
    for question in questions[:RAW_WARMUP_QUERIES]:
        embedder.embed([question])
    measured = questions[RAW_WARMUP_QUERIES:]
    wall_ms = []
    cpu_started = time.process_time()
    for question in measured:
        started = time.perf_counter()
        embedder.embed([question])
        wall_ms.append(1000 * (time.perf_counter() - started))
    cpu_ms = 1000 * (time.process_time() - cpu_started) / len(measured)
    return RawEmbedding(queries=len(measured), cpu_ms=cpu_ms, wall_ms=wall_ms, torch_threads=torch.get_num_threads())


# ---- load ----


def _web_pid() -> int | None:
    """The instance's web server, if `make run` started it here and it serves FACTORY_URL: its CPU time per
    request shows what the path costs beyond the embedding."""
    pid_file = REPO_ROOT / ".run" / "web.pid"
    if not pid_file.exists():
        return None
    pid = pid_file.read_text().strip()
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    port = str(urlsplit(PLATFORM_URL).port or 80).encode()
    serves_url = b"--port" in command and command[command.index(b"--port") + 1] == port
    return int(pid) if any(b"uvicorn" in part for part in command) and serves_url else None


def _with_workers(pid: int) -> list[int]:
    """uvicorn and the worker processes it started."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return [pid, *map(int, children)]


def _web_torch_threads(pid: int | None) -> int | None:
    """FACTORY_TORCH_THREADS as the web workers see it (scripts/proc.sh sets it)."""
    for process in _with_workers(pid) if pid else []:
        try:
            environ = Path(f"/proc/{process}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"FACTORY_TORCH_THREADS="):
                return int(entry.split(b"=", 1)[1])
    return None


def _cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU time of the web server and its workers so far; None if it is unknown or gone."""
    if pid is None:
        return None
    total = 0.0
    for process in _with_workers(pid):
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@dataclass
class Reply:
    latency_ms: float
    timings_ms: dict = field(default_factory=dict)
    answer: str = ""
    error: str = ""


@dataclass
class LoadRun:
    concurrency: int
    replies: list[Reply]
    wall_s: float
    web_cpu_s: float | None
    load_average: float

    @property
    def succeeded(self) -> list[Reply]:
        return [reply for reply in self.replies if not reply.error]

    @property
    def errors(self) -> Counter:
        return Counter(reply.error for reply in self.replies if reply.error)

    @property
    def requests_per_s(self) -> float:
        return len(self.succeeded) / self.wall_s

    def latency(self, percent: int) -> float | None:
        values = [reply.latency_ms for reply in self.succeeded]
        return percentile(values, percent) if values else None

    def server_timing(self, name: str, percent: int) -> float | None:
        values = [reply.timings_ms[name] for reply in self.succeeded if reply.timings_ms.get(name) is not None]
        return percentile(values, percent) if values else None

    def web_cpu_ms_per_request(self) -> float | None:
        return None if self.web_cpu_s is None else 1000 * self.web_cpu_s / len(self.replies)


async def _post(client: httpx.AsyncClient, url: str, api_key: str, query: str) -> Reply:
    """One call; an HTTP error status or a transport error is the reply's error, never raised."""
    started = time.perf_counter()
    try:
        response = await client.post(url, json={"query": query}, headers={"Authorization": f"Bearer {api_key}"})
    except httpx.HTTPError as exc:
        return Reply(latency_ms=1000 * (time.perf_counter() - started), error=f"{type(exc).__name__}: {exc}")
    latency_ms = 1000 * (time.perf_counter() - started)
    if response.status_code != 200:
        return Reply(latency_ms=latency_ms, error=f"HTTP {response.status_code}: {response.text[:500]}")
    body = response.json()
    return Reply(latency_ms=latency_ms, timings_ms=body.get("timings_ms") or {}, answer=body.get("answer", ""))


async def _load(url: str, api_key: str, questions: list[str], concurrency: int, timeout: httpx.Timeout,
                web_pid: int | None) -> LoadRun:
    """Every question once, `concurrency` requests in flight: each worker sends its next as soon as one returns."""
    pending = iter(questions)
    replies = []

    async def worker(client: httpx.AsyncClient) -> None:
        for question in pending:
            replies.append(await _post(client, url, api_key, question))

    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=concurrency)) as client:
        cpu_before, started = _cpu_seconds(web_pid), time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall_s, cpu_after = time.perf_counter() - started, _cpu_seconds(web_pid)
    web_cpu_s = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return LoadRun(concurrency=concurrency, replies=replies, wall_s=wall_s, web_cpu_s=web_cpu_s,
                   load_average=os.getloadavg()[0])


def run_levels(url: str, api_key: str, questions: Questions, counts: list[int], warmup: tuple[int, int],
               timeout: httpx.Timeout, web_pid: int | None, print_row: Callable[[LoadRun], None]) -> list[LoadRun]:
    """A warm-up, then each concurrency level, its row printed as soon as it is done."""
    asyncio.run(_load(url, api_key, questions.take(warmup[0]), warmup[1], timeout, None))
    runs = []
    for concurrency, count in zip(CONCURRENCY, counts):
        runs.append(asyncio.run(_load(url, api_key, questions.take(count), concurrency, timeout, web_pid)))
        print_row(runs[-1])
    return runs


# ---- report ----


def _whole(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def print_raw(raw: RawEmbedding, cores: int) -> None:
    print(f"Raw query embedding (Embedder.embed, {raw.queries} distinct queries one at a time, {raw.torch_threads} "
          f"torch threads): {raw.cpu_ms:.1f} ms CPU/query; wall p50 {percentile(raw.wall_ms, 50):.1f} ms, "
          f"p95 {percentile(raw.wall_ms, 95):.1f} ms")
    print(f"Ceiling: {cores} cores × 1000 / {raw.cpu_ms:.1f} ms = {raw.ceiling(cores):.1f} req/s")


def print_errors(runs: list[LoadRun]) -> None:
    for run in runs:
        for error, count in run.errors.items():
            print(f"  concurrency {run.concurrency}: {count} × {error}")


RETRIEVAL_COLUMNS = (f"{'conc':>5}{'requests':>9}{'errors':>7}{'req/s':>8}{'%ceil':>7}{'p50 ms':>8}{'p95 ms':>8}"
                     f"{'server p50':>11}{'web CPU ms/req':>15}{'load':>6}")
ANSWER_COLUMNS = (f"{'conc':>5}{'requests':>9}{'errors':>7}{'req/s':>8}{'p50 ms':>8}{'p95 ms':>8}{'TTFT p50':>9}"
                  f"{'retr. p50':>10}{'tokens p50':>11}{'max':>6}{'load':>6}")


def retrieval_row(ceiling: float) -> Callable[[LoadRun], None]:
    def print_row(run: LoadRun) -> None:
        print(f"{run.concurrency:>5}{len(run.replies):>9}{sum(run.errors.values()):>7}{run.requests_per_s:>8.1f}"
              f"{100 * run.requests_per_s / ceiling:>6.0f}%{_whole(run.latency(50)):>8}{_whole(run.latency(95)):>8}"
              f"{_whole(run.server_timing('retrieval', 50)):>11}{_whole(run.web_cpu_ms_per_request()):>15}"
              f"{run.load_average:>6.2f}")
    return print_row


def answer_tokens(run: LoadRun, model_path: str) -> list[int]:
    return [count_tokens(model_path, reply.answer) for reply in run.succeeded]


def answer_row(model_path: str) -> Callable[[LoadRun], None]:
    def print_row(run: LoadRun) -> None:
        tokens = answer_tokens(run, model_path)
        tokens_p50 = percentile(tokens, 50) if tokens else None
        print(f"{run.concurrency:>5}{len(run.replies):>9}{sum(run.errors.values()):>7}{run.requests_per_s:>8.2f}"
              f"{_whole(run.latency(50)):>8}{_whole(run.latency(95)):>8}{_whole(run.server_timing('ttft', 50)):>9}"
              f"{_whole(run.server_timing('retrieval', 50)):>10}{_whole(tokens_p50):>11}"
              f"{_whole(max(tokens, default=None)):>6}{run.load_average:>6.2f}")
    return print_row


def print_answer_length(runs: list[LoadRun], model_path: str) -> None:
    """The config caps answers at MAX_TOKENS; a longer answer means the cap was not applied, and the answer
    timings above are of answers that long."""
    longest = max((count for run in runs for count in answer_tokens(run, model_path)), default=0)
    if longest > MAX_TOKENS:
        print(f"Answers ran past the config's max_tokens of {MAX_TOKENS}: up to {longest} tokens (SmolLM2 "
              f"tokenizer, counted on the answer text).")


def print_verdict(runs: list[LoadRun], ceiling: float) -> None:
    best = max(runs, key=lambda run: run.requests_per_s)
    percent = 100 * best.requests_per_s / ceiling
    errors_at_target = sum(next(run for run in runs if run.concurrency == TARGET_CONCURRENCY).errors.values())
    met = percent >= TARGET_CEILING_PERCENT and errors_at_target == 0
    print(f"Target: retrieval >= {TARGET_CEILING_PERCENT:.0f}% of the {ceiling:.1f} req/s ceiling with 0 errors at "
          f"concurrency {TARGET_CONCURRENCY}: best {best.requests_per_s:.1f} req/s ({percent:.0f}%, concurrency "
          f"{best.concurrency}), {errors_at_target} errors at concurrency {TARGET_CONCURRENCY} -> "
          f"{'met' if met else 'MISSED'}")


def _counts(value: str) -> list[int]:
    counts = [int(count) for count in value.split(",")]
    if len(counts) != len(CONCURRENCY) or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"give {len(CONCURRENCY)} positive counts, one per concurrency level "
                                         f"{', '.join(map(str, CONCURRENCY))}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw-queries", type=int, default=200, help="queries embedded one at a time in process")
    parser.add_argument("--retrieve-requests", type=_counts, default="200,400,800",
                        help="/retrieve requests at concurrency 1,8,32")
    parser.add_argument("--chat-requests", type=_counts, default="8,16,32", help="/chat requests at concurrency 1,8,32")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # each row shows as soon as its level is done, even into a file

    cores = os.cpu_count()
    print_header("app_api", f"Requests per second and client-side p50/p95 latency of a published app's /retrieve "
                            f"(retrieval only; {args.retrieve_requests} requests) and /chat (full answers, "
                            f"max_tokens {MAX_TOKENS}; {args.chat_requests} requests) at concurrency "
                            f"{', '.join(map(str, CONCURRENCY))}, after a warm-up, every query a different "
                            f"question; against the raw CPU cost of one query embedding ({args.raw_queries} queries).")
    actor, workspace = _admin()
    kb = _indexed_knowledge_base(actor, workspace)
    app = _published_app(actor, workspace, kb)
    model_path = Model.objects.get(workspace=None, name=PRESET_MODEL).path
    count_tokens(model_path, "Load the tokenizer now: llama.cpp logs as it does, which would split a table below.")
    web_pid = _web_pid()
    print(f"Web process: {f'pid {web_pid}' if web_pid else 'not found under .run/ for this URL (no web CPU column)'}")
    questions = Questions()
    issued = _fresh_key(actor, app)
    try:
        print()
        raw = measure_raw_embedding(kb, questions.take(RAW_WARMUP_QUERIES + args.raw_queries),
                                   _web_torch_threads(web_pid))
        print_raw(raw, cores)
        ceiling = raw.ceiling(cores)
        base_url = f"{PLATFORM_URL}/api/apps/{app.slug}"

        print()
        print("Retrieval only, POST /retrieve (server p50: the pipeline's timings_ms.retrieval; web CPU: the web "
              "process's CPU time over the level, per request):")
        print(RETRIEVAL_COLUMNS)
        retrieval = run_levels(f"{base_url}/retrieve", issued.secret, questions, args.retrieve_requests,
                               RETRIEVE_WARMUP, CLIENT_TIMEOUT, web_pid, retrieval_row(ceiling))
        print_errors(retrieval)

        print()
        print("Full answers, POST /chat (TTFT and retrieval p50: the answers' timings_ms; tokens: the answers' length "
              "in SmolLM2 tokens):")
        print(ANSWER_COLUMNS)
        answers = run_levels(f"{base_url}/chat", issued.secret, questions, args.chat_requests, CHAT_WARMUP,
                             ANSWER_TIMEOUT, None, answer_row(model_path))
        print_errors(answers)
        print_answer_length(answers, model_path)
    finally:
        runtime_services.revoke_app_key(actor=actor, app_key=issued.app_key)
    print()
    print_verdict(retrieval, ceiling)


if __name__ == "__main__":
    main()
