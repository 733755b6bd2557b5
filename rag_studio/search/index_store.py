"""The dense and keyword indexes of one knowledge base + embedding model, on disk, as append-only segments.

Layout of `root`:

    CURRENT              "gen-000042": the generation readers use; replaced atomically (tmp + os.replace)
    LOCK                 flock'ed by writers and by a merge while it commits; the kernel releases it when one dies
    MERGE                flock'ed by the one process merging segments of this index
    gen-000042/          a generation: manifest.json lists its segments, in order, and the deletes file of each
    gen-000041/          the previous generation, kept so a reader that just read CURRENT can still load it
    seg-000007/          a segment: the chunks one write added, or one merge rewrote; never modified
        chunk_ids.npy        int64 [n]: chunk id of row i
        vectors.npy          float32 [n, dimension], L2-normalised
        owners.json          owner -> the rows of its chunks
        term_counts.npz      scipy CSC matrix [n, segment vocabulary]: how often each token occurs in each row
        vocabulary.json      the segment's tokens, a JSON list; token i is column i of the term counts
        ann.faiss            segments of RAG_INDEX_ANN_THRESHOLD rows or more: IndexIVFFlat over the rows, ids = rows
        deletes-000042.npy   int64, sorted: the rows deleted as of generation 42 (tombstones); added, never changed
    tmp-*/, merging-*/   a segment or generation being written by a writer or a merge, or left by one that died

A write takes the lock, loads the generation CURRENT names (segments are cached per process: only a manifest is
read), writes the new chunks as one new segment and, for each segment that lost chunks (their owner was removed
or upserted), a new deletes file; fsyncs them, then publishes gen-N+1 and swaps CURRENT. Its cost follows what it
adds and deletes, not the size of the index. A crash at any point leaves CURRENT naming a complete generation;
the next writer removes what the dead one left.

Merges keep the segment count low (tiered, like Lucene's merge policy): a segment's level is how many times
RAG_INDEX_MERGE_FACTOR its live rows hold MERGE_FLOOR_ROWS; once a level holds that many segments, they are
rewritten as one (their live rows, in order), as is a segment with more than MERGE_DELETED_SHARE of its rows
deleted. Each chunk is rewritten about log_factor(chunks / floor) times in its life. A merge runs in a background
thread of the process that wrote, holding MERGE (one merge per index at a time) but not LOCK, so writes go on
meanwhile; it builds the merged segment in a merging-* dir, then under LOCK tombstones in it whatever the writes
made meanwhile deleted from its sources and publishes a generation with it in their place. Killed before that
publish, it leaves the old segments in force: nothing lost, nothing doubled.

BM25 is scored at query time from each segment's term counts (see the keyword section): corpus statistics (rows,
document frequencies, mean row length) are summed over the live rows of every segment, so the scores are those a
single index of the live chunks would give. Dense search is exact (a BLAS product over each segment's vectors)
except in segments with an IVF index. The arrays are numpy/scipy files plus JSON rather than pickles: nothing read
from disk can execute code.

Readers keep the loaded generation in a per-process cache shared by every IndexStore on the same root, and read
CURRENT (a few microseconds) before each search, so web processes see new writes without restarting.

Earlier releases wrote format 2, a whole copy of the index per generation. Such a generation is searched in place
as one segment until it is converted to format 3: by the next write, or by the first reader that finds LOCK free,
under LOCK and published like any write (see the format 2 section).
"""

import fcntl
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

# faiss logs at INFO which instruction set it loaded and why the others would not ("Could not load library with
# AVX512 support"), in every process that imports it; only its warnings matter.
logging.getLogger("faiss.loader").setLevel(logging.WARNING)

import faiss  # noqa: E402
import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from scipy import sparse  # noqa: E402

from rag_studio import files  # noqa: E402
from rag_studio.search.keywords import keyword_tokens, tokenizer_for  # noqa: E402
from rag_studio.vectors import normalised  # noqa: E402

logger = logging.getLogger(__name__)

FORMAT_VERSION = 3
# Earlier releases wrote each generation as a whole copy of the index (format 2): read in place, and converted to
# one segment under LOCK by the first write, or the first reader that finds LOCK free (see "format 2" below).
WHOLE_COPY_FORMAT = 2
# BM25 parameters: the usual defaults (Lucene's, Elasticsearch's).
BM25_K1 = 1.5
BM25_B = 0.75
CURRENT = "CURRENT"
LOCK = "LOCK"
MERGE_LOCK = "MERGE"
GENERATION_PREFIX = "gen-"
SEGMENT_PREFIX = "seg-"
STAGING_PREFIX = "tmp-"
MERGE_STAGING_PREFIX = "merging-"
DELETES_PREFIX = "deletes-"
_GENERATION_NAME = re.compile(r"gen-(\d+)")
_SEGMENT_NAME = re.compile(r"seg-(\d+)")
# Segments under this many live rows share the lowest merge level: merging small segments costs little.
MERGE_FLOOR_ROWS = 1000
# A segment with more than this share of its rows deleted is rewritten on its own.
MERGE_DELETED_SHARE = 0.5
# Rows of an IVF segment scored exactly for the query's mean and spread there (fusion's z-scores).
STATS_SAMPLE_ROWS = 4096
# IVF: about sqrt(rows) clusters, trained by k-means on this many rows per cluster.
ANN_TRAINING_ROWS_PER_LIST = 64
EXACT, IVF = "exact", "ivf"

