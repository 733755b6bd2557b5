"""Reading: a loaded generation and its searches (exact or IVF dense search, BM25 summed over the segments), and the
one cached generation per root per process that every store on that root reads."""

import logging
import math
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import faiss
import numpy as np
from django.conf import settings

from rag_studio.search.embedded.conversion import convert_if_lock_free, read_whole_copy
from rag_studio.search.embedded.layout import (
    WHOLE_COPY_FORMAT,
    generation_name,
    read_current,
    read_manifest,
    roots_under,
)
from rag_studio.search.embedded.segments import Part, Segment
from rag_studio.search.index_store import BM25_B, BM25_K1, Hits

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Generation:
    """A loaded generation: its segments and their deletes, never modified, so searches need no lock. Live rows
    are numbered segment after segment, in manifest order."""

    number: int
    manifest: dict  # for a whole copy, the manifest its conversion publishes
    parts: list[Part]
    whole_copy: bool = False  # a format-2 generation, read in place

    @classmethod
    def load(cls, root: Path, number: int, dimension: int) -> "Generation":
        manifest = read_manifest(root / generation_name(number), dimension)
        if manifest["format"] == WHOLE_COPY_FORMAT:
            converted, parts = read_whole_copy(root / generation_name(number), manifest)
            return cls(number, converted, parts, whole_copy=True)
        reader = shared_reader(root)
        parts = []
        for entry in manifest["segments"]:
            segment = reader.segment(entry["name"])
            parts.append(Part(entry, segment, *segment.deletes(entry["deletes"])))
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

    def search_dense(self, query: np.ndarray, k: int, stats: dict | None) -> Hits:
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
            fill_stats(stats, np.concatenate(exact_scores))
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
            order, ordered = segment.sorted_chunk_ids
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


def fill_stats(stats: dict | None, scores: np.ndarray) -> None:
    if stats is not None and len(scores):
        stats.update(mean=float(scores.mean(dtype=np.float64)), std=float(scores.std(dtype=np.float64)),
                     count=int(len(scores)))


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


class SharedReader:
    """The current generation of one root, loaded lazily and reloaded when CURRENT changes, and the segments
    loaded so far."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._segments_lock = threading.Lock()
        self._generation: Generation | None = None
        self._segments: dict[str, Segment] = {}
        self._may_convert = True  # false once this process found it may not write a format-2 root's conversion

    def current(self, dimension: int) -> Generation | None:
        # Reading CURRENT costs microseconds, and generation numbers only grow: an exact freshness check.
        loaded = self._generation
        if read_current(self.root) != (loaded.number if loaded else 0) or \
                (loaded is not None and loaded.whole_copy and self._may_convert):
            with self._lock:
                self._generation = self._load_latest(dimension)
        return self._generation

    def segment(self, name: str) -> Segment:
        with self._segments_lock:
            if name not in self._segments:
                self._segments[name] = Segment(self.root / name)
            return self._segments[name]

    def keep_segments(self, in_use: set[str]) -> None:
        """Drop cached segments the generation just loaded no longer uses (merged away); a search, write or merge
        still using an older generation holds its own references."""
        with self._segments_lock:
            self._segments = {name: segment for name, segment in self._segments.items() if name in in_use}

    def _load_latest(self, dimension: int) -> Generation | None:
        while True:
            number = read_current(self.root)
            if number == 0:
                return None
            generation = self._generation  # another thread may have loaded it while this one waited for the lock
            if generation is None or generation.number != number:
                try:
                    generation = Generation.load(self.root, number, dimension)
                except (OSError, RuntimeError):
                    # Two writes since CURRENT was read may have deleted this generation or one of its segments
                    # (faiss reports a missing file as RuntimeError): follow CURRENT. Anything else is a real error.
                    if read_current(self.root) == number:
                        raise
                    continue
            if not (generation.whole_copy and self._converted(generation)):
                return generation

    def _converted(self, generation: Generation) -> bool:
        """Whether CURRENT moved on from `generation`, a whole copy, after trying to convert it. A process that may
        not write here (a web server as another user, a read-only mount) searches the whole copy as it is."""
        if not self._may_convert:
            return False
        try:
            return convert_if_lock_free(self.root, generation)
        except OSError as error:
            self._may_convert = False
            logger.warning("The format-%d index in %s is searched as it is: converting it failed (%s)",
                           WHOLE_COPY_FORMAT, self.root, error)
            return False


_READERS: dict[Path, SharedReader] = {}
_READERS_LOCK = threading.Lock()


def shared_reader(root: Path) -> SharedReader:
    key = Path(root).resolve()
    with _READERS_LOCK:
        return _READERS.setdefault(key, SharedReader(key))


def forget_readers(under: Path) -> None:
    """Drop this process's cached generations and segments of every index under `under`, a directory being removed
    or reused."""
    with _READERS_LOCK:
        for root in roots_under(_READERS, under):
            del _READERS[root]
