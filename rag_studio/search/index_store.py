"""The dense (FAISS) and keyword (BM25) indexes of one knowledge base + embedding model, on disk.

Layout of `root`:

    CURRENT              "gen-000042": the generation readers use; replaced atomically (tmp + os.replace)
    LOCK                 flock'ed by writers; the kernel releases it when a writer dies
    gen-000042/          a complete, immutable generation
        manifest.json        format, dimension, count and owner -> chunk ids
        dense.faiss          IndexIDMap2(IndexFlatIP) of L2-normalised vectors, ids = chunk ids
        chunk_ids.npy        int64 [n]: chunk id of row i (row i of the term counts too)
        term_counts.npz      scipy CSC matrix [n, vocabulary]: how often each token occurs in each row
        vocabulary.json      the tokens in use, a JSON list; token i is column i of the term counts
    gen-000041/          the previous generation, kept so a reader that just read CURRENT can still load it
    tmp-*/               a generation being written, or left by a writer that died (removed by the next write)

BM25 is scored at query time from the stored term counts rather than by a library such as bm25s, which stores
precomputed scores: each of those depends on the corpus-wide idf and mean length, so every write (one per
document ingested) would rebuild them all, in Python loops (~130 ms at 3k chunks, ~5 s at 100k). Term counts
change only in the rows a write touches, and scoring a query's few posting lists is well under a millisecond.
The arrays are numpy/scipy files plus a JSON vocabulary rather than pickles: nothing read from disk can execute
code.

A write takes the lock, reloads the generation CURRENT names (another process may have written since), builds
the next generation in a tmp dir, fsyncs it, renames it to gen-N and then swaps CURRENT. A crash at any point
leaves CURRENT naming a complete generation. Each write copies the whole generation with vectorised array
operations: milliseconds at a few thousand chunks.

Readers keep the loaded generation in a per-process cache shared by every IndexStore on the same root, and
read CURRENT (a few microseconds) before each search, so web processes see new writes without restarting.
"""

import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# faiss logs at INFO which instruction set it loaded and why the others would not ("Could not load library with
# AVX512 support"), in every process that imports it; only its warnings matter.
logging.getLogger("faiss.loader").setLevel(logging.WARNING)

import faiss  # noqa: E402
import numpy as np  # noqa: E402
from scipy import sparse  # noqa: E402

from rag_studio import files  # noqa: E402
from rag_studio.search.keywords import keyword_tokens  # noqa: E402
from rag_studio.vectors import normalised  # noqa: E402

FORMAT_VERSION = 2
# BM25 parameters: the usual defaults (Lucene's, Elasticsearch's).
BM25_K1 = 1.5
BM25_B = 0.75
CURRENT = "CURRENT"
LOCK = "LOCK"
GENERATION_PREFIX = "gen-"
STAGING_PREFIX = "tmp-"
_GENERATION_NAME = re.compile(r"gen-(\d+)")

Upsert = tuple[list[int], np.ndarray, list[str]]


