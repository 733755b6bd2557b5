"""Retrieval latency: dense, keyword and hybrid search through the real query path,
`rag_studio.search.retrieval.retrieve(kb, query, {"mode": ...})` (query embedding with the local all-MiniLM-L6-v2, both
indexes, fusion, loading the hit chunks from the database), over knowledge bases of 10k and 100k chunks.

    .venv/bin/python -m bench.retrieve [--sizes 10000,100000] [--runs 200] [--keep]

Embedding 100k chunks would take an hour, so the indexes hold random unit vectors: dense search costs the same
whatever the vectors say. The chunk texts are generated prose (60–120 words) and real Chunk rows, so keyword
search and hydration do their real work. Each index is written in one IndexStore.apply of a few large owner
groups, one Document row per group. Self-contained like bench.ingest, whose private environment it shares.
"""

import argparse
import hashlib
import statistics
import time

import numpy as np

from bench.ingest import Prose, bench_workspace, clean_up, print_header
from rag_studio import services
from rag_studio.models import Chunk, Document, DocumentStatus, KnowledgeBase, Stage
from rag_studio.pipeline.parsing import file_kind
from rag_studio.search.index_store import store_for
from rag_studio.search.retrieval import retrieve
from rag_studio.search.retrieval_config import DEFAULT_RETRIEVAL
from rag_studio.vectors import normalised
from serving.metrics import percentile

MODES = ("dense", "keyword", "hybrid")
TIMINGS = ("embed", "dense", "keyword", "fuse", "total")
GROUP_CHUNKS = 10_000
QUERIES = 50
TARGET_SIZE, TARGET_P95_MS = 100_000, 50.0
QUERY_FORMS = ("{}", "what is {}?", "how does {} work", "why {} matters", "{} and its effects")


def synthetic_kb(actor, workspace, size: int, prose: Prose) -> KnowledgeBase:
    kb = services.create_knowledge_base(actor=actor, workspace=workspace, name=f"synthetic-{size}")
    rng = np.random.default_rng(size)
    upserts = {}
    for start in range(0, size, GROUP_CHUNKS):
        texts = [prose.sentences(int(rng.integers(60, 121))) for _ in range(min(GROUP_CHUNKS, size - start))]
        document = _group_document(kb, start // GROUP_CHUNKS, texts)
        rows = Chunk.objects.bulk_create([
            Chunk(knowledge_base=kb, document=document, ordinal=ordinal, text=text, start=0, end=len(text))
            for ordinal, text in enumerate(texts)])
        vectors = _unit_vectors(rng, len(texts), kb.embedding_dimensions)
        upserts[str(document.pk)] = ([row.pk for row in rows], vectors, texts)
    store_for(kb).apply(upserts=upserts)
    return kb


def _group_document(kb: KnowledgeBase, group: int, texts: list[str]) -> Document:
    """An indexed Document row that owns a group of chunks, so hits hydrate with a filename."""
    filename, sha256 = f"group-{group:03d}.txt", hashlib.sha256(f"{kb.pk}-{group}".encode()).hexdigest()
    return Document.objects.create(
        knowledge_base=kb, filename=filename, kind=file_kind(filename), size_bytes=sum(map(len, texts)),
        sha256=sha256, status=DocumentStatus.INDEXED, stage=Stage.DONE, progress=100, chunk_count=len(texts))


def _unit_vectors(rng: np.random.Generator, count: int, dimension: int) -> np.ndarray:
    return normalised(rng.standard_normal((count, dimension), dtype=np.float32))


def queries(prose: Prose) -> list[str]:
    """Questions and keyword lists of 1–6 content words, drawn like the chunk texts' (frequent words included)."""
    return [QUERY_FORMS[i % len(QUERY_FORMS)].format(" ".join(prose.content_words(1 + i % 6)))
            for i in range(QUERIES)]


def measure(kb: KnowledgeBase, questions: list[str], runs: int) -> tuple[dict[str, list[float]], dict[str, int],
                                                                         list[dict]]:
    """Client-side latency in ms and hits returned per mode, and the hybrid runs' timings_ms. The modes take
    turns on each query, so that noise from the shared machine falls on all three alike."""
    for question in questions:  # warm-up: loads the index generation and touches every code path
        for mode in MODES:
            retrieve(kb, question, {"mode": mode})
    latencies, hits, hybrid_timings = {mode: [] for mode in MODES}, dict.fromkeys(MODES, 0), []
    for run in range(runs):
        for mode in MODES:
            started = time.perf_counter()
            result = retrieve(kb, questions[run % len(questions)], {"mode": mode})
            latencies[mode].append(1000 * (time.perf_counter() - started))
            hits[mode] += len(result.hits)
            if mode == "hybrid":
                hybrid_timings.append(result.timings_ms)
    return latencies, hits, hybrid_timings


def print_latencies(rows: list[tuple[int, str, list[float], int]]) -> None:
    print(f"{'chunks':>8}  {'mode':<8}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}{'hits/query':>12}")
    for size, mode, values, hits in rows:
        print(f"{size:>8}  {mode:<8}{percentile(values, 50):>9.2f}{percentile(values, 95):>9.2f}"
              f"{statistics.mean(values):>9.2f}{hits / len(values):>12.2f}")


def print_breakdown(breakdowns: list[tuple[int, list[dict]]]) -> None:
    print("hybrid timings_ms, medians (fuse includes loading the hits from the database):")
    print(f"{'chunks':>8}  " + "".join(f"{name:>9}" for name in TIMINGS))
    for size, timings in breakdowns:
        print(f"{size:>8}  " + "".join(f"{statistics.median(t[name] for t in timings):>9.2f}" for name in TIMINGS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated chunk counts")
    parser.add_argument("--runs", type=int, default=200, help="measured queries per mode and size")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    args = parser.parse_args()
    try:
        run([int(size) for size in args.sizes.split(",")], args.runs)
    finally:
        clean_up(args.keep)


def run(sizes: list[int], runs: int) -> None:
    print_header("retrieve", f"Latency of rag_studio.search.retrieval.retrieve per mode (a new knowledge base's "
                             f"settings: {DEFAULT_RETRIEVAL['candidates']} candidates, {DEFAULT_RETRIEVAL['fusion']} "
                             f"fusion ({DEFAULT_RETRIEVAL['normalisation']}), top 5, no rerank), {QUERIES} queries, "
                             f"modes taking turns, {runs} measured runs per mode and size after one warm-up pass. "
                             f"Indexes of random unit vectors and generated 60-120-word chunk texts.")
    actor, workspace = bench_workspace()
    prose = Prose(seed=11)
    questions = queries(prose)
    rows, breakdowns = [], []
    for size in sizes:
        started = time.perf_counter()
        kb = synthetic_kb(actor, workspace, size, prose)
        print(f"Built {size} chunks (rows and index) in {time.perf_counter() - started:.1f} s")
        latencies, hits, hybrid_timings = measure(kb, questions, runs)
        rows += [(size, mode, latencies[mode], hits[mode]) for mode in MODES]
        breakdowns.append((size, hybrid_timings))
    print_latencies(rows)
    print_breakdown(breakdowns)
    for size, mode, values, _ in rows:
        if size == TARGET_SIZE and mode == "hybrid":
            p95 = percentile(values, 95)
            print(f"Target: hybrid p95 < {TARGET_P95_MS:.0f} ms at {TARGET_SIZE} chunks: {p95:.2f} ms, "
                  f"{'met' if p95 < TARGET_P95_MS else 'MISSED'}")


if __name__ == "__main__":
    main()