Upsert = tuple[list[int], np.ndarray, list[str]]


class IndexStore:
    """One KB + embedding model's indexes in `root` (a directory)."""

    def __init__(self, root: Path, dimension: int, tokenize: Callable[[str], list[str]] = keyword_tokens):
        self.root = Path(root)
        self.dimension = dimension
        # The keyword tokens this index was built with (keywords.tokenizer_for), for its writes and its queries.
        self.tokenize = tokenize
        self._reader = _shared_reader(self.root)

    def apply(self, *, upserts: dict[str, Upsert] | None = None, removals: list[str] | None = None) -> None:
        """Replace the chunks of each upserted owner and drop those of each removed owner, in one atomic write.

        Re-running the same call (say after a crash) leaves each chunk indexed exactly once. An owner both
        removed and upserted ends up with its upserted chunks. Segments that pile up are merged afterwards in
        a background thread.
        """
        batches = [_OwnerBatch.validated(owner, *upsert, self.dimension, self.tokenize)
                   for owner, upsert in (upserts or {}).items()]
        _check_unique_chunk_ids(batches)
        removed = set(removals or ())
        if not batches and not removed:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(self.root / LOCK):
            number = read_current(self.root)
            _remove_stale(self.root, number)
            previous = _Generation.load(self.root, number, self.dimension) if number else None
            if previous is not None and previous.whole_copy:
                number = _convert_whole_copy(self.root, previous)
                previous = _Generation.load(self.root, number, self.dimension)
            manifest = _written_changes(self.root, previous, number + 1, batches, removed, self.dimension)
            _publish(self.root, number + 1, manifest)
            _remove_stale(self.root, number + 1)
        if _merge_plan(_manifest_parts(manifest)) is not None:
            _background_merger(self.root, self.dimension).request()

    def search_dense(self, vector: np.ndarray, k: int, stats: dict | None = None) -> list[tuple[int, float]]:
        """(chunk id, cosine similarity) of the k nearest chunks, best first. A `stats` dict gets the mean and
        standard deviation of the query's cosine over every chunk of the index (fusion's z-scores): exact where
        every row is scored anyway, from a fixed sample of rows in segments searched by IVF."""
        query = normalised(np.reshape(vector, (1, -1)))
        if query.shape[1] != self.dimension:
            raise ValueError(f"vector has {query.shape[1]} dimensions; this index has {self.dimension}.")
        generation = self._reader.current(self.dimension)
        if generation is None or k < 1:
            return []
        return generation.search_dense(query[0], k, stats)

    def search_keyword(self, query: str, k: int, stats: dict | None = None) -> list[tuple[int, float]]:
        """(chunk id, raw BM25 score > 0) of the k best keyword matches, best first (ties by chunk id). A `stats`
        dict gets the mean and standard deviation of the BM25 score over every chunk, 0 where no token occurs."""
        generation = self._reader.current(self.dimension)
        if generation is None or not generation.has_terms or k < 1:
            return []
        scores = generation.keyword_scores(self.tokenize(query))  # one per live row; 0 where no query token occurs
        _fill_stats(stats, scores)
        # Top k among the matching rows only: an argpartition over every row is ~4 ms at 100k rows.
        rows = np.flatnonzero(scores > 0)
        if stats is not None:
            stats["matches"] = int(len(rows))  # every other chunk scored 0
        if len(rows) > k:
            rows = rows[np.argpartition(scores[rows], -k)[-k:]]
        chunk_ids, row_scores = generation.live_chunk_ids[rows], scores[rows]
        best_first = np.lexsort((chunk_ids, -row_scores))
        return list(zip(chunk_ids[best_first].tolist(), row_scores[best_first].tolist()))

    def chunk_ids(self, owner: str) -> list[int]:
        generation = self._reader.current(self.dimension)
        return generation.owner_chunk_ids(owner) if generation else []

    def vectors(self, chunk_ids: list[int]) -> np.ndarray:
        """float32 [len(chunk_ids), dimension]: the stored (normalised) vectors of these chunks, in that order.
        Raises KeyError naming a chunk that is not in the index."""
        generation = self._reader.current(self.dimension)
        if generation is None:
            if chunk_ids:
                raise KeyError(f"chunk {chunk_ids[0]} is not in the index")
            return np.empty((0, self.dimension), np.float32)
        return generation.vectors(np.asarray(chunk_ids, np.int64).reshape(-1), self.dimension)

    def count(self) -> int:
        generation = self._reader.current(self.dimension)
        return generation.count if generation else 0

    def generation(self) -> int:
        """The number of the generation CURRENT names; 0 before the first write."""
        return read_current(self.root)

    def search_method(self) -> str:
        """"ivf" when some of the index is searched approximately (a segment of RAG_INDEX_ANN_THRESHOLD chunks or
        more), "exact" otherwise."""
        generation = self._reader.current(self.dimension)
        approximate = generation and settings.RAG_INDEX_ANN_SEARCH and any(
            part.segment.ann is not None and part.live_count for part in generation.parts)
        return IVF if approximate else EXACT

    def merge(self, wait: bool = False) -> int:
        """Run the merges the policy asks for now, in this thread (a background thread does this after writes);
        returns how many it made. Another process or thread merging this index: returns 0 at once, or with
        `wait`, waits for it to finish first."""
        return merge_segments(self.root, self.dimension, wait=wait)


