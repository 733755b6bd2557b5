"""Ingestion at scale on real Celery workers: documents uploaded through the upload path in batches of 25, as the
API receives them, and ingested by `scripts/proc.sh`'s processes (an ingestion worker with `--workers` pool processes,
the node worker and beat) on a private Redis and data dir. Then it checks that nothing was lost: no document failed,
every document's index entry is exactly its chunks, no index entry points at a deleted chunk, and a sample of
chunks is found by its own vector.

    .venv/bin/python -m bench.ingest --workers 2 --html [--docs 1200] [--keep]

With --html the corpus is large real HTML pages: every page of Debian's python3.11-doc (fetched into a cache when
missing; 530 pages, 67 MB) and generated manual pages (headings, paragraphs, tables, 3,000-8,000 words) up to --docs.
Reported before issue 12: 30 of about 1,200 such pages (2.6%) failed with two pool processes sharing one lease name.
"""

import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

# First: it sets Django up on a private data dir, which the project's models need.
from bench.helpers.private_instance import DATA_DIR, bench_workspace, print_header  # isort: skip

import numpy as np
from celery import current_app
from django.db.models import Count

from bench.helpers import rag_corpora
from bench.helpers.synthetic import Prose, corpus
from rag_studio import services
from rag_studio.models import Chunk, DocumentEvent, DocumentStatus
from rag_studio.pipeline.storage import UploadedFile
from rag_studio.search.stores import store_for

ROOT = Path(__file__).resolve().parent.parent
NODE = "bench-node"
BATCH = 25
SAMPLE_CHUNKS = 1000


def html_corpus(count: int) -> list[tuple[str, bytes]]:
    """Every python3.11-doc page, then generated manual pages up to `count`."""
    root = rag_corpora.docs()
    pages = sorted(root.rglob("*.html"))
    documents = [(str(page.relative_to(root)).replace("/", "__"), page.read_bytes()) for page in pages[:count]]
    prose, rng = Prose(seed=23), random.Random(23)
    while len(documents) < count:
        n = len(documents)
        sections = []
        for section in range(rng.randint(6, 14)):
            rows = "".join(f"<tr><td>{prose.title()}</td><td>{rng.randint(1, 9999)}</td><td>{prose.sentence()}</td>"
                           f"</tr>" for _ in range(rng.randint(0, 12)))
            paragraphs = "".join(f"<p>{prose.passage(rng.randint(80, 300))}</p>" for _ in range(rng.randint(3, 8)))
            sections.append(f"<h2>{n}.{section} {prose.title()}</h2>{paragraphs}"
                            + (f"<table><tr><th>Name</th><th>Code</th><th>Note</th></tr>{rows}</table>"
                               if rows else ""))
        page = (f"<html><head><title>{prose.title()}</title></head><body><nav>Manual index</nav>"
                f"<h1>Chapter {n}: {prose.title()}</h1>{''.join(sections)}"
                f"<footer>Manual page {n}</footer></body></html>")
        documents.append((f"manual-{n:05d}.html", page.encode()))
    return documents


class Platform:
    """The processes `make run` starts for ingestion, on a private Redis and this bench's data dir."""

    def __init__(self, workers: int):
        self.port = _free_port()
        self.redis_url = f"redis://127.0.0.1:{self.port}/0"
        subprocess.run(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                        "--appendonly", "no", "--daemonize", "yes", "--pidfile", str(DATA_DIR / "redis.pid"),
                        "--dir", str(DATA_DIR), "--logfile", str(DATA_DIR / "redis.log")], check=True)
        # This process sends to the same broker; nothing was sent yet, so the change takes.
        current_app.conf.broker_url = current_app.conf.result_backend = self.redis_url
        env = {**os.environ, "FACTORY_DATA_DIR": str(DATA_DIR), "REDIS_URL": self.redis_url,
               "FACTORY_NODE_NAME": NODE}
        env.pop("DATABASE_URL", None)
        celery = [sys.executable, "-m", "celery", "-A", "factory"]
        self.processes = {
            "worker": [*celery, "worker", "--queues", "ingest", "--hostname", f"worker@{NODE}", "--concurrency",
                       str(workers), "--loglevel", "INFO"],
            "node": [*celery, "worker", "--queues", f"default,node.{NODE}", "--hostname", f"node@{NODE}",
                     "--concurrency", "1", "--loglevel", "INFO"],
            "beat": [*celery, "beat", "--schedule", str(DATA_DIR / "celerybeat-schedule"), "--loglevel", "INFO"],
        }
        self.running = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=(DATA_DIR / f"{name}.log").open("wb"),
                                         stderr=subprocess.STDOUT, start_new_session=True)
                        for name, argv in self.processes.items()]
        deadline = time.monotonic() + 120
        while len(current_app.control.ping(destination=[f"worker@{NODE}", f"node@{NODE}"], timeout=1) or []) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"The workers did not start; see {DATA_DIR}/worker.log and node.log")

    def stop(self) -> None:
        for process in self.running:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"], capture_output=True)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(docs: int, workers: int, html: bool, words: int, timeout_min: float) -> None:
    files = html_corpus(docs) if html else corpus(docs, words)
    size = sum(len(content) for _, content in files)
    print_header("ingest (workers)", f"{len(files)} {'HTML pages' if html else 'documents'} ({size / 2**20:.0f} MB) "
                                     f"uploaded through services.upload_documents in batches of {BATCH} and ingested "
                                     f"by a Celery worker of {workers} pool processes, beside the node worker and "
                                     f"beat (private Redis and data dir); default chunking, local all-MiniLM-L6-v2.")
    actor, workspace = bench_workspace()
    # A bench stopped with TERM (not only Ctrl-C) still stops the workers, beat and Redis it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    platform = Platform(workers)
    try:
        kb = services.create_knowledge_base(actor=actor, workspace=workspace, name="corpus")
        started = time.perf_counter()
        for start in range(0, len(files), BATCH):
            services.upload_documents(actor=actor, kb=kb, uploads=[
                UploadedFile(name, io.BytesIO(content), len(content)) for name, content in files[start:start + BATCH]])
        uploaded_s = time.perf_counter() - started
        print(f"Uploaded {len(files)} documents in {uploaded_s:.0f} s", flush=True)
        wall_s = _wait(kb, started, timeout_min)
        _report(kb, wall_s)
    finally:
        platform.stop()


