"""Retrieval latency and recall at scale: dense, keyword and hybrid search through the real query path,
`rag_studio.search.retrieval.retrieve(kb, query, {"mode": ...})` (query embedding with the local all-MiniLM-L6-v2, both
indexes, fusion, loading the hit chunks from the database), over one knowledge base grown to each size in turn
(10k, 100k by default; 1M with --sizes), with the dense side searched exactly and, where a segment holds an IVF
index (FACTORY_RAG_INDEX_ANN_THRESHOLD), approximately; and the index store's write rate at each size.

    .venv/bin/python -m bench.retrieve [--sizes 10000,100000,1000000] [--runs 100] [--backend embedded|pgvector]
                                       [--keep]

Embedding a million chunks would take days here, so the chunks are SyntheticChunks (bench/helpers/synthetic.py):
384-d unit vectors around topic centres (dense search costs the same whatever the vectors say; recall needs them
clustered as real embeddings are) and texts from generated prose, stored as real Chunk rows so that keyword search
and hydration do their real work. recall@10 compares IVF's top 10 with exact search's for 200 query vectors drawn
like the chunks'. Self-contained: a private instance (bench/helpers/private_instance.py).
"""

import argparse
import hashlib
import statistics
import time

# First: it sets Django up on a private data dir, which the project's models need.
from bench.helpers.private_instance import bench_workspace, clean_up, print_header, use_backend  # isort: skip

from django.test import override_settings

from bench.helpers.index_scale import BACKENDS, ScaleStore, print_scale_header, print_scale_row, print_scale_target
from bench.helpers.synthetic import Prose, SyntheticChunks
from rag_studio import services
from rag_studio.models import Chunk, Document, DocumentStatus, KnowledgeBase, Stage
from rag_studio.pipeline.parsing import file_kind
from rag_studio.search.retrieval import retrieve
from rag_studio.search.retrieval_config import DEFAULT_RETRIEVAL
from rag_studio.search.stores import store_for
from serving.metrics import percentile

MODES = ("dense", "keyword", "hybrid")
TIMINGS = ("embed", "dense", "keyword", "fuse", "total")
QUERIES = 50
RECALL_QUERIES = 200
TARGET_P95_MS, TARGET_RECALL = 50.0, 0.95
QUERY_FORMS = ("{}", "what is {}?", "how does {} work", "why {} matters", "{} and its effects")


class ChunkRows:
    """Makes the Chunk rows (and an indexed Document owning them) of each write's texts; returns their ids."""

    def __init__(self, kb: KnowledgeBase):
        self.kb, self.documents = kb, 0

    def __call__(self, texts: list[str]) -> list[int]:
        filename = f"group-{self.documents:05d}.txt"
        sha256 = hashlib.sha256(f"{self.kb.pk}-{self.documents}".encode()).hexdigest()
        self.documents += 1
        document = Document.objects.create(
            knowledge_base=self.kb, filename=filename, kind=file_kind(filename), size_bytes=sum(map(len, texts)),
            sha256=sha256, status=DocumentStatus.INDEXED, stage=Stage.DONE, progress=100, chunk_count=len(texts))
        rows = Chunk.objects.bulk_create([
            Chunk(knowledge_base=self.kb, document=document, ordinal=ordinal, text=text, start=0, end=len(text))
            for ordinal, text in enumerate(texts)])
        return [row.pk for row in rows]


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


def recall_at_10(kb: KnowledgeBase, chunks: SyntheticChunks) -> float:
    store, hits = store_for(kb), 0
    for vector in chunks.vectors(RECALL_QUERIES):
        with override_settings(RAG_INDEX_ANN_SEARCH=False):
            exact = {chunk_id for chunk_id, _ in store.search_dense(vector, 10)}
        hits += len(exact & {chunk_id for chunk_id, _ in store.search_dense(vector, 10)})
    return hits / (10 * RECALL_QUERIES)


