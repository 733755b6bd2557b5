"""EmbeddedStore: the index store of a knowledge base on the embedded backend, and its writes (the package docstring
says how they stay atomic and cheap)."""

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from django.conf import settings

from rag_studio import files
from rag_studio.search.embedded.conversion import convert_whole_copy
from rag_studio.search.embedded.layout import (
    LOCK,
    STAGING_PREFIX,
    exclusive_lock,
    make_manifest,
    publish,
    read_current,
    remove_stale,
    segment_name,
)
from rag_studio.search.embedded.merging import (
    background_merger,
    forget_mergers,
    manifest_parts,
    merge_plan,
    merge_segments,
)
from rag_studio.search.embedded.readers import Generation, fill_stats, forget_readers, shared_reader
from rag_studio.search.embedded.segments import SegmentContents, write_deletes
from rag_studio.search.index_store import (
    Hits,
    IndexDump,
    IndexElsewhere,
    IndexStore,
    OwnerBatch,
    Upsert,
    normalised_query,
    validated_batches,
)
from rag_studio.search.keywords import keyword_tokens, tokenizer_for

EXACT, IVF = "exact", "ivf"


class EmbeddedStore(IndexStore):
    """One KB + embedding model's indexes in `root` (a directory). `kb_id` and `home` (the knowledge base's
    `index_home`) say where it may be written from; a store without them is written from anywhere."""

    def __init__(self, root: Path, dimension: int, tokenize: Callable[[str], list[str]] = keyword_tokens, *,
                 kb_id: int | None = None, home: dict | None = None):
        self.root = Path(root)
        self.dimension = dimension
        self.tokenize = tokenize
        self.kb_id, self.home = kb_id, home
        self._reader = shared_reader(self.root)

    @classmethod
    def for_index(cls, kb, key: str) -> "EmbeddedStore":
        return cls(files.index_dir(kb.pk, key), kb.embedding_dimensions, tokenizer_for(kb, key), kb_id=kb.pk,
                   home=kb.index_home or None)

    @classmethod
    def check_available(cls) -> None:
        """Always available: the data dir is there."""

    @classmethod
    def drop_knowledge_base(cls, kb_id: int) -> None:
        _remove(files.indexes_dir(kb_id))

    def apply(self, *, upserts: dict[str, Upsert] | None = None, removals: list[str] | None = None) -> None:
        """See IndexStore.apply. Segments that pile up are merged afterwards in a background thread."""
        batches = validated_batches(upserts, self.dimension, self.tokenize)
        removed = set(removals or ())
        if not batches and not removed:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.root / LOCK):
            number = read_current(self.root)
            remove_stale(self.root, number)
            previous = Generation.load(self.root, number, self.dimension) if number else None
            if previous is not None and previous.whole_copy:
                number = convert_whole_copy(self.root, previous)
                previous = Generation.load(self.root, number, self.dimension)
            manifest = _written_changes(self.root, previous, number + 1, batches, removed, self.dimension)
            publish(self.root, number + 1, manifest)
            remove_stale(self.root, number + 1)
        if merge_plan(manifest_parts(manifest)) is not None:
            background_merger(self.root, self.dimension).request()

    def search_dense(self, vector: np.ndarray, k: int, stats: dict | None = None) -> Hits:
        """See IndexStore.search_dense; the statistics are exact where every row is scored anyway, from a fixed
        sample of rows in segments searched by IVF."""
        query = normalised_query(vector, self.dimension)
        generation = self._reader.current(self.dimension)
        if generation is None or k < 1:
            return []
        return generation.search_dense(query, k, stats)

    def search_keyword(self, query: str, k: int, stats: dict | None = None) -> Hits:
        generation = self._reader.current(self.dimension)
        if generation is None or not generation.has_terms or k < 1:
            return []
        scores = generation.keyword_scores(self.tokenize(query))  # one per live row; 0 where no query token occurs
        fill_stats(stats, scores)
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
        """The number of the generation CURRENT names (a write or a merge publishes the next); 0 before the
        first write."""
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

    def check_writable_here(self) -> None:
        """An embedded index lives in one data dir: a worker with another one (a second node) would write a
        separate, partial index that the web processes never read. Refuse, and say how to share the base instead."""
        if self.home is None:
            return
        here = files.index_home()
        if here["data_dir"] != self.home.get("data_dir"):
            raise IndexElsewhere(
                f"This knowledge base keeps its index in the data dir of node {self.home.get('node')!r}, and this "
                f"worker (node {here['node']!r}) has a data dir of its own: writing here would split the index. "
                f"Ingest on node {self.home.get('node')!r}, or move the knowledge base to the shared pgvector store "
                f"(manage.py move_index {self.kb_id} --to pgvector).")

    def drop(self) -> None:
        _remove(self.root)

    def dump(self) -> IndexDump | None:
        """Nothing: the index's files are in the data dir, which a backup copies as they are."""
        return None


def _remove(directory: Path) -> None:
    """Remove the indexes under `directory`, and what this process caches of them: generation and segment numbers
    start again at 1 in a new index at the same path, so the cache would take them for fresh."""
    shutil.rmtree(directory, ignore_errors=True)
    forget_readers(directory)
    forget_mergers(directory)


def _written_changes(root: Path, previous: Generation | None, number: int, batches: list[OwnerBatch],
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
                entry.update(deletes=write_deletes(root / part.segment.name, number, deleted), deleted=len(deleted))
            entries.append(entry)
    if len(new_ids):
        name = segment_name(next_segment)
        next_segment += 1
        SegmentContents.from_batches(batches, dimension).write(root, name, STAGING_PREFIX)
        entries.append({"name": name, "rows": len(new_ids), "deletes": None, "deleted": 0})
    return make_manifest(dimension, next_segment, entries)