def _wait(kb, started: float, timeout_min: float) -> float:
    last_print = 0.0
    while True:
        counts = dict(kb.documents.values_list("status").annotate(n=Count("id")))
        pending = counts.get(DocumentStatus.QUEUED, 0) + counts.get(DocumentStatus.PROCESSING, 0)
        elapsed = time.perf_counter() - started
        if elapsed - last_print >= 60 or not pending:
            print(f"  {elapsed / 60:5.1f} min: " + ", ".join(f"{status} {n}" for status, n in sorted(counts.items())),
                  flush=True)
            last_print = elapsed
        if not pending:
            return elapsed
        if elapsed > timeout_min * 60:
            raise RuntimeError(f"Still {pending} documents pending after {timeout_min} minutes")
        time.sleep(5)


def _report(kb, wall_s: float) -> None:
    store = store_for(kb)
    documents = list(kb.documents.all())
    failed = [d for d in documents if d.status != DocumentStatus.INDEXED]
    chunk_ids = set(Chunk.objects.filter(knowledge_base=kb, searchable=True).values_list("pk", flat=True))
    mismatched = [d for d in documents if d.status == DocumentStatus.INDEXED and sorted(store.chunk_ids(str(d.pk)))
                  != sorted(d.chunks.filter(searchable=True).values_list("pk", flat=True))]
    indexed_ids = {chunk_id for d in documents for chunk_id in store.chunk_ids(str(d.pk))}
    dangling = indexed_ids - chunk_ids
    sample = random.Random(5).sample(sorted(chunk_ids & indexed_ids), min(SAMPLE_CHUNKS, len(chunk_ids & indexed_ids)))
    found = _found_by_own_vector(store, sample)
    events = DocumentEvent.objects.filter(document__knowledge_base=kb)
    rows = [
        ("documents", f"{len(documents)}"),
        ("failed", f"{len(failed)}" + "".join(f"\n    {d.filename}: {d.error}" for d in failed[:10])),
        ("chunks (searchable)", f"{len(chunk_ids)}"),
        ("chunks in the index", f"{store.count()}"),
        ("documents whose index entry is not exactly their chunks", f"{len(mismatched)}"),
        ("index entries pointing at deleted chunks", f"{len(dangling)}"),
        (f"sampled chunks found by their own vector (of {len(sample)})", f"{found}"),
        ("resumptions / re-embeddings logged", f"{events.filter(message__startswith='Resumed').count()} / "
                                               f"{events.filter(message__contains='embedding again').count()}"),
        ("wall time", f"{wall_s:.0f} s ({len(documents) / wall_s:.2f} documents/s, "
                      f"{len(chunk_ids) / wall_s:.1f} chunks/s)"),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    lost = len(failed) + len(mismatched) + len(dangling) + (len(sample) - found) + (len(chunk_ids) - store.count())
    print(f"Target: 0 failed and every chunk retrievable: {'met' if lost == 0 else 'MISSED'}")


def _found_by_own_vector(store, chunk_ids: list[int]) -> int:
    """How many chunks come back first (or tied first, with the same text) when searched by their own vector."""
    if not chunk_ids:
        return 0
    vectors = store.vectors(chunk_ids)
    texts = dict(Chunk.objects.filter(pk__in=chunk_ids).values_list("pk", "text"))
    found = 0
    for chunk_id, vector in zip(chunk_ids, vectors):
        hits = store.search_dense(np.asarray(vector), 5)
        best = hits[0][1]
        tied = [hit_id for hit_id, score in hits if score >= best - 1e-5]
        if chunk_id in tied or any(Chunk.objects.filter(pk=hit_id, text=texts[chunk_id]).exists() for hit_id in tied):
            found += 1
    return found
