"""Format 2: the whole-copy generations of earlier releases, read in place and converted to segments.

A format-2 generation dir holds manifest.json (owner -> chunk ids), chunk_ids.npy (the chunk of term-count row i),
term_counts.npz and vocabulary.json (laid out as a segment's), and dense.faiss, an IndexIDMap2(IndexFlatIP) whose
rows need not follow chunk_ids.npy (a removal compacted them, new rows were appended). It reads as one segment with
nothing deleted, so its answers are those it gave. Converting it writes that segment, hard-linking the three files
the formats share, then publishes a format-3 generation naming it: under LOCK and crash-safe like any write, the
format-2 generation staying in force until CURRENT is swapped.
"""

import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np

from rag_studio.search.embedded.layout import (
    FORMAT_VERSION,
    LOCK,
    STAGING_PREFIX,
    WHOLE_COPY_FORMAT,
    lock_if_free,
    make_manifest,
    publish,
    read_current,
    remove_stale,
    save_array,
    segment_name,
)
from rag_studio.search.embedded.segments import Part, Segment, staged_segment, write_ann

if TYPE_CHECKING:
    from rag_studio.search.embedded.readers import Generation

logger = logging.getLogger(__name__)


def read_whole_copy(directory: Path, manifest: dict) -> tuple[dict, list[Part]]:
    """The format-2 generation in `directory` as (the manifest its conversion publishes, its one segment's part;
    none when it is empty)."""
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
    segment = Segment(directory, (chunk_ids, vectors.reshape(-1, dense.d)[order[at]], owners))
    if not segment.rows:
        return make_manifest(dense.d, 1, []), []
    entry = {"name": segment_name(1), "rows": segment.rows, "deletes": None, "deleted": 0}
    return make_manifest(dense.d, 2, [entry]), [Part(entry, segment, np.empty(0, np.int64), None)]


def convert_whole_copy(root: Path, generation: "Generation") -> int:
    """Under LOCK, with CURRENT naming `generation`, a whole copy: publish it converted as the next generation,
    whose number this returns. Killed before the swap of CURRENT, it leaves the whole copy in force and files the
    next write (or conversion) removes."""
    remove_stale(root, generation.number)
    for part in generation.parts:
        with staged_segment(root, part.entry["name"], STAGING_PREFIX) as staging:
            for name in ("chunk_ids.npy", "term_counts.npz", "vocabulary.json"):
                _link_or_copy(part.segment.directory / name, staging / name)
            save_array(staging / "vectors.npy", part.segment.vectors)
            (staging / "owners.json").write_text(json.dumps(part.segment.owners, sort_keys=True), encoding="utf-8")
            write_ann(staging, part.segment.vectors)
    publish(root, generation.number + 1, generation.manifest)
    remove_stale(root, generation.number + 1)
    logger.info("Converted the format-%d index in %s to format %d", WHOLE_COPY_FORMAT, root, FORMAT_VERSION)
    return generation.number + 1


def convert_if_lock_free(root: Path, generation: "Generation") -> bool:
    """Convert `generation`, a whole copy CURRENT named, unless another thread or process holds LOCK (a write, or
    a conversion: the whole copy answers meanwhile). Returns whether CURRENT names another generation now."""
    with lock_if_free(root / LOCK, wait=False) as held:
        if not held:
            return False
        if read_current(root) == generation.number:
            convert_whole_copy(root, generation)
        return True


def _link_or_copy(source: Path, target: Path) -> None:
    """Both files are immutable: sharing the inode saves rewriting them."""
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, target)
