"""Soak: mixed load on a running instance for --minutes at a fixed concurrency, sampling the memory (RSS) of every
process of the platform, to find errors that only show over time and memory that only grows.

    .venv/bin/python -m bench.soak [--minutes 30] [--concurrency 4] [--warmup-minutes 5] [--upload-every-s 20]

Against `make run` (FACTORY_URL and the data dir from .run/env). The load, in the admin's first workspace:
- `--concurrency` threads, each taking turns at: a streamed chat through the gateway (SmolLM2 preset), a hit test
  (`POST /api/rag/knowledge-bases/<id>/hit-test/`), and an answer from a published app (`POST /api/apps/<slug>/chat`);
- one more thread uploading a generated document every `--upload-every-s` through the upload API, each of which
  must end indexed.
Every 10 s it reads the RSS of each process `make run` started (.run/*.pid) with its children (uvicorn's workers,
the Celery pools) and of each engine replica. Targets: 0 errors, and no process (nor the total) more than 10% above
its RSS at the end of the warm-up. The knowledge base, app and keys it made are deleted at the end.
"""

import argparse
import io
import json
import random
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
import psutil

# First: it reads the instance's settings and sets Django up, which the project's models need.
from bench.helpers.running_instance import ADMIN_USERNAME, PLATFORM_URL, PRESET_MODEL, REPO_ROOT, print_header
from serving.metrics import percentile

# isort: split

from django.contrib.auth import get_user_model

from accounts.models import Workspace
from accounts.services import Actor, create_api_key, revoke_api_key
from rag_studio import services as rag_services
from rag_studio.models import DocumentStatus, RagTemplate
from rag_studio.pipeline.storage import UploadedFile
from runtime import services as runtime_services
from serving.models import Replica

NAME = "bench-soak"
SAMPLES = REPO_ROOT / "rag_studio" / "samples"
SAMPLE_FILES = ("northwind-employee-handbook.pdf", "northwind-product-guide.docx", "northwind-support-faq.md")
SAMPLE_EVERY_S = 10
TARGET_GROWTH_PERCENT = 10.0
TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=300.0)
QUESTIONS = ("How many days of annual leave do employees get?", "What does error code E204 mean?",
             "How long is the warranty?", "How do I reset the NW-7 robot?", "What is the robot's payload?",
             "保修期是多久？", "Who do I contact for support?", "How are expenses claimed?")


@dataclass
class Tally:
    latencies_ms: dict = field(default_factory=lambda: defaultdict(list))
    errors: dict = field(default_factory=lambda: defaultdict(list))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, started: float, error: str = "") -> None:
        with self.lock:
            if error:
                self.errors[kind].append(error[:200])
            else:
                self.latencies_ms[kind].append(1000 * (time.perf_counter() - started))