def print_latencies(rows: list[tuple]) -> None:
    print(f"{'backend':<10}{'index':<7}{'chunks':>9}  {'mode':<8}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}"
          f"{'hits/query':>12}{'recall@10':>11}")
    for backend, method, size, mode, values, hits, recall in rows:
        print(f"{backend:<10}{method:<7}{size:>9}  {mode:<8}{percentile(values, 50):>9.2f}"
              f"{percentile(values, 95):>9.2f}{statistics.mean(values):>9.2f}{hits / len(values):>12.2f}"
              f"{recall:>11.3f}")


def print_breakdown(breakdowns: list[tuple[str, int, list[dict]]]) -> None:
    print("hybrid timings_ms, medians (fuse includes loading the hits from the database):")
    print(f"{'index':<7}{'chunks':>9}  " + "".join(f"{name:>9}" for name in TIMINGS))
    for method, size, timings in breakdowns:
        print(f"{method:<7}{size:>9}  " + "".join(f"{statistics.median(t[name] for t in timings):>9.2f}"
                                                  for name in TIMINGS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated chunk counts, growing")
    parser.add_argument("--runs", type=int, default=100, help="measured queries per mode, index and size")
    parser.add_argument("--backend", choices=BACKENDS, default="embedded", help="the index store")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    args = parser.parse_args()
    try:
        use_backend(args.backend)
        run([int(size) for size in args.sizes.split(",")], args.runs, args.backend)
    finally:
        clean_up(args.keep)


def run(sizes: list[int], runs: int, backend: str) -> None:
    print_header("retrieve", f"Latency of rag_studio.search.retrieval.retrieve per mode (a new knowledge base's "
                             f"settings: {DEFAULT_RETRIEVAL['candidates']} candidates, {DEFAULT_RETRIEVAL['fusion']} "
                             f"fusion ({DEFAULT_RETRIEVAL['normalisation']}), top 5, no rerank), {QUERIES} queries, "
                             f"modes taking turns, {runs} measured runs per mode, index and size after one warm-up "
                             f"pass; one knowledge base of synthetic chunks grown to each size; {backend} store.")
    actor, workspace = bench_workspace()
    questions = queries(Prose(seed=11))
    kb = services.create_knowledge_base(actor=actor, workspace=workspace, name="synthetic")
    chunks = SyntheticChunks()
    scale = ScaleStore(store_for(kb), chunks, ChunkRows(kb))
    rates, rows = [], []
    for size in sizes:  # each size's figures printed as soon as measured: the 1M one takes a while
        started = time.perf_counter()
        scale.grow_to(size)
        print(f"Grew to {size} chunks (rows and index) in {time.perf_counter() - started:.1f} s")
        rate = scale.write_rate()
        print_scale_header()
        rates.append((size, print_scale_row(backend, size, rate, scale)))
        approximate = store_for(kb).search_method()  # "ivf" (embedded, large segments), "hnsw" (pgvector)
        methods = ["exact", *([approximate] if approximate != "exact" else [])]
        size_rows, breakdowns = [], []
        for method in methods:
            with override_settings(RAG_INDEX_ANN_SEARCH=method != "exact"):
                recall = recall_at_10(kb, chunks) if method != "exact" else 1.0
                latencies, hits, hybrid_timings = measure(kb, questions, runs)
            size_rows += [(backend, method, size, mode, latencies[mode], hits[mode], recall) for mode in MODES]
            breakdowns.append((method, size, hybrid_timings))
        print_latencies(size_rows)
        print_breakdown(breakdowns)
        rows += size_rows
    print_scale_target(rates)
    largest = max(sizes)
    for row_backend, method, size, mode, values, _, recall in rows:
        if size == largest and mode == "hybrid":
            p95 = percentile(values, 95)
            met = p95 <= TARGET_P95_MS and (method == "exact" or recall >= TARGET_RECALL)
            recall_target = " and recall@10 >= 0.95" if method != "exact" else ""
            print(f"Target: hybrid p95 <= {TARGET_P95_MS:.0f} ms{recall_target} "
                  f"at {size} chunks, {method}: {p95:.2f} ms, recall {recall:.3f}: {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
