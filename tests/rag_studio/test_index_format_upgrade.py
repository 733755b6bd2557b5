"""An index written by an earlier release (format 2: a whole copy of the index per generation) answers as before
with this release's embedded store, is converted to segments by the first write or free reader, takes writes and
deletes afterwards, and a conversion killed half way leaves it answering and converted by the next open."""

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import faiss
import numpy as np
import pytest
from scipy import sparse

from rag_studio.search.embedded import conversion, layout
from rag_studio.search.embedded.layout import generation_name, read_current
from rag_studio.search.embedded.store import EmbeddedStore
from rag_studio.search.keywords import keyword_tokens
from rag_studio.vectors import normalised
from tests.rag_studio.test_index_segments import (
    DIMENSION,
    QUERIES,
    assert_same_results,
    manifest,
    owner_upsert,
    results,
    segment_dirs,
)

OWNERS = {str(owner): owner_upsert(owner) for owner in range(1, 6)}


def write_whole_copy(root: Path, number: int, owners: dict) -> None:
    """Generation `number` as the previous release's writer left it (format 2, frozen here from its
    `_Contents.write`), and CURRENT naming it. Its dense rows are in another order than its term-count rows, as a
    removal followed by new rows leaves them."""
    directory = root / generation_name(number)
    directory.mkdir(parents=True)
    chunk_ids = np.concatenate([np.empty(0, np.int64), *(np.asarray(ids, np.int64) for ids, _, _ in owners.values())])
    vectors = normalised(np.concatenate([np.empty((0, DIMENSION), np.float32),
                                         *(np.asarray(vectors, np.float32) for _, vectors, _ in owners.values())]))
    rows = [keyword_tokens(text) for _, _, texts in owners.values() for text in texts]
    columns: dict[str, int] = {}
    tokens = np.fromiter((columns.setdefault(token, len(columns)) for row in rows for token in row), np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows], dtype=np.int64)])
    counts = sparse.csr_array((np.ones(len(tokens), np.int32), tokens, offsets), shape=(len(rows), len(columns)))
    counts.sum_duplicates()
    dense = faiss.IndexIDMap2(faiss.IndexFlatIP(DIMENSION))
    dense_order = np.random.default_rng(7).permutation(len(chunk_ids))
    dense.add_with_ids(vectors[dense_order], chunk_ids[dense_order])
    (directory / "manifest.json").write_text(json.dumps({
        "format": 2, "dimension": DIMENSION, "count": len(chunk_ids),
        "owners": {owner: list(ids) for owner, (ids, _, _) in owners.items()}}, sort_keys=True), encoding="utf-8")
    np.save(directory / "chunk_ids.npy", chunk_ids)
    sparse.save_npz(directory / "term_counts.npz", counts.tocsc(), compressed=False)
    (directory / "vocabulary.json").write_text(json.dumps(list(columns), ensure_ascii=False), encoding="utf-8")
    faiss.write_index(dense, str(directory / "dense.faiss"))
    (root / "CURRENT").write_text(generation_name(number) + "\n", encoding="ascii")


@pytest.fixture
def root(tmp_path) -> Path:
    """A format-2 index at generation 4, with generation 3 kept beside it as that release kept the previous one."""
    root = tmp_path / "kb-1" / "model-a"
    write_whole_copy(root, 3, dict(list(OWNERS.items())[:3]))
    write_whole_copy(root, 4, OWNERS)
    return root


@pytest.fixture
def reference(tmp_path) -> EmbeddedStore:
    """The same chunks written by this release."""
    store = EmbeddedStore(tmp_path / "reference", DIMENSION)
    store.apply(upserts=OWNERS)
    return store


def assert_converted(root: Path) -> None:
    assert manifest(root)["format"] == layout.FORMAT_VERSION
    assert segment_dirs(root) == ["seg-000001"]
    assert not [entry.name for entry in root.iterdir() if entry.name.startswith("tmp-")]
    # The arrays the formats share are the format-2 files themselves, not copies.
    assert (root / "seg-000001" / "term_counts.npz").samefile(root / generation_name(4) / "term_counts.npz")


@pytest.mark.parametrize("first_use", ["search", "write"])
def test_a_previous_release_index_answers_as_before_and_takes_writes_and_deletes(root, reference, first_use):
    store = EmbeddedStore(root, DIMENSION)
    if first_use == "search":
        assert_same_results(results(store, QUERIES), results(reference, QUERIES))
        assert read_current(root) == 5
        assert_converted(root)
    new_owner = owner_upsert(9)
    changes = {"upserts": {"9": new_owner, "2": owner_upsert(12)}, "removals": ["3"]}
    store.apply(**changes)
    reference.apply(**changes)

    assert_same_results(results(store, QUERIES), results(reference, QUERIES))
    assert store.count() == reference.count() == 25
    assert store.chunk_ids("3") == []
    assert store.chunk_ids("1") == OWNERS["1"][0]
    assert store.chunk_ids("9") == new_owner[0]
    assert np.array_equal(store.vectors(OWNERS["5"][0]), reference.vectors(OWNERS["5"][0]))
    assert manifest(root)["format"] == layout.FORMAT_VERSION


def test_a_previous_release_index_empty_after_its_last_removal_opens_empty(tmp_path):
    root = tmp_path / "kb-2" / "model-a"
    write_whole_copy(root, 1, {})
    store = EmbeddedStore(root, DIMENSION)
    assert store.search_keyword("common", 10) == [] and store.count() == 0
    store.apply(upserts={"1": OWNERS["1"]})
    assert store.chunk_ids("1") == OWNERS["1"][0]


def convert_until_paused(root: Path, pause: str, ready: Path) -> None:
    """Run in a child process until killed: open the index, whose first search converts it, and stop (LOCK
    held) just before publishing the converted generation or just before swapping CURRENT to it."""
    def stop(*args) -> None:
        ready.touch()
        time.sleep(600)

    if pause == "before publishing":
        conversion.publish = stop
    else:
        replace = os.replace

        def replace_current_after_stop(source, target) -> None:
            if Path(target).name == layout.CURRENT:
                stop()
            replace(source, target)

        os.replace = replace_current_after_stop
    EmbeddedStore(root, DIMENSION).search_keyword("common", 10)


@pytest.mark.parametrize("pause", ["before publishing", "before swapping CURRENT"])
def test_a_conversion_killed_half_way_leaves_the_old_index_answering_and_the_next_open_converts(
        root, reference, tmp_path, pause):
    ready = tmp_path / "ready"
    converter = multiprocessing.get_context("spawn").Process(target=convert_until_paused, args=(root, pause, ready))
    converter.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and converter.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.exists(), "the conversion never got to the point where it is killed"
        assert segment_dirs(root) == ["seg-000001"]  # written, not yet in force

        # A reader meanwhile: LOCK is held, so it searches the format-2 generation in place.
        store = EmbeddedStore(root, DIMENSION)
        assert_same_results(results(store, QUERIES), results(reference, QUERIES))
        assert read_current(root) == 4
    finally:
        os.kill(converter.pid, signal.SIGKILL)
        converter.join()

    assert read_current(root) == 4
    assert json.loads((root / generation_name(4) / "manifest.json").read_text())["format"] == 2
    # The next search finds LOCK free and converts, replacing what the killed conversion left.
    assert_same_results(results(store, QUERIES), results(reference, QUERIES))
    assert read_current(root) == 5
    assert_converted(root)
    assert_same_results(results(EmbeddedStore(root, DIMENSION), QUERIES), results(reference, QUERIES))