# ---- one write: the validated input ----


@dataclass
class _OwnerBatch:
    owner: str
    chunk_ids: np.ndarray  # int64 [n]
    vectors: np.ndarray  # float32 [n, dimension], L2-normalised
    tokens: list[list[str]]

    @classmethod
    def validated(cls, owner: str, chunk_ids: list[int], vectors: np.ndarray, texts: list[str],
                  dimension: int, tokenize: Callable[[str], list[str]]) -> "_OwnerBatch":
        ids = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
        matrix = np.array(vectors, dtype=np.float32)
        if matrix.size == 0:
            matrix = matrix.reshape(0, dimension)
        if matrix.shape != (len(ids), dimension) or len(texts) != len(ids):
            raise ValueError(f"owner {owner!r}: {len(ids)} chunk ids, vectors of shape {np.shape(vectors)} and "
                             f"{len(texts)} texts; expected one {dimension}-dimension vector and one text per id.")
        if not np.isfinite(matrix).all():
            raise ValueError(f"owner {owner!r}: a vector holds NaN or infinity.")
        return cls(owner, ids, normalised(matrix), [tokenize(text) for text in texts])


def _check_unique_chunk_ids(batches: list[_OwnerBatch]) -> None:
    ids = np.concatenate([batch.chunk_ids for batch in batches]) if batches else np.empty(0, np.int64)
    if len(np.unique(ids)) != len(ids):
        raise ValueError("a chunk id appears more than once in the upserts.")


def _written_changes(root: Path, previous: "_Generation | None", number: int, batches: list[_OwnerBatch],
                     removed: set[str], dimension: int) -> dict:
    """Write generation `number`'s new segment and deletes files; return its manifest (not yet published)."""
    replaced = removed | {batch.owner for batch in batches}
    new_ids = np.concatenate([batch.chunk_ids for batch in batches]) if batches else np.empty(0, np.int64)
    entries, next_segment = [], 1
    if previous is not None:
        next_segment = previous.manifest["next_segment"]
        for part in previous.parts:
            entry = dict(part.entry)
            # A chunk id upserted under a new owner leaves its old one (chunk ids are unique across owners).
            doomed = np.union1d(part.segment.rows_of_owners(replaced), part.segment.rows_of_chunks(new_ids))
            deleted = np.union1d(part.deleted, doomed) if len(doomed) else part.deleted
            if len(deleted) > len(part.deleted):
                entry.update(deletes=_write_deletes(root / part.segment.name, number, deleted), deleted=len(deleted))
            entries.append(entry)
    if len(new_ids):
        name = segment_name(next_segment)
        next_segment += 1
        _SegmentContents.from_batches(batches, dimension).write(root, name, STAGING_PREFIX)
        entries.append({"name": name, "rows": len(new_ids), "deletes": None, "deleted": 0})
    return _manifest(dimension, next_segment, entries)


def _manifest(dimension: int, next_segment: int, entries: list[dict]) -> dict:
    return {"format": FORMAT_VERSION, "dimension": dimension, "next_segment": next_segment, "segments": entries}


def _read_manifest(directory: Path, dimension: int) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    if manifest["format"] not in (FORMAT_VERSION, WHOLE_COPY_FORMAT) or manifest["dimension"] != dimension:
        raise ValueError(f"{directory} holds format {manifest['format']}, dimension {manifest['dimension']}; "
                         f"expected format {FORMAT_VERSION} (or {WHOLE_COPY_FORMAT}), dimension {dimension}.")
    return manifest


# ---- segments: what one write added or one merge rewrote ----


@dataclass
class _SegmentContents:
    """A segment as its writer builds it."""

    chunk_ids: np.ndarray  # int64 [n]
    vectors: np.ndarray  # float32 [n, dimension]
    owners: dict[str, list[int]]  # owner -> rows
    term_counts: sparse.csr_array  # int32 [n, vocabulary]
    vocabulary: list[str]

    @classmethod
    def from_batches(cls, batches: list[_OwnerBatch], dimension: int) -> "_SegmentContents":
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
    def merged(cls, parts: list["_Part"], dimension: int) -> "_SegmentContents":
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
        with _staged_segment(root, name, staging_prefix) as staging:
            _save_array(staging / "chunk_ids.npy", self.chunk_ids)
            _save_array(staging / "vectors.npy", self.vectors)
            (staging / "owners.json").write_text(json.dumps(self.owners, sort_keys=True), encoding="utf-8")
            sparse.save_npz(staging / "term_counts.npz", sparse.csc_array(self.term_counts), compressed=False)
            (staging / "vocabulary.json").write_text(json.dumps(self.vocabulary, ensure_ascii=False),
                                                     encoding="utf-8")
            _write_ann(staging, self.vectors)


