"""Segments: what one write added or one merge rewrote, written once and never modified, with their deletes files
(tombstones) and, past RAG_INDEX_ANN_THRESHOLD rows, an IVF index."""

import json
import math
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import faiss
import numpy as np
from django.conf import settings
from scipy import sparse

from rag_studio.search.embedded.layout import DELETES_PREFIX, fsync_directory, fsync_tree, save_array
from rag_studio.search.index_store import OwnerBatch

# Rows of an IVF segment scored exactly for the query's mean and spread there (fusion's z-scores).
STATS_SAMPLE_ROWS = 4096
# IVF: about sqrt(rows) clusters, trained by k-means on this many rows per cluster.
ANN_TRAINING_ROWS_PER_LIST = 64


@dataclass
class SegmentContents:
    """A segment as its writer builds it."""

    chunk_ids: np.ndarray  # int64 [n]
    vectors: np.ndarray  # float32 [n, dimension]
    owners: dict[str, list[int]]  # owner -> rows
    term_counts: sparse.csr_array  # int32 [n, vocabulary]
    vocabulary: list[str]

    @classmethod
    def from_batches(cls, batches: list[OwnerBatch], dimension: int) -> "SegmentContents":
        owners, start = {}, 0
        for batch in batches:
            if len(batch.chunk_ids):
                owners[batch.owner] = list(range(start, start + len(batch.chunk_ids)))
                start += len(batch.chunk_ids)
        rows = [row for batch in batches for row in batch.tokens]
        columns: dict[str, int] = {}
        tokens = np.fromiter((columns.setdefault(token, len(columns)) for row in rows for token in row), np.int32)
        offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows], dtype=np.int64)])
        counts = sparse.csr_array((np.ones(len(tokens), np.int32), tokens, offsets), shape=(len(rows), len(columns)))
        counts.sum_duplicates()
        return cls(np.concatenate([batch.chunk_ids for batch in batches]),
                   np.concatenate([batch.vectors for batch in batches]).reshape(-1, dimension),
                   owners, counts, list(columns))

    @classmethod
    def merged(cls, parts: list["Part"], dimension: int) -> "SegmentContents":
        """The live rows of `parts`, in order, their tokens renumbered into one vocabulary of the tokens in use."""
        columns: dict[str, int] = {}
        chunk_ids, vectors, owners, counts, start = [], [], {}, [], 0
        for part in parts:
            segment, live = part.segment, part.live_rows
            new_row = np.full(segment.rows, -1, np.int64)
            new_row[live] = np.arange(start, start + len(live))
            for owner, rows in segment.owners.items():
                kept = new_row[rows]
                if (kept >= 0).any():
                    owners.setdefault(owner, []).extend(kept[kept >= 0].tolist())
            chunk_ids.append(segment.chunk_ids[live])
            vectors.append(np.asarray(segment.vectors[live]))
            rows = sparse.csr_array(segment.postings.tocsr()[live])
            used = np.unique(rows.indices)
            renumber = np.zeros(len(segment.vocabulary), np.int32)
            renumber[used] = [columns.setdefault(segment.vocabulary[column], len(columns)) for column in used]
            counts.append((rows.data, renumber[rows.indices], rows.indptr))
            start += len(live)
        matrices = [sparse.csr_array(triple, shape=(len(triple[2]) - 1, len(columns))) for triple in counts]
        return cls(np.concatenate(chunk_ids) if chunk_ids else np.empty(0, np.int64),
                   np.concatenate(vectors).reshape(-1, dimension) if vectors else np.empty((0, dimension), np.float32),
                   owners, sparse.vstack(matrices, format="csr", dtype=np.int32) if matrices else
                   sparse.csr_array((0, 0), dtype=np.int32), list(columns))

    def write(self, root: Path, name: str, staging_prefix: str) -> None:
        """Write the segment in a staging dir, fsync it and rename it to `name`."""
        with staged_segment(root, name, staging_prefix) as staging:
            save_array(staging / "chunk_ids.npy", self.chunk_ids)
            save_array(staging / "vectors.npy", self.vectors)
            (staging / "owners.json").write_text(json.dumps(self.owners, sort_keys=True), encoding="utf-8")
            sparse.save_npz(staging / "term_counts.npz", sparse.csc_array(self.term_counts), compressed=False)
            (staging / "vocabulary.json").write_text(json.dumps(self.vocabulary, ensure_ascii=False),
                                                     encoding="utf-8")
            write_ann(staging, self.vectors)


@contextmanager
def staged_segment(root: Path, name: str, staging_prefix: str) -> Iterator[Path]:
    """A staging dir to write a segment's files in; fsynced and renamed to `name` once they are written."""
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix, dir=root))
    staging.chmod(0o755)  # mkdtemp makes it owner-only; web processes may run as another user
    yield staging
    fsync_tree(staging)
    os.rename(staging, root / name)
    fsync_directory(root)


def write_ann(directory: Path, vectors: np.ndarray) -> None:
    if len(vectors) >= settings.RAG_INDEX_ANN_THRESHOLD:
        with open(directory / "ann.faiss", "wb") as file:  # what faiss.write_index writes, with Python's errors
            file.write(memoryview(faiss.serialize_index(_ivf_index(vectors))))