class IndexStore:
    """One KB + embedding model's indexes in `root` (a directory)."""

    def __init__(self, root: Path, dimension: int):
        self.root = Path(root)
        self.dimension = dimension
        self._reader = _shared_reader(self.root)

    def apply(self, *, upserts: dict[str, Upsert] | None = None, removals: list[str] | None = None) -> None:
        """Replace the chunks of each upserted owner and drop those of each removed owner, in one atomic write.

        Re-running the same call (say after a crash) leaves each chunk indexed exactly once. An owner both
        removed and upserted ends up with its upserted chunks.
        """
        batches = [_OwnerBatch.validated(owner, *upsert, self.dimension) for owner, upsert in (upserts or {}).items()]
        _check_unique_chunk_ids(batches)
        removed = set(removals or ())
        if not batches and not removed:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(self.root / LOCK):
            number = read_current(self.root)
            _remove_stale(self.root, number)
            if number:
                previous = _Contents.load(self.root / generation_name(number), self.dimension)
            else:
                previous = _Contents.empty(self.dimension)
            _publish(self.root, number + 1, previous.updated(batches, removed))
            _remove_stale(self.root, number + 1)

    def search_dense(self, vector: np.ndarray, k: int, stats: dict | None = None) -> list[tuple[int, float]]:
        """(chunk id, cosine similarity) of the k nearest chunks, best first. A `stats` dict gets the mean and
        standard deviation of the query's cosine over every chunk of the index (fusion's z-scores), free: every
        row is scored anyway."""
        query = normalised(np.reshape(vector, (1, -1)))
        if query.shape[1] != self.dimension:
            raise ValueError(f"vector has {query.shape[1]} dimensions; this index has {self.dimension}.")
        generation = self._reader.current(self.dimension)
        if generation is None or k < 1:
            return []
        return generation.dense.search(query[0], k, stats)

    def search_keyword(self, query: str, k: int, stats: dict | None = None) -> list[tuple[int, float]]:
        """(chunk id, raw BM25 score > 0) of the k best keyword matches, best first (ties by chunk id). A `stats`
        dict gets the mean and standard deviation of the BM25 score over every chunk, 0 where no token occurs."""
        generation = self._reader.current(self.dimension)
        if generation is None or generation.keyword is None or k < 1:
            return []
        scores = generation.keyword.scores(keyword_tokens(query))  # one per row; 0 where no query token occurs
        _fill_stats(stats, scores)
        # Top k among the matching rows only: an argpartition over every row is ~4 ms at 100k rows.
        rows = np.flatnonzero(scores > 0)
        if stats is not None:
            stats["matches"] = int(len(rows))  # every other chunk scored 0
        if len(rows) > k:
            rows = rows[np.argpartition(scores[rows], -k)[-k:]]
        chunk_ids, row_scores = generation.row_chunk_ids[rows], scores[rows]
        best_first = np.lexsort((chunk_ids, -row_scores))
        return list(zip(chunk_ids[best_first].tolist(), row_scores[best_first].tolist()))

    def chunk_ids(self, owner: str) -> list[int]:
        generation = self._reader.current(self.dimension)
        return list(generation.owners.get(owner, ())) if generation else []

    def vectors(self, chunk_ids: list[int]) -> np.ndarray:
        """float32 [len(chunk_ids), dimension]: the stored (normalised) vectors of these chunks, in that order.
        Raises KeyError naming a chunk that is not in the index."""
        generation = self._reader.current(self.dimension)
        rows = {chunk_id: row for row, chunk_id in enumerate(generation.dense.ids.tolist())} if generation else {}
        missing = [chunk_id for chunk_id in chunk_ids if chunk_id not in rows]
        if missing:
            raise KeyError(f"chunk {missing[0]} is not in the index")
        if not chunk_ids:
            return np.empty((0, self.dimension), np.float32)
        return generation.dense.vectors[[rows[chunk_id] for chunk_id in chunk_ids]]

    def count(self) -> int:
        generation = self._reader.current(self.dimension)
        return len(generation.dense.ids) if generation else 0

    def generation(self) -> int:
        """The number of the generation CURRENT names; 0 before the first write."""
        return read_current(self.root)


# ---- one write: the validated input and the full contents of a generation ----


@dataclass
class _OwnerBatch:
    owner: str
    chunk_ids: np.ndarray  # int64 [n]
    vectors: np.ndarray  # float32 [n, dimension], L2-normalised
    tokens: list[list[str]]

    @classmethod
    def validated(cls, owner: str, chunk_ids: list[int], vectors: np.ndarray, texts: list[str],
                  dimension: int) -> "_OwnerBatch":
        ids = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
        matrix = np.array(vectors, dtype=np.float32)
        if matrix.size == 0:
            matrix = matrix.reshape(0, dimension)
        if matrix.shape != (len(ids), dimension) or len(texts) != len(ids):
            raise ValueError(f"owner {owner!r}: {len(ids)} chunk ids, vectors of shape {np.shape(vectors)} and "
                             f"{len(texts)} texts; expected one {dimension}-dimension vector and one text per id.")
        if not np.isfinite(matrix).all():
            raise ValueError(f"owner {owner!r}: a vector holds NaN or infinity.")
        return cls(owner, ids, normalised(matrix), [keyword_tokens(text) for text in texts])


def _check_unique_chunk_ids(batches: list[_OwnerBatch]) -> None:
    ids = np.concatenate([batch.chunk_ids for batch in batches]) if batches else np.empty(0, np.int64)
    if len(np.unique(ids)) != len(ids):
        raise ValueError("a chunk id appears more than once in the upserts.")