@contextmanager
def _staged_segment(root: Path, name: str, staging_prefix: str) -> Iterator[Path]:
    """A staging dir to write a segment's files in; fsynced and renamed to `name` once they are written."""
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix, dir=root))
    staging.chmod(0o755)  # mkdtemp makes it owner-only; web processes may run as another user
    yield staging
    _fsync_tree(staging)
    os.rename(staging, root / name)
    _fsync_directory(root)


def _write_ann(directory: Path, vectors: np.ndarray) -> None:
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


def _write_deletes(directory: Path, number: int, rows: np.ndarray) -> str:
    name = f"{DELETES_PREFIX}{number:06d}.npy"
    staging = directory / f"{DELETES_PREFIX}{number:06d}.tmp"
    _save_array(staging, rows.astype(np.int64), fsync=True)
    os.replace(staging, directory / name)
    _fsync_directory(directory)
    return name


def _save_array(path: Path, array: np.ndarray, fsync: bool = False) -> None:
    """np.save, but writing the data with Python's file.write: numpy's own short write on a full disk raises an
    OSError without errno, which ingestion could not tell from a bug (its "free space" message needs ENOSPC)."""
    array = np.ascontiguousarray(array)
    with open(path, "wb") as file:
        np.lib.format.write_array_header_1_0(file, np.lib.format.header_data_from_array_1_0(array))
        file.write(memoryview(array.reshape(-1)).cast("B") if array.size else b"")
        if fsync:
            file.flush()
            os.fsync(file.fileno())


class _Segment:
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
    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
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
        order, ordered = self._sorted
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
class _Part:
    """One segment in a generation: the segment and its rows deleted as of that generation."""

    entry: dict  # the manifest's entry
    segment: _Segment
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


# ---- merges ----


@dataclass(frozen=True)
class _PartSize:
    live: int
    deleted: int


def _manifest_parts(manifest: dict) -> list[_PartSize]:
    return [_PartSize(entry["rows"] - entry["deleted"], entry["deleted"]) for entry in manifest["segments"]]


def _merge_plan(parts: list[_PartSize]) -> list[int] | None:
    """The positions of the segments to merge next, or None when none need merging."""
    factor = max(2, settings.RAG_INDEX_MERGE_FACTOR)
    for position, part in enumerate(parts):
        if part.deleted > MERGE_DELETED_SHARE * (part.live + part.deleted):
            return [position]
    levels: dict[int, list[int]] = {}
    for position, part in enumerate(parts):
        level, ceiling = 0, MERGE_FLOOR_ROWS * factor
        while part.live >= ceiling:
            level, ceiling = level + 1, ceiling * factor
        levels.setdefault(level, []).append(position)
    for level in sorted(levels):
        if len(levels[level]) >= factor:
            return levels[level][:factor]
    return None


def merge_segments(root: Path, dimension: int, wait: bool = False) -> int:
    """Make the merges the policy asks for, one after another; returns how many. Returns 0 at once when another
    process (or thread) holds MERGE for this index, unless `wait`."""
    root = Path(root)
    if not (root / CURRENT).exists():
        return 0
    merges = 0
    with _lock_if_free(root / MERGE_LOCK, wait) as held:
        if not held:
            return 0
        for entry in root.iterdir():  # only a merge that died leaves these, and none other is running
            if entry.name.startswith(MERGE_STAGING_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)
        while _merge_once(root, dimension):
            merges += 1
    return merges


def _merge_once(root: Path, dimension: int) -> bool:
    number = read_current(root)
    snapshot = _Generation.load(root, number, dimension)
    positions = _merge_plan([_PartSize(part.live_count, len(part.deleted)) for part in snapshot.parts])
    if positions is None:
        return False
    sources = [snapshot.parts[position] for position in positions]
    merged = _SegmentContents.merged(sources, dimension)
    with _exclusive_lock(root / LOCK):
        current_number = read_current(root)
        _remove_stale(root, current_number)
        current = _Generation.load(root, current_number, dimension)
        by_name = {part.segment.name: part for part in current.parts}
        # Writes meanwhile only added segments and deletes files: tombstone in the merged segment what they
        # deleted from its sources.
        deleted_since = [part.segment.chunk_ids[np.setdiff1d(by_name[part.segment.name].deleted, part.deleted)]
                         for part in sources]
        next_segment = current.manifest["next_segment"]
        entries, source_names = [], {part.segment.name for part in sources}
        if len(merged.chunk_ids):
            name = segment_name(next_segment)
            next_segment += 1
            merged.write(root, name, MERGE_STAGING_PREFIX)
            merged_entry = {"name": name, "rows": len(merged.chunk_ids), "deletes": None, "deleted": 0}
            doomed = _rows_of(merged.chunk_ids, np.concatenate(deleted_since))
            if len(doomed):
                merged_entry.update(deletes=_write_deletes(root / name, current_number + 1, doomed),
                                    deleted=len(doomed))
        for part in current.parts:
            if part.segment.name == sources[0].segment.name and len(merged.chunk_ids):
                entries.append(merged_entry)
            elif part.segment.name not in source_names:
                entries.append(part.entry)
        _publish(root, current_number + 1, _manifest(dimension, next_segment, entries))
        _remove_stale(root, current_number + 1)
    return True