class Setup:
    """The soak's knowledge base (the three samples), an app over it, and keys: made fresh, removed at the end."""

    def __init__(self):
        admin = get_user_model().objects.get(username=ADMIN_USERNAME)
        self.actor = Actor(user=admin)
        self.workspace = Workspace.objects.filter(memberships__user=admin).order_by("memberships__created_at").first()
        leftover = self.workspace.knowledge_bases.filter(name=NAME).first()
        if leftover is not None:
            rag_services.delete_knowledge_base(actor=self.actor, kb=leftover)
        self.kb = rag_services.create_knowledge_base(actor=self.actor, workspace=self.workspace, name=NAME)
        rag_services.upload_documents(actor=self.actor, kb=self.kb, uploads=[
            UploadedFile(name, io.BytesIO((SAMPLES / name).read_bytes()), (SAMPLES / name).stat().st_size)
            for name in SAMPLE_FILES])
        self.wait_indexed(len(SAMPLE_FILES))
        config = rag_services.save_rag_config(actor=self.actor, workspace=self.workspace, name=NAME,
                                              knowledge_base=self.kb, template=RagTemplate.CITATIONS,
                                              model=PRESET_MODEL, generation={"temperature": 0, "max_tokens": 48})
        self.app = runtime_services.publish_app(actor=self.actor, config=config, slug=NAME)
        self.app_key = runtime_services.create_app_key(actor=self.actor, app=self.app, name=NAME,
                                                       rate_limit=runtime_services.MAX_RATE_LIMIT).secret
        self.api_key = create_api_key(actor=self.actor, workspace=self.workspace, name=NAME)

    def wait_indexed(self, count: int, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while self.kb.documents.filter(status=DocumentStatus.INDEXED).count() < count:
            failed = self.kb.documents.filter(status=DocumentStatus.FAILED).first()
            if failed is not None:
                raise RuntimeError(f"{failed.filename} failed: {failed.error}")
            if time.monotonic() > deadline:
                raise RuntimeError("The worker did not index the soak's documents")
            time.sleep(1)

    def tear_down(self) -> None:
        revoke_api_key(actor=self.actor, api_key=self.api_key.api_key)
        runtime_services.delete_app(actor=self.actor, app=self.app)
        rag_services.delete_knowledge_base(actor=self.actor, kb=self.kb)


def _chat(client: httpx.Client, setup: Setup, rng: random.Random) -> None:
    body = {"model": PRESET_MODEL, "stream": True, "max_tokens": 48,
            "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}]}
    with client.stream("POST", f"{PLATFORM_URL}/v1/chat/completions", json=body,
                       headers={"Authorization": f"Bearer {setup.api_key.secret}"}) as reply:
        reply.raise_for_status()
        lines = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    # An error is an event with an "error" key; the model's own words may well say "error" (a question asks it to).
    errors = [line for line in lines[:-1] if "error" in json.loads(line)]
    if errors:
        raise RuntimeError(f"an error event: {errors[0][:200]}")
    if not lines or lines[-1] != "[DONE]":
        raise RuntimeError(f"the stream ended without [DONE]: {lines[-1:]}")


def _retrieve(client: httpx.Client, setup: Setup, rng: random.Random) -> None:
    reply = client.post(f"{PLATFORM_URL}/api/rag/knowledge-bases/{setup.kb.pk}/hit-test/",
                        json={"query": rng.choice(QUESTIONS)},
                        headers={"Authorization": f"Bearer {setup.api_key.secret}"})
    reply.raise_for_status()
    if not reply.json()["hits"]:
        raise RuntimeError("no hits")


def _app(client: httpx.Client, setup: Setup, rng: random.Random) -> None:
    reply = client.post(f"{PLATFORM_URL}/api/apps/{setup.app.slug}/chat", json={"query": rng.choice(QUESTIONS)},
                        headers={"Authorization": f"Bearer {setup.app_key}"})
    reply.raise_for_status()
    if not reply.json().get("answer", "").strip():
        raise RuntimeError("an empty answer")


KINDS = {"chat": _chat, "retrieve": _retrieve, "app": _app}


def _load(setup: Setup, tally: Tally, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    kinds = list(KINDS)
    turn = seed
    with httpx.Client(timeout=TIMEOUT) as client:
        while not stop.is_set():
            kind = kinds[turn % len(kinds)]
            turn += 1
            started = time.perf_counter()
            try:
                KINDS[kind](client, setup, rng)
                tally.record(kind, started)
            except Exception as exc:  # every failure is counted and shown, whatever it is
                tally.record(kind, started, f"{exc.__class__.__name__}: {exc}")


def _uploads(setup: Setup, tally: Tally, stop: threading.Event, every_s: float, uploaded: list[int]) -> None:
    rng = random.Random(99)
    with httpx.Client(timeout=TIMEOUT) as client:
        n = 0
        while not stop.wait(every_s):
            n += 1
            text = "\n\n".join(f"Soak note {n}.{i}: the {rng.choice(['NW-7', 'NW-9', 'console', 'charger'])} "
                               f"reported code E{rng.randint(100, 999)} at {rng.randint(0, 23)}:00."
                               for i in range(rng.randint(20, 200)))
            started = time.perf_counter()
            try:
                reply = client.post(f"{PLATFORM_URL}/api/rag/knowledge-bases/{setup.kb.pk}/documents/",
                                    files={"files": (f"soak-{n:04d}.txt", text.encode())},
                                    headers={"Authorization": f"Bearer {setup.api_key.secret}"})
                reply.raise_for_status()
                uploaded.append(reply.json()[0]["document"]["id"])
                tally.record("upload", started)
            except Exception as exc:
                tally.record("upload", started, f"{exc.__class__.__name__}: {exc}")


def platform_processes() -> dict[str, list[psutil.Process]]:
    """Each process `make run` started, with its children; and each engine replica on this machine."""
    found = {}
    for pid_file in sorted((REPO_ROOT / ".run").glob("*.pid")):
        try:
            root = psutil.Process(int(pid_file.read_text().strip()))
            found[pid_file.stem] = [root, *root.children(recursive=True)]
        except (ValueError, psutil.Error):
            continue
    for replica in Replica.objects.exclude(pid=None).select_related("deployment"):
        try:
            found[f"replica {replica.deployment.name}#{replica.pk}"] = [psutil.Process(replica.pid)]
        except psutil.Error:
            continue
    return found


def rss_by_process() -> dict[str, int]:
    sizes = {}
    for name, processes in platform_processes().items():
        total = 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except psutil.Error:
                continue
        sizes[name] = total
    return sizes


def _sample(samples: list[tuple[float, dict]], stop: threading.Event, started: float) -> None:
    while True:
        samples.append((time.monotonic() - started, rss_by_process()))
        if stop.wait(SAMPLE_EVERY_S):
            return


def _growth(before: int, after: int) -> float:
    """Percent growth from `before` to `after` (0 for a process that was not there before)."""
    return 100 * (after - before) / before if before else 0.0


def report(tally: Tally, samples: list[tuple[float, dict]], warmup_s: float, documents: dict) -> bool:
    print(f"{'load':<10}{'requests':>10}{'errors':>8}{'p50 ms':>10}{'p95 ms':>10}")
    errors = 0
    for kind in [*KINDS, "upload"]:
        values, failed = tally.latencies_ms[kind], tally.errors[kind]
        errors += len(failed)
        p50 = f"{statistics.median(values):.0f}" if values else "-"
        p95 = f"{percentile(values, 95):.0f}" if len(values) >= 2 else "-"
        print(f"{kind:<10}{len(values) + len(failed):>10}{len(failed):>8}{p50:>10}{p95:>10}")
        for message in sorted(set(failed))[:5]:
            print(f"    {failed.count(message)} x {message}")
    print(f"documents uploaded {documents['uploaded']}: indexed {documents['indexed']}, failed {documents['failed']}, "
          f"still pending {documents['pending']}")
    errors += documents["failed"] + documents["pending"]
    after = [sample for at, sample in samples if at >= warmup_s]
    if len(after) < 2:
        print("Not enough samples after the warm-up to judge memory.")
        return False
    first, middle, last = after[0], after[len(after) // 2], after[-1]
    # The second half's growth tells a bounded cache that filled early (about 0) from a leak (still growing).
    print(f"RSS (MiB) at the end of the warm-up ({warmup_s / 60:.0f} min), halfway, at the end, peak after warm-up; "
          f"growth after the warm-up and in the second half:")
    growths = []
    for name in sorted(set(first) | set(last)):
        start, half, end = first.get(name, 0), middle.get(name, 0), last.get(name, 0)
        peak = max(sample.get(name, 0) for sample in after)
        growths.append(_growth(start, end))
        print(f"  {name:<34}{start / 2**20:>9.0f}{half / 2**20:>9.0f}{end / 2**20:>9.0f}{peak / 2**20:>9.0f}"
              f"   {growths[-1]:+.1f}%  {_growth(half, end):+.1f}%")
    total_start, total_half, total_end = sum(first.values()), sum(middle.values()), sum(last.values())
    total_growth = _growth(total_start, total_end)
    print(f"  {'total':<34}{total_start / 2**20:>9.0f}{total_half / 2**20:>9.0f}{total_end / 2**20:>9.0f}{'':>9}"
          f"   {total_growth:+.1f}%  {_growth(total_half, total_end):+.1f}%")
    met = errors == 0 and max([total_growth, *growths]) < TARGET_GROWTH_PERCENT
    print(f"Targets: 0 errors ({errors}), memory growth < {TARGET_GROWTH_PERCENT:.0f}% after warm-up "
          f"(largest {max([total_growth, *growths]):+.1f}%): {'met' if met else 'MISSED'}")
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup-minutes", type=float, default=5)
    parser.add_argument("--upload-every-s", type=float, default=20)
    args = parser.parse_args()
    print_header("soak", f"{args.minutes:.0f} minutes of chat (streamed, gateway), hit tests and app answers taking "
                         f"turns on {args.concurrency} threads, plus an upload every {args.upload_every_s:.0f} s; "
                         f"RSS of every platform process every {SAMPLE_EVERY_S} s, judged from the end of a "
                         f"{args.warmup_minutes:.0f}-minute warm-up.")
    setup = Setup()
    tally, samples, uploaded, stop = Tally(), [], [], threading.Event()
    started = time.monotonic()
    threads = [threading.Thread(target=_sample, args=(samples, stop, started), daemon=True),
               threading.Thread(target=_uploads, args=(setup, tally, stop, args.upload_every_s, uploaded),
                                daemon=True)]
    threads += [threading.Thread(target=_load, args=(setup, tally, stop, seed), daemon=True)
                for seed in range(args.concurrency)]
    try:
        for thread in threads:
            thread.start()
        stop.wait(args.minutes * 60)
        stop.set()
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + 300
        while (setup.kb.documents.filter(pk__in=uploaded, status__in=[DocumentStatus.QUEUED,
                                                                      DocumentStatus.PROCESSING]).exists()
               and time.monotonic() < deadline):
            time.sleep(2)
        statuses = list(setup.kb.documents.filter(pk__in=uploaded).values_list("status", flat=True))
        documents = {"uploaded": len(uploaded), "indexed": statuses.count(DocumentStatus.INDEXED),
                     "failed": statuses.count(DocumentStatus.FAILED),
                     "pending": sum(status in (DocumentStatus.QUEUED, DocumentStatus.PROCESSING)
                                    for status in statuses)}
        report(tally, samples, args.warmup_minutes * 60, documents)
    finally:
        stop.set()
        setup.tear_down()


if __name__ == "__main__":
    main()
