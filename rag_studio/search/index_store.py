"""What an index store is: the dense and keyword indexes of one knowledge base + embedding model behind one
interface, so that retrieval, ingestion, moves and backups never ask which backend holds them (stores.store_for
picks it, from the knowledge base's `index_backend`). Two backends implement it:

    embedded   search/embedded/: segments on disk in this node's data dir, the default
    pgvector   search/pgvector_store.py: tables in Postgres, shared by every node

Both score alike (BM25 with the constants below, cosine over L2-normalised vectors, the same statistics for fusion's
z-scores) and check writes alike (validated_batches), so fusion, explanations and evals do not tell them apart.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rag_studio.vectors import normalised

# BM25 parameters: the usual defaults (Lucene's, Elasticsearch's).
BM25_K1 = 1.5
BM25_B = 0.75

# One owner's chunks in a write: their ids, and one vector and one text per id.
Upsert = tuple[list[int], np.ndarray, list[str]]
# (chunk id, score), best first.
Hits = list[tuple[int, float]]


class StoreUnavailable(RuntimeError):
    """The store cannot be used from this process; the message says what to set up, or where to go instead."""


class IndexElsewhere(StoreUnavailable):
    """This process may not write the index: it lives where the process cannot reach it."""


class IndexDump(NamedTuple):
    """Every row of an index, for a backup to carry; `name` is unique among the instance's indexes."""

    name: str
    chunk_ids: np.ndarray  # int64 [n]
    owners: np.ndarray  # str [n]
    vectors: np.ndarray  # float32 [n, dimension], as stored (normalised)


class IndexStore(ABC):
    """One knowledge base + index key's dense and keyword indexes. An owner (a document id) holds chunks; a chunk id
    belongs to one owner."""

    dimension: int
    # The keyword tokens this index was built with (keywords.tokenizer_for), for its writes and its queries.
    tokenize: Callable[[str], list[str]]

    @classmethod
    @abstractmethod
    def for_index(cls, kb, key: str) -> "IndexStore":
        """The store of knowledge base `kb`'s index `key`."""

    @classmethod
    @abstractmethod
    def check_available(cls) -> None:
        """Raise StoreUnavailable, saying what to set up, unless knowledge bases can keep their indexes here."""

    @classmethod
    @abstractmethod
    def drop_knowledge_base(cls, kb_id: int) -> None:
        """Remove every index of knowledge base `kb_id` (deleted, or a deleted one's id given out again)."""

    @abstractmethod
    def apply(self, *, upserts: dict[str, Upsert] | None = None, removals: list[str] | None = None) -> None:
        """Replace the chunks of each upserted owner and drop those of each removed owner, in one atomic write.
        Re-running the same call (say after a crash) leaves each chunk indexed exactly once; an owner both removed
        and upserted ends up with its upserted chunks. ValueError for upserts that do not fit (validated_batches)."""

    @abstractmethod
    def search_dense(self, vector: np.ndarray, k: int, stats: dict | None = None) -> Hits:
        """(chunk id, cosine similarity) of the k nearest chunks, best first (ties by chunk id). A `stats` dict gets
        the mean, standard deviation and count of the query's cosine over every chunk (fusion's z-scores)."""

    @abstractmethod
    def search_keyword(self, query: str, k: int, stats: dict | None = None) -> Hits:
        """(chunk id, raw BM25 score > 0) of the k best keyword matches, best first (ties by chunk id). A `stats`
        dict gets the mean, standard deviation and count of the BM25 score over every chunk (0 where no query token
        occurs), and `matches`: how many chunks hold a query token."""

    @abstractmethod
    def chunk_ids(self, owner: str) -> list[int]:
        """The owner's chunk ids in the index; [] for an owner it does not hold."""

    @abstractmethod
    def vectors(self, chunk_ids: list[int]) -> np.ndarray:
        """float32 [len(chunk_ids), dimension]: the stored (normalised) vectors of these chunks, in that order.
        Raises KeyError naming a chunk that is not in the index."""

    @abstractmethod
    def count(self) -> int:
        """How many chunks the index holds."""

    @abstractmethod
    def generation(self) -> int:
        """A number that grows with every write to the index; 0 before the first."""

    @abstractmethod
    def search_method(self) -> str:
        """How dense search runs now: "exact", or the approximate index in use ("ivf", "hnsw")."""

    @abstractmethod
    def merge(self, wait: bool = False) -> int:
        """Run the merges the store's compaction policy asks for now, in this thread; returns how many it made (0
        where the store needs none). With `wait`, a merge another thread or process is making is waited for rather
        than returned from at once."""

    @abstractmethod
    def check_writable_here(self) -> None:
        """Raise IndexElsewhere, saying where to write instead, when this process must not write the index."""

    @abstractmethod
    def drop(self) -> None:
        """Remove the index and what this process cached of it; nothing happens if it never existed."""

    @abstractmethod
    def dump(self) -> IndexDump | None:
        """Every row, for `manage.py backup` to carry; None when there is nothing to carry: the index is empty, or
        it lives in the data dir, which a backup copies as it is."""


@dataclass
class OwnerBatch:
    """One owner's chunks of a write, checked."""

    owner: str
    chunk_ids: np.ndarray  # int64 [n]
    vectors: np.ndarray  # float32 [n, dimension], L2-normalised
    tokens: list[list[str]]  # each chunk's keyword tokens


def validated_batches(upserts: dict[str, Upsert] | None, dimension: int,
                      tokenize: Callable[[str], list[str]]) -> list[OwnerBatch]:
    """Each upserted owner's chunks, vectors normalised and texts tokenised. ValueError names the first owner whose
    ids, vectors and texts do not line up, or whose vectors hold NaN or infinity, and a chunk id given twice."""
    batches = [_validated(owner, *upsert, dimension, tokenize) for owner, upsert in (upserts or {}).items()]
    ids = np.concatenate([batch.chunk_ids for batch in batches]) if batches else np.empty(0, np.int64)
    if len(np.unique(ids)) != len(ids):
        raise ValueError("a chunk id appears more than once in the upserts.")
    return batches


def _validated(owner: str, chunk_ids: list[int], vectors: np.ndarray, texts: list[str], dimension: int,
               tokenize: Callable[[str], list[str]]) -> OwnerBatch:
    ids = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
    matrix = np.array(vectors, dtype=np.float32)
    if matrix.size == 0:
        matrix = matrix.reshape(0, dimension)
    if matrix.shape != (len(ids), dimension) or len(texts) != len(ids):
        raise ValueError(f"owner {owner!r}: {len(ids)} chunk ids, vectors of shape {np.shape(vectors)} and "
                         f"{len(texts)} texts; expected one {dimension}-dimension vector and one text per id.")
    if not np.isfinite(matrix).all():
        raise ValueError(f"owner {owner!r}: a vector holds NaN or infinity.")
    return OwnerBatch(owner, ids, normalised(matrix), [tokenize(text) for text in texts])


def normalised_query(vector: np.ndarray, dimension: int) -> np.ndarray:
    """The query vector scaled to length 1; ValueError when its dimension is not the index's."""
    query = normalised(np.reshape(vector, (1, -1)))[0]
    if len(query) != dimension:
        raise ValueError(f"vector has {len(query)} dimensions; this index has {dimension}.")
    return query