def _rows_of(chunk_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.isin(chunk_ids, wanted)).astype(np.int64)


class _BackgroundMerger:
    """One thread per index and process that runs merge_segments after writes ask for it."""

    def __init__(self, root: Path, dimension: int):
        self.root, self.dimension = root, dimension
        self._lock = threading.Lock()
        self._requested = False
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        with self._lock:
            self._requested = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"index-merge {self.root}", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._requested:
                    self._thread = None
                    return
                self._requested = False
            try:
                merge_segments(self.root, self.dimension)
            except Exception:  # noqa: BLE001 - the index stays as the last write left it; the next write retries
                logger.exception("Merging the segments of %s failed", self.root)


_MERGERS: dict[Path, _BackgroundMerger] = {}
_MERGERS_LOCK = threading.Lock()


def _background_merger(root: Path, dimension: int) -> _BackgroundMerger:
    with _MERGERS_LOCK:
        return _MERGERS.setdefault(root.resolve(), _BackgroundMerger(root.resolve(), dimension))


def _forget_mergers_after_fork() -> None:
    # A forked child (a Celery pool process) inherits the registry but not the threads.
    global _MERGERS_LOCK
    _MERGERS.clear()
    _MERGERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_mergers_after_fork)


# ---- generations on disk ----


def generation_name(number: int) -> str:
    return f"{GENERATION_PREFIX}{number:06d}"


def segment_name(number: int) -> str:
    return f"{SEGMENT_PREFIX}{number:06d}"


def read_current(root: Path) -> int:
    """The generation number CURRENT names, or 0 when nothing was written yet."""
    try:
        name = (root / CURRENT).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return 0
    return int(_GENERATION_NAME.fullmatch(name).group(1))


@contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