@dataclass
class _Contents:
    """Everything a generation holds, as the writer manipulates it."""

    dimension: int
    owners: dict[str, list[int]]
    row_chunk_ids: np.ndarray  # int64 [n]
    term_counts: sparse.csr_array  # int32 [n, vocabulary]; rows for the writer, columns for the reader
    vocabulary: list[str]
    dense: faiss.IndexIDMap2

    @classmethod
    def empty(cls, dimension: int) -> "_Contents":
        return cls(dimension, {}, np.empty(0, np.int64), sparse.csr_array((0, 0), dtype=np.int32), [],
                   faiss.IndexIDMap2(faiss.IndexFlatIP(dimension)))

    @classmethod
    def load(cls, directory: Path, dimension: int) -> "_Contents":
        manifest = _read_manifest(directory, dimension)
        return cls(
            dimension=dimension,
            owners=manifest["owners"],
            row_chunk_ids=np.load(directory / "chunk_ids.npy"),
            term_counts=sparse.csr_array(sparse.load_npz(directory / "term_counts.npz")),
            vocabulary=json.loads((directory / "vocabulary.json").read_text(encoding="utf-8")),
            dense=faiss.read_index(str(directory / "dense.faiss")),
        )

    def updated(self, batches: list[_OwnerBatch], removed: set[str]) -> "_Contents":
        """The contents after dropping the chunks of removed and upserted owners, then adding the upserts.

        Modifies this object's faiss index in place: the writer loaded it for this write alone.
        """
        replaced = removed | {batch.owner for batch in batches}
        new_ids = {int(chunk_id) for batch in batches for chunk_id in batch.chunk_ids}
        # A chunk id upserted under a new owner leaves its old one (chunk ids are unique across owners).
        owners = {owner: kept for owner, ids in self.owners.items()
                  if owner not in replaced and (kept := [i for i in ids if i not in new_ids])}
        owners.update({batch.owner: batch.chunk_ids.tolist() for batch in batches if len(batch.chunk_ids)})

        dropped_ids = new_ids.union(*(self.owners.get(owner, ()) for owner in replaced))
        dropped = np.fromiter(dropped_ids, np.int64, len(dropped_ids))
        kept_rows = ~np.isin(self.row_chunk_ids, dropped)
        self.dense.remove_ids(dropped)
        for batch in batches:
            self.dense.add_with_ids(batch.vectors, batch.chunk_ids)
        term_counts, vocabulary = self._terms_after(kept_rows, [row for batch in batches for row in batch.tokens])
        return _Contents(
            dimension=self.dimension,
            owners=owners,
            row_chunk_ids=np.concatenate([self.row_chunk_ids[kept_rows], *(batch.chunk_ids for batch in batches)]),
            term_counts=term_counts,
            vocabulary=vocabulary,
            dense=self.dense,
        )

    def _terms_after(self, kept_rows: np.ndarray, new_rows: list[list[str]]) -> tuple[sparse.csr_array, list[str]]:
        """(term counts, vocabulary) of the kept rows followed by the new ones."""
        columns = {token: i for i, token in enumerate(self.vocabulary)}
        new_tokens = np.fromiter((columns.setdefault(token, len(columns)) for row in new_rows for token in row),
                                 np.int32)
        offsets = np.concatenate([[0], np.cumsum([len(row) for row in new_rows], dtype=np.int64)])
        added = sparse.csr_array((np.ones(len(new_tokens), np.int32), new_tokens, offsets),
                                 shape=(len(new_rows), len(columns)))
        added.sum_duplicates()
        kept = self.term_counts[kept_rows] if not kept_rows.all() else self.term_counts
        kept = sparse.csr_array((kept.data, kept.indices, kept.indptr), shape=(kept.shape[0], len(columns)))
        counts = sparse.vstack([kept, added], format="csr", dtype=np.int32)
        vocabulary = list(columns)
        if not kept_rows.all():
            # Drop the tokens only removed rows used, so deleted documents' words do not pile up.
            in_use = np.flatnonzero(np.bincount(counts.indices, minlength=len(vocabulary)))
            if len(in_use) < len(vocabulary):
                counts = sparse.csr_array(counts[:, in_use])
                vocabulary = [vocabulary[i] for i in in_use]
        return counts, vocabulary

    def write(self, directory: Path) -> None:
        manifest = {"format": FORMAT_VERSION, "dimension": self.dimension, "count": len(self.row_chunk_ids),
                    "owners": self.owners}
        (directory / "manifest.json").write_text(json.dumps(manifest, sort_keys=True), encoding="utf-8")
        np.save(directory / "chunk_ids.npy", self.row_chunk_ids)
        sparse.save_npz(directory / "term_counts.npz", self.term_counts.tocsc(), compressed=False)
        (directory / "vocabulary.json").write_text(json.dumps(self.vocabulary, ensure_ascii=False), encoding="utf-8")
        faiss.write_index(self.dense, str(directory / "dense.faiss"))


