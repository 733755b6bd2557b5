"""The index store at scale, for bench.ingest --scale and bench.retrieve: a store grown to each size in writes of 10k
chunks with the merges they call for, then the write rate of a batch of documents added at that size, in wall time
and the writing thread's CPU time (which other work on a shared box does not inflate)."""

import time

import numpy as np

from bench.helpers.synthetic import SyntheticChunks
from rag_studio.search.index_store import IndexStore

TARGET_PERCENT = 80.0
GROWTH_CHUNKS = 10_000  # chunks per write while growing a store to the next size
WRITE_DOCS, DOC_CHUNKS, WRITES = 8, 50, 5  # the measured batch: 5 writes of 8 documents of 50 chunks
BACKENDS = ("embedded", "pgvector")


class ScaleStore:
    """An index store grown to each size in turn; `new_ids(texts)` gives the chunk ids of new chunks (Chunk rows
    in bench.retrieve, a counter in bench.ingest --scale). Merges run in this thread after each write, timed in wall
    and process CPU seconds (faiss builds IVF indexes on every core)."""

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