@contextmanager
def _lock_if_free(path: Path, wait: bool) -> Iterator[bool]:
    """Yields whether this thread got the lock (without waiting for it unless `wait`)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def _publish(root: Path, number: int, manifest: dict) -> None:
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    staging.chmod(0o755)
    (staging / "manifest.json").write_text(json.dumps(manifest, sort_keys=True), encoding="utf-8")
    _fsync_tree(staging)
    os.rename(staging, root / generation_name(number))
    _fsync_directory(root)
    pointer = root / f"{CURRENT}.tmp"
    with open(pointer, "w", encoding="ascii") as file:
        file.write(generation_name(number) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(pointer, root / CURRENT)
    _fsync_directory(root)


def _remove_stale(root: Path, current: int) -> None:
    """Remove staging dirs, every generation but `current` and the newest one before it, and the segments and
    deletes files neither of those two uses.

    Only called under the lock, so no tmp-* dir belongs to a live writer (a live merge stages in merging-*).
    Generations above `current` were renamed into place by a writer that died before swapping CURRENT.
    """
    numbers = sorted(int(match.group(1)) for entry in root.iterdir()
                     if (match := _GENERATION_NAME.fullmatch(entry.name)))
    older = [number for number in numbers if number < current]
    keep = {current, *older[-1:]}
    in_use: dict[str, set[str]] = {}
    for number in keep:
        manifest_path = root / generation_name(number) / "manifest.json"
        if manifest_path.exists():
            # A whole-copy (format 2) generation uses no segments.
            for entry in json.loads(manifest_path.read_text(encoding="utf-8")).get("segments", ()):
                in_use.setdefault(entry["name"], set()).add(entry["deletes"])
    for entry in root.iterdir():
        match = _GENERATION_NAME.fullmatch(entry.name)
        if entry.name.startswith(STAGING_PREFIX) or (match and int(match.group(1)) not in keep) or \
                (_SEGMENT_NAME.fullmatch(entry.name) and entry.name not in in_use):
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name in in_use:
            for file in entry.iterdir():
                if file.name.startswith(DELETES_PREFIX) and file.name not in in_use[entry.name]:
                    file.unlink(missing_ok=True)


def _fsync_tree(directory: Path) -> None:
    for dirpath, _, filenames in os.walk(directory):
        for filename in filenames:
            fd = os.open(os.path.join(dirpath, filename), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_directory(Path(dirpath))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- readers: one cached generation per root per process ----


def _fill_stats(stats: dict | None, scores: np.ndarray) -> None:
    if stats is not None and len(scores):
        stats.update(mean=float(scores.mean(dtype=np.float64)), std=float(scores.std(dtype=np.float64)),
                     count=int(len(scores)))


@dataclass(frozen=True)
class _Generation:
    """A loaded generation: its segments and their deletes, never modified, so searches need no lock. Live rows
    are numbered segment after segment, in manifest order."""

    number: int
    manifest: dict  # for a whole copy, the manifest its conversion publishes
    parts: list[_Part]
    whole_copy: bool = False  # a format-2 generation, read in place

    @classmethod
    def load(cls, root: Path, number: int, dimension: int) -> "_Generation":
        manifest = _read_manifest(root / generation_name(number), dimension)
        if manifest["format"] == WHOLE_COPY_FORMAT:
            return _whole_copy_generation(root / generation_name(number), number, manifest)
        reader = _shared_reader(root)
        parts = []
        for entry in manifest["segments"]:
            segment = reader.segment(entry["name"])
            parts.append(_Part(entry, segment, *segment.deletes(entry["deletes"])))
        reader.keep_segments({entry["name"] for entry in manifest["segments"]})
        return cls(number, manifest, parts)

    @property
    def count(self) -> int:
        return sum(part.live_count for part in self.parts)

    @cached_property
    def live_chunk_ids(self) -> np.ndarray:
        return np.concatenate([part.segment.chunk_ids if part.live is None else part.segment.chunk_ids[part.live]
                               for part in self.parts] or [np.empty(0, np.int64)])

    @cached_property
    def _live_lengths(self) -> np.ndarray:
        return np.concatenate([part.segment.lengths if part.live is None else part.segment.lengths[part.live]
                               for part in self.parts] or [np.empty(0)])

    @cached_property
    def has_terms(self) -> bool:
        return bool(self._live_lengths.sum() > 0)

    @cached_property
    def _mean_length(self) -> float:
        return self._live_lengths.mean()

    def keyword_scores(self, tokens: list[str]) -> np.ndarray:
        """float32 [live rows]: each live row's BM25 score for the tokens (a repeated token counts again), with
        Lucene's formula over the live rows of every segment: per token, the document frequency is summed over
        the segments' posting lists first, then each segment's hits are scored."""
        scores = [np.zeros(part.segment.rows, np.float32) for part in self.parts]
        rows = len(self._live_lengths)
        for token in tokens:
            postings, frequency = [], 0
            for position, part in enumerate(self.parts):
                segment = part.segment
                column = segment.columns.get(token)
                if column is None:
                    continue
                start, end = segment.postings.indptr[column], segment.postings.indptr[column + 1]
                hits, counts = segment.postings.indices[start:end], segment.postings.data[start:end]
                if part.live is not None:
                    keep = part.live[hits]
                    hits, counts = hits[keep], counts[keep]
                postings.append((position, hits, counts))
                frequency += len(hits)
            if not frequency:
                continue
            idf = np.float32(np.log1p((rows - frequency + 0.5) / (frequency + 0.5)))
            for position, hits, counts in postings:
                norm = (BM25_K1 * (1 - BM25_B + BM25_B * self.parts[position].segment.lengths[hits]
                                   / self._mean_length)).astype(np.float32)
                scores[position][hits] += idf * counts / (counts + norm)
        return np.concatenate([score if part.live is None else score[part.live]
                               for score, part in zip(scores, self.parts)] or [np.empty(0, np.float32)])

    def search_dense(self, query: np.ndarray, k: int, stats: dict | None) -> list[tuple[int, float]]:
        ids, scores, exact_scores, samples = [], [], [], []
        for part in self.parts:
            segment = part.segment
            if part.live_count == 0:
                continue
            if segment.ann is None or not settings.RAG_INDEX_ANN_SEARCH:
                # faiss scans a single query with one thread; a BLAS matrix-vector product over the same memory
                # uses every core (100k x 384 on 2 cores: p50 12 ms -> 6 ms, same results).
                row_scores = segment.vectors @ query
                row_ids = segment.chunk_ids
                if part.live is not None:
                    row_scores, row_ids = row_scores[part.live], row_ids[part.live]
                exact_scores.append(row_scores)
                top = np.argpartition(row_scores, -min(k, len(row_ids)))[-k:]
                ids.append(row_ids[top])
                scores.append(row_scores[top])
            else:
                selector = part.ann_selector
                parameters = faiss.SearchParametersIVF(nprobe=settings.RAG_INDEX_ANN_NPROBE,
                                                       sel=selector[0] if selector else None)
                found_scores, rows = segment.ann.search(query[None, :], k, params=parameters)
                found = rows[0] >= 0
                ids.append(segment.chunk_ids[rows[0][found]])
                scores.append(found_scores[0][found])
                samples.append((segment.stats_sample @ query, part.live_count))
        if not ids:
            return []
        if samples:
            _fill_sampled_stats(stats, exact_scores, samples)
        else:
            _fill_stats(stats, np.concatenate(exact_scores))
        ids, scores = np.concatenate(ids), np.concatenate(scores)
        top = np.lexsort((ids, -scores))[:k]  # best first, ties by chunk id
        return list(zip(ids[top].tolist(), scores[top].tolist()))

    def owner_chunk_ids(self, owner: str) -> list[int]:
        chunk_ids = []
        for part in self.parts:
            rows = part.segment.owners.get(owner)
            if rows:
                rows = np.asarray(rows, np.int64)
                if part.live is not None:
                    rows = rows[part.live[rows]]
                chunk_ids += part.segment.chunk_ids[rows].tolist()
        return chunk_ids

    def vectors(self, chunk_ids: np.ndarray, dimension: int) -> np.ndarray:
        found = np.zeros(len(chunk_ids), bool)
        result = np.empty((len(chunk_ids), dimension), np.float32)
        for part in self.parts:
            segment = part.segment
            if not segment.rows or not len(chunk_ids):
                continue
            order, ordered = segment._sorted
            at = np.minimum(np.searchsorted(ordered, chunk_ids), segment.rows - 1)
            rows = order[at]
            hit = (ordered[at] == chunk_ids) & ~found
            if part.live is not None:
                hit &= part.live[rows]
            result[hit] = segment.vectors[rows[hit]]
            found |= hit
        if not found.all():
            raise KeyError(f"chunk {int(chunk_ids[~found][0])} is not in the index")
        return result


# ---- format 2: the whole-copy generations of earlier releases ----
#
# A format-2 generation dir holds manifest.json (owner -> chunk ids), chunk_ids.npy (the chunk of term-count row
# i), term_counts.npz and vocabulary.json (laid out as a segment's), and dense.faiss, an IndexIDMap2(IndexFlatIP)
# whose rows need not follow chunk_ids.npy (a removal compacted them, new rows were appended). It reads as one
# segment with nothing deleted, so its answers are those it gave. Converting it writes that segment, hard-linking
# the three files the formats share, then publishes a format-3 generation naming it: under LOCK and crash-safe like
# any write, the format-2 generation staying in force until CURRENT is swapped.


def _whole_copy_generation(directory: Path, number: int, manifest: dict) -> _Generation:
    chunk_ids = np.load(directory / "chunk_ids.npy")
    dense = faiss.read_index(str(directory / "dense.faiss"))
    dense_ids = faiss.vector_to_array(dense.id_map)
    vectors = np.empty((0, dense.d), np.float32)
    if dense.ntotal:  # copied out: faiss frees its memory with `dense`
        vectors = np.array(faiss.rev_swig_ptr(faiss.downcast_index(dense.index).get_xb(), dense.ntotal * dense.d))
    order = np.argsort(dense_ids)
    at = np.minimum(np.searchsorted(dense_ids[order], chunk_ids), max(len(order) - 1, 0))
    if len(dense_ids) != len(chunk_ids) or (len(chunk_ids) and not np.array_equal(dense_ids[order][at], chunk_ids)):
        raise ValueError(f"{directory}: dense.faiss and chunk_ids.npy hold different chunks.")
    row_of = {chunk_id: row for row, chunk_id in enumerate(chunk_ids.tolist())}
    owners = {owner: [row_of[chunk_id] for chunk_id in ids] for owner, ids in manifest["owners"].items()}
    segment = _Segment(directory, (chunk_ids, vectors.reshape(-1, dense.d)[order[at]], owners))
    if not segment.rows:
        return _Generation(number, _manifest(dense.d, 1, []), [], whole_copy=True)
    entry = {"name": segment_name(1), "rows": segment.rows, "deletes": None, "deleted": 0}
    return _Generation(number, _manifest(dense.d, 2, [entry]), [_Part(entry, segment, np.empty(0, np.int64), None)],
                       whole_copy=True)


def _convert_whole_copy(root: Path, generation: _Generation) -> int:
    """Under LOCK, with CURRENT naming `generation`, a whole copy: publish it converted as the next generation,
    whose number this returns. Killed before the swap of CURRENT, it leaves the whole copy in force and files the
    next write (or conversion) removes."""
    _remove_stale(root, generation.number)
    for part in generation.parts:
        with _staged_segment(root, part.entry["name"], STAGING_PREFIX) as staging:
            for name in ("chunk_ids.npy", "term_counts.npz", "vocabulary.json"):
                _link_or_copy(part.segment.directory / name, staging / name)
            _save_array(staging / "vectors.npy", part.segment.vectors)
            (staging / "owners.json").write_text(json.dumps(part.segment.owners, sort_keys=True), encoding="utf-8")
            _write_ann(staging, part.segment.vectors)
    _publish(root, generation.number + 1, generation.manifest)
    _remove_stale(root, generation.number + 1)
    logger.info("Converted the format-%d index in %s to format %d", WHOLE_COPY_FORMAT, root, FORMAT_VERSION)
    return generation.number + 1


def _convert_if_lock_free(root: Path, generation: _Generation) -> bool:
    """Convert `generation`, a whole copy CURRENT named, unless another thread or process holds LOCK (a write, or
    a conversion: the whole copy answers meanwhile). Returns whether CURRENT names another generation now."""
    with _lock_if_free(root / LOCK, wait=False) as held:
        if not held:
            return False
        if read_current(root) == generation.number:
            _convert_whole_copy(root, generation)
        return True


def _link_or_copy(source: Path, target: Path) -> None:
    """Both files are immutable: sharing the inode saves rewriting them."""
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, target)


def _fill_sampled_stats(stats: dict | None, exact_scores: list[np.ndarray],
                        samples: list[tuple[np.ndarray, int]]) -> None:
    """Mean and spread over every chunk, from the exactly scored segments and each IVF segment's sample
    weighted by its live rows."""
    if stats is None:
        return
    values = np.concatenate([*exact_scores, *(sample for sample, _ in samples)]).astype(np.float64)
    weights = np.concatenate([*(np.ones(len(scores)) for scores in exact_scores),
                              *(np.full(len(sample), live / len(sample)) for sample, live in samples)])
    mean = np.average(values, weights=weights)
    stats.update(mean=float(mean), std=float(math.sqrt(np.average((values - mean) ** 2, weights=weights))),
                 count=int(round(weights.sum())))


class _SharedReader:
    """The current generation of one root, loaded lazily and reloaded when CURRENT changes, and the segments
    loaded so far."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._segments_lock = threading.Lock()
        self._generation: _Generation | None = None
        self._segments: dict[str, _Segment] = {}
        self._may_convert = True  # false once this process found it may not write a format-2 root's conversion

    def current(self, dimension: int) -> _Generation | None:
        # Reading CURRENT costs microseconds, and generation numbers only grow: an exact freshness check.
        loaded = self._generation
        if read_current(self.root) != (loaded.number if loaded else 0) or \
                (loaded is not None and loaded.whole_copy and self._may_convert):
            with self._lock:
                self._generation = self._load_latest(dimension)
        return self._generation

    def segment(self, name: str) -> _Segment:
        with self._segments_lock:
            if name not in self._segments:
                self._segments[name] = _Segment(self.root / name)
            return self._segments[name]

    def keep_segments(self, in_use: set[str]) -> None:
        """Drop cached segments the generation just loaded no longer uses (merged away); a search, write or merge
        still using an older generation holds its own references."""
        with self._segments_lock:
            self._segments = {name: segment for name, segment in self._segments.items() if name in in_use}

    def _load_latest(self, dimension: int) -> _Generation | None:
        while True:
            number = read_current(self.root)
            if number == 0:
                return None
            generation = self._generation  # another thread may have loaded it while this one waited for the lock
            if generation is None or generation.number != number:
                try:
                    generation = _Generation.load(self.root, number, dimension)
                except (OSError, RuntimeError):
                    # Two writes since CURRENT was read may have deleted this generation or one of its segments
                    # (faiss reports a missing file as RuntimeError): follow CURRENT. Anything else is a real error.
                    if read_current(self.root) == number:
                        raise
                    continue
            if not (generation.whole_copy and self._converted(generation)):
                return generation

    def _converted(self, generation: _Generation) -> bool:
        """Whether CURRENT moved on from `generation`, a whole copy, after trying to convert it. A process that may
        not write here (a web server as another user, a read-only mount) searches the whole copy as it is."""
        if not self._may_convert:
            return False
        try:
            return _convert_if_lock_free(self.root, generation)
        except OSError as error:
            self._may_convert = False
            logger.warning("The format-%d index in %s is searched as it is: converting it failed (%s)",
                           WHOLE_COPY_FORMAT, self.root, error)
            return False