def _read_manifest(directory: Path, dimension: int) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    if manifest["format"] != FORMAT_VERSION or manifest["dimension"] != dimension:
        raise ValueError(f"{directory} holds format {manifest['format']}, dimension {manifest['dimension']}; "
                         f"expected format {FORMAT_VERSION}, dimension {dimension}.")
    return manifest


# ---- generations on disk ----


def generation_name(number: int) -> str:
    return f"{GENERATION_PREFIX}{number:06d}"


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


def _publish(root: Path, number: int, contents: _Contents) -> None:
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    staging.chmod(0o755)  # mkdtemp makes it owner-only; web processes may run as another user
    contents.write(staging)
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
    """Remove staging dirs and every generation but `current` and the newest one before it.

    Only called under the lock, so no staging dir belongs to a live writer. Generations above `current`
    were renamed into place by a writer that died before swapping CURRENT.
    """
    numbers = sorted(int(match.group(1)) for entry in root.iterdir()
                     if (match := _GENERATION_NAME.fullmatch(entry.name)))
    older = [number for number in numbers if number < current]
    keep = {current, *older[-1:]}
    for entry in root.iterdir():
        match = _GENERATION_NAME.fullmatch(entry.name)
        if entry.name.startswith(STAGING_PREFIX) or (match and int(match.group(1)) not in keep):
            shutil.rmtree(entry, ignore_errors=True)


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


@dataclass(frozen=True)
class _DenseView:
    """Exact inner-product search over the vectors of a loaded IndexIDMap2(IndexFlatIP), in place.

    faiss scans a single query with one thread; a BLAS matrix-vector product over the same memory uses every
    core (100k x 384 on 2 cores: p50 12 ms -> 6 ms, same results).
    """

    index: faiss.IndexIDMap2  # owns the memory `vectors` views: keep it alive
    vectors: np.ndarray  # float32 [n, dimension]
    ids: np.ndarray  # int64 [n]: chunk id of each row

    @classmethod
    def read(cls, path: Path) -> "_DenseView":
        index = faiss.read_index(str(path))
        flat = faiss.downcast_index(index.index)
        vectors = faiss.rev_swig_ptr(flat.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d) \
            if index.ntotal else np.empty((0, index.d), np.float32)
        vectors.flags.writeable = False  # shared by every search in the process
        return cls(index, vectors, faiss.vector_to_array(index.id_map))

    def search(self, query: np.ndarray, k: int, stats: dict | None = None) -> list[tuple[int, float]]:
        k = min(k, len(self.ids))
        if k == 0:
            return []
        scores = self.vectors @ query
        _fill_stats(stats, scores)
        top = np.argpartition(scores, -k)[-k:]
        top = top[np.lexsort((self.ids[top], -scores[top]))]  # best first, ties by chunk id
        return list(zip(self.ids[top].tolist(), scores[top].tolist()))


def _fill_stats(stats: dict | None, scores: np.ndarray) -> None:
    if stats is not None and len(scores):
        stats.update(mean=float(scores.mean(dtype=np.float64)), std=float(scores.std(dtype=np.float64)),
                     count=int(len(scores)))


