"""Merges: the tiered policy that keeps the segment count low (the package docstring says how), the merge itself, and
the background thread per index and process that runs them after writes."""

import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.conf import settings

from rag_studio.search.embedded.layout import (
    CURRENT,
    LOCK,
    MERGE_LOCK,
    MERGE_STAGING_PREFIX,
    exclusive_lock,
    lock_if_free,
    make_manifest,
    publish,
    read_current,
    remove_stale,
    roots_under,
    segment_name,
)
from rag_studio.search.embedded.readers import Generation
from rag_studio.search.embedded.segments import SegmentContents, write_deletes

logger = logging.getLogger(__name__)

# Segments under this many live rows share the lowest merge level: merging small segments costs little.
MERGE_FLOOR_ROWS = 1000
# A segment with more than this share of its rows deleted is rewritten on its own.
MERGE_DELETED_SHARE = 0.5


@dataclass(frozen=True)
class PartSize:
    live: int
    deleted: int


def manifest_parts(manifest: dict) -> list[PartSize]:
    return [PartSize(entry["rows"] - entry["deleted"], entry["deleted"]) for entry in manifest["segments"]]


def merge_plan(parts: list[PartSize]) -> list[int] | None:
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
    with lock_if_free(root / MERGE_LOCK, wait) as held:
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
    snapshot = Generation.load(root, number, dimension)
    positions = merge_plan([PartSize(part.live_count, len(part.deleted)) for part in snapshot.parts])
    if positions is None:
        return False
    sources = [snapshot.parts[position] for position in positions]
    merged = SegmentContents.merged(sources, dimension)
    with exclusive_lock(root / LOCK):
        current_number = read_current(root)
        remove_stale(root, current_number)
        current = Generation.load(root, current_number, dimension)
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
                merged_entry.update(deletes=write_deletes(root / name, current_number + 1, doomed),
                                    deleted=len(doomed))
        for part in current.parts:
            if part.segment.name == sources[0].segment.name and len(merged.chunk_ids):
                entries.append(merged_entry)
            elif part.segment.name not in source_names:
                entries.append(part.entry)
        publish(root, current_number + 1, make_manifest(dimension, next_segment, entries))
        remove_stale(root, current_number + 1)
    return True


def _rows_of(chunk_ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.isin(chunk_ids, wanted)).astype(np.int64)


class BackgroundMerger:
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


_MERGERS: dict[Path, BackgroundMerger] = {}
_MERGERS_LOCK = threading.Lock()


def background_merger(root: Path, dimension: int) -> BackgroundMerger:
    with _MERGERS_LOCK:
        return _MERGERS.setdefault(root.resolve(), BackgroundMerger(root.resolve(), dimension))


def forget_mergers(under: Path) -> None:
    """Drop this process's background mergers of every index under `under`, a directory being removed or reused."""
    with _MERGERS_LOCK:
        for root in roots_under(_MERGERS, under):
            del _MERGERS[root]


def _forget_mergers_after_fork() -> None:
    # A forked child (a Celery pool process) inherits the registry but not the threads.
    global _MERGERS_LOCK
    _MERGERS.clear()
    _MERGERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_mergers_after_fork)