def _ivf_index(vectors: np.ndarray) -> faiss.IndexIVFFlat:
    """IVF-Flat over the rows (ids = row numbers): about sqrt(rows) clusters from k-means on a fixed sample.
    Chosen over HNSW by measurement on this 2-core box (clustered 384-d vectors): IVF builds 100k in 2 s, HNSW
    (M=32, efConstruction 40) took 6.5 s for 20k alone, and every merge rebuilds the index; IVF's recall@10 at 100k
    was 0.97-0.98 with 16-32 probes, 1.4-2.3 ms a query on one thread."""
    rows, dimension = vectors.shape
    lists = max(1, int(math.sqrt(rows)))
    quantizer = faiss.IndexFlatIP(dimension)
    index = faiss.IndexIVFFlat(quantizer, dimension, lists, faiss.METRIC_INNER_PRODUCT)
    index.cp.niter = 10
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(rows, min(rows, lists * ANN_TRAINING_ROWS_PER_LIST), replace=False))
    index.train(np.ascontiguousarray(vectors[sample]))
    index.add(np.ascontiguousarray(vectors))
    return index


def write_deletes(directory: Path, number: int, rows: np.ndarray) -> str:
    name = f"{DELETES_PREFIX}{number:06d}.npy"
    staging = directory / f"{DELETES_PREFIX}{number:06d}.tmp"
    save_array(staging, rows.astype(np.int64), fsync=True)
    os.replace(staging, directory / name)
    fsync_directory(directory)
    return name


class Segment:
    """A loaded segment; never modified, shared by every generation (and thread) of the process that uses it.
    With `whole_copy` (its chunk ids, vectors and owner -> rows): a format-2 generation in `directory`, in place."""

    def __init__(self, directory: Path,
                 whole_copy: tuple[np.ndarray, np.ndarray, dict[str, list[int]]] | None = None):
        self.name = directory.name
        self.directory = directory
        if whole_copy is None:
            self.chunk_ids = np.load(directory / "chunk_ids.npy")
            # Mapped, not read: pages shared by every process on the box, read only where searches touch them.
            self.vectors = np.load(directory / "vectors.npy", mmap_mode="r")
            self.owners: dict[str, list[int]] = json.loads((directory / "owners.json").read_text(encoding="utf-8"))
        else:
            self.chunk_ids, self.vectors, self.owners = whole_copy
        self.postings = sparse.csc_array(sparse.load_npz(directory / "term_counts.npz"))
        self.vocabulary: list[str] = json.loads((directory / "vocabulary.json").read_text(encoding="utf-8"))
        self.columns = {token: i for i, token in enumerate(self.vocabulary)}
        self.rows = len(self.chunk_ids)
        self.lengths = np.bincount(self.postings.indices, weights=self.postings.data, minlength=self.rows)
        ann = directory / "ann.faiss"
        self.ann = faiss.read_index(str(ann)) if ann.exists() else None
        self._lock = threading.Lock()
        self._deletes: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}

    @cached_property
    def sorted_chunk_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(the rows in chunk id order, the chunk ids in that order)."""
        order = np.argsort(self.chunk_ids, kind="stable")
        return order, self.chunk_ids[order]

    @cached_property
    def stats_sample(self) -> np.ndarray:
        """Evenly spaced rows' vectors, scored exactly for the query's mean and spread in an IVF segment."""
        step = max(1, self.rows // STATS_SAMPLE_ROWS)
        return np.ascontiguousarray(self.vectors[::step])

    def rows_of_chunks(self, chunk_ids: np.ndarray) -> np.ndarray:
        """The rows holding any of these chunk ids."""
        if not len(chunk_ids) or not self.rows:
            return np.empty(0, np.int64)
        order, ordered = self.sorted_chunk_ids
        at = np.minimum(np.searchsorted(ordered, chunk_ids), self.rows - 1)
        return order[at[ordered[at] == chunk_ids]]

    def rows_of_owners(self, owners: set[str]) -> np.ndarray:
        rows = [self.owners[owner] for owner in owners if owner in self.owners]
        return np.concatenate(rows).astype(np.int64) if rows else np.empty(0, np.int64)

    def deletes(self, name: str | None) -> tuple[np.ndarray, np.ndarray | None]:
        """(the deleted rows, a bool mask of the live rows) as of the deletes file `name`; (none, None) for None."""
        if name is None:
            return np.empty(0, np.int64), None
        with self._lock:
            if name not in self._deletes:
                deleted = np.load(self.directory / name)
                live = np.ones(self.rows, bool)
                live[deleted] = False
                self._deletes = {name: (deleted, live)}  # deletes only grow: keep the newest
            return self._deletes[name]


@dataclass
class Part:
    """One segment in a generation: the segment and its rows deleted as of that generation."""

    entry: dict  # the manifest's entry
    segment: Segment
    deleted: np.ndarray  # int64, sorted
    live: np.ndarray | None  # bool [rows]; None when nothing is deleted

    @property
    def live_count(self) -> int:
        return self.segment.rows - len(self.deleted)

    @property
    def live_rows(self) -> np.ndarray:
        return np.arange(self.segment.rows) if self.live is None else np.flatnonzero(self.live)

    @cached_property
    def ann_selector(self) -> tuple | None:
        """(faiss selector of the live rows, the bitmap it reads: keep it alive), or None when all rows live."""
        if self.live is None:
            return None
        bitmap = np.packbits(self.live, bitorder="little")
        return faiss.IDSelectorBitmap(self.segment.rows, faiss.swig_ptr(bitmap)), bitmap