@dataclass(frozen=True)
class _KeywordIndex:
    """BM25 (Lucene's formula) over a generation's term counts, scored per query from the query tokens' columns."""

    columns: dict[str, int]
    postings: sparse.csc_array  # [rows, vocabulary]: column j lists the rows holding token j and how often
    idf: np.ndarray  # float32 [vocabulary]
    length_norm: np.ndarray  # float32 [rows]: k1 * (1 - b + b * row length / mean row length)

    @classmethod
    def read(cls, directory: Path) -> "_KeywordIndex | None":
        postings = sparse.csc_array(sparse.load_npz(directory / "term_counts.npz"))
        if postings.nnz == 0:
            return None
        vocabulary = json.loads((directory / "vocabulary.json").read_text(encoding="utf-8"))
        rows = postings.shape[0]
        frequency = np.diff(postings.indptr)
        lengths = np.bincount(postings.indices, weights=postings.data, minlength=rows)
        return cls(
            columns={token: i for i, token in enumerate(vocabulary)},
            postings=postings,
            idf=np.log1p((rows - frequency + 0.5) / (frequency + 0.5)).astype(np.float32),
            length_norm=(BM25_K1 * (1 - BM25_B + BM25_B * lengths / lengths.mean())).astype(np.float32),
        )

    def scores(self, tokens: list[str]) -> np.ndarray:
        """float32 [rows]: each row's BM25 score for the tokens (a repeated token counts again)."""
        total = np.zeros(self.postings.shape[0], np.float32)
        indptr, rows, counts = self.postings.indptr, self.postings.indices, self.postings.data
        for token in tokens:
            column = self.columns.get(token)
            if column is None:
                continue
            hits = rows[indptr[column]:indptr[column + 1]]  # distinct within a column
            frequency = counts[indptr[column]:indptr[column + 1]]
            total[hits] += self.idf[column] * frequency / (frequency + self.length_norm[hits])
        return total


@dataclass(frozen=True)
class _Generation:
    """A loaded generation; never modified, so searches can use it without a lock."""

    number: int
    dense: _DenseView
    keyword: _KeywordIndex | None
    row_chunk_ids: np.ndarray  # keyword row i is chunk row_chunk_ids[i]
    owners: dict[str, list[int]]

    @classmethod
    def load(cls, root: Path, number: int, dimension: int) -> "_Generation":
        directory = root / generation_name(number)
        manifest = _read_manifest(directory, dimension)
        return cls(
            number=number,
            dense=_DenseView.read(directory / "dense.faiss"),
            keyword=_KeywordIndex.read(directory),
            row_chunk_ids=np.load(directory / "chunk_ids.npy"),
            owners=manifest["owners"],
        )


class _SharedReader:
    """The current generation of one root, loaded lazily and reloaded when CURRENT changes."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._generation: _Generation | None = None

    def current(self, dimension: int) -> _Generation | None:
        # Reading CURRENT costs microseconds, and generation numbers only grow: an exact freshness check.
        loaded = self._generation
        if read_current(self.root) != (loaded.number if loaded else 0):
            with self._lock:
                self._generation = self._load_latest(dimension)
        return self._generation

    def _load_latest(self, dimension: int) -> _Generation | None:
        while True:
            number = read_current(self.root)
            if number == 0:
                return None
            if self._generation is not None and self._generation.number == number:
                return self._generation  # another thread loaded it while this one waited for the lock
            try:
                return _Generation.load(self.root, number, dimension)
            except (OSError, RuntimeError):
                # Two writes since CURRENT was read may have deleted this generation (faiss reports a
                # missing file as RuntimeError): follow CURRENT. Anything else is a real error.
                if read_current(self.root) == number:
                    raise


_READERS: dict[Path, _SharedReader] = {}
_READERS_LOCK = threading.Lock()


def _shared_reader(root: Path) -> _SharedReader:
    key = root.resolve()
    with _READERS_LOCK:
        return _READERS.setdefault(key, _SharedReader(key))


def forget_readers(under: Path) -> None:
    """Drop this process's cached generations of every index under `under`, a directory being removed or reused:
    generation numbers start again at 1 in a new index at the same path, so the cache would take it for fresh."""
    prefix = under.resolve()
    with _READERS_LOCK:
        for root in [root for root in _READERS if root == prefix or prefix in root.parents]:
            del _READERS[root]


def store_for(kb, key: str | None = None) -> IndexStore:
    """The store of a knowledge base's index `key` (its live index by default) under FACTORY_DATA_DIR."""
    return IndexStore(files.index_dir(kb.pk, key or kb.index_key), kb.embedding_dimensions)