_READERS: dict[Path, _SharedReader] = {}
_READERS_LOCK = threading.Lock()


def _shared_reader(root: Path) -> _SharedReader:
    key = Path(root).resolve()
    with _READERS_LOCK:
        return _READERS.setdefault(key, _SharedReader(key))


def forget_readers(under: Path) -> None:
    """Drop this process's cached generations and segments of every index under `under`, a directory being removed
    or reused: generation and segment numbers start again at 1 in a new index at the same path, so the cache
    would take them for fresh."""
    prefix = under.resolve()
    with _READERS_LOCK:
        for root in [root for root in _READERS if root == prefix or prefix in root.parents]:
            del _READERS[root]
    with _MERGERS_LOCK:
        for root in [root for root in _MERGERS if root == prefix or prefix in root.parents]:
            del _MERGERS[root]


def store_for(kb, key: str | None = None):
    """The store of a knowledge base's index `key` (its live index by default): under FACTORY_DATA_DIR, or in
    Postgres for a knowledge base on the pgvector backend (search/pgvector_store.py, same interface)."""
    if kb.index_backend == "pgvector":
        from rag_studio.search.pgvector_store import PgvectorStore  # psycopg and pgvector load where a base uses them

        return PgvectorStore(kb.pk, key or kb.index_key, kb.embedding_dimensions, tokenizer_for(kb, key))
    return IndexStore(files.index_dir(kb.pk, key or kb.index_key), kb.embedding_dimensions, tokenizer_for(kb, key))
