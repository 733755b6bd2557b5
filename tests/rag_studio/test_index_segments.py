"""The embedded store's segments: writes that add a segment and tombstones, merges, kill-mid-merge recovery, and IVF
search past the size threshold."""

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from rag_studio.search.embedded import merging, segments
from rag_studio.search.embedded.layout import generation_name, read_current
from rag_studio.search.embedded.store import EmbeddedStore

DIMENSION = 8


def owner_upsert(owner: int, chunks: int = 5, dimension: int = DIMENSION) -> tuple[list[int], np.ndarray, list[str]]:
    """Chunks whose ids and texts tell which owner wrote them; every text contains "common", the owner's own words
    repeat a number of times that varies by chunk (so BM25 scores differ)."""
    ids = [owner * 1000 + i for i in range(chunks)]
    vectors = np.random.default_rng(owner).standard_normal((chunks, dimension)).astype(np.float32)
    texts = [f"common owner{owner} " + " ".join(["word"] * (i % 4) + [f"part{i}"] * (owner % 3)) for i in range(chunks)]
    return ids, vectors, texts


def manifest(root: Path) -> dict:
    return json.loads((root / generation_name(read_current(root)) / "manifest.json").read_text())


def segment_dirs(root: Path) -> list[str]:
    return sorted(entry.name for entry in root.iterdir() if entry.name.startswith("seg-"))


def results(store: EmbeddedStore, queries: list[str]) -> list:
    """Everything a search shows: keyword and dense hits with their scores, and the statistics fusion reads."""
    shown = []
    for number, query in enumerate(queries):
        keyword_stats, dense_stats = {}, {}
        keyword = store.search_keyword(query, 10, keyword_stats)
        dense = store.search_dense(np.random.default_rng(number).standard_normal(DIMENSION), 10, dense_stats)
        shown.append((keyword, keyword_stats, dense, dense_stats))
    return shown


def assert_same_results(shown: list, expected: list) -> None:
    """BM25 exactly; dense hits in the same order with the same cosines to float32 precision (a BLAS product
    rounds the last bit differently over matrices of other shapes, as it did before segments)."""
    for (keyword, keyword_stats, dense, dense_stats), (keyword_0, keyword_stats_0, dense_0, dense_stats_0) in \
            zip(shown, expected, strict=True):
        assert (keyword, keyword_stats) == (keyword_0, keyword_stats_0)
        assert [chunk_id for chunk_id, _ in dense] == [chunk_id for chunk_id, _ in dense_0]
        assert [score for _, score in dense] == pytest.approx([score for _, score in dense_0], abs=1e-6)
        assert dense_stats == pytest.approx(dense_stats_0, abs=1e-6)


QUERIES = ["common", "owner3 part1", "word word part2", "owner1 common part0", "nothing"]


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "kb-1" / "model-a"


@pytest.fixture
def no_background_merges(monkeypatch):
    """Merges only where a test asks for them, so it can look at the segments writes leave."""
    monkeypatch.setattr(merging.BackgroundMerger, "request", lambda self: None)


def test_a_write_adds_a_segment_of_its_chunks_and_leaves_older_segments_untouched(root, no_background_merges):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1), "2": owner_upsert(2)})
    first = root / segment_dirs(root)[0]
    written = {path.name: path.stat().st_mtime_ns for path in first.iterdir()}

    store.apply(upserts={"3": owner_upsert(3, chunks=7)})

    assert segment_dirs(root) == ["seg-000001", "seg-000002"]
    assert [(entry["rows"], entry["deleted"]) for entry in manifest(root)["segments"]] == [(10, 0), (7, 0)]
    assert {path.name: path.stat().st_mtime_ns for path in first.iterdir()} == written
    assert store.count() == 17
    assert store.chunk_ids("3") == [3000 + i for i in range(7)]


def test_removals_and_replacements_become_tombstones_and_search_as_if_rewritten(root, tmp_path, no_background_merges):
    store = EmbeddedStore(root, DIMENSION)
    for owner in (1, 2, 3):
        store.apply(upserts={str(owner): owner_upsert(owner)})
    store.apply(removals=["2"])
    store.apply(upserts={"1": owner_upsert(1, chunks=3), "4": ([3004], np.ones((1, DIMENSION)), ["moved common"])})

    entries = manifest(root)["segments"]
    assert [(entry["rows"], entry["deleted"]) for entry in entries] == [(5, 5), (5, 5), (5, 1), (4, 0)]
    assert store.chunk_ids("3") == [3000, 3001, 3002, 3003]  # 3004 moved to owner 4
    # The same live chunks written in one go, in the same order: the same hits, scores and statistics.
    rewritten = EmbeddedStore(tmp_path / "rewritten", DIMENSION)
    live = {"3": owner_upsert(3, chunks=4), "1": owner_upsert(1, chunks=3),
            "4": ([3004], np.ones((1, DIMENSION)), ["moved common"])}
    rewritten.apply(upserts=live)
    assert store.count() == rewritten.count() == 8
    assert_same_results(results(store, QUERIES), results(rewritten, QUERIES))
    assert store.search_keyword("owner2", 10) == []
    np.testing.assert_array_equal(store.vectors([3004, 1000]), rewritten.vectors([3004, 1000]))
    with pytest.raises(KeyError, match="chunk 2000"):
        store.vectors([2000])


def test_a_merge_rewrites_a_level_of_segments_as_one_without_changing_any_result(root, settings,
                                                                                 no_background_merges):
    settings.RAG_INDEX_MERGE_FACTOR = 3
    store = EmbeddedStore(root, DIMENSION)
    for owner in (1, 2):
        store.apply(upserts={str(owner): owner_upsert(owner)})
    assert store.merge() == 0  # two segments: below the factor
    store.apply(upserts={"3": owner_upsert(3)})
    store.apply(upserts={"4": ([2004], np.ones((1, DIMENSION)), ["moved common"])})  # a tombstone in seg 2
    before = results(store, QUERIES)

    assert store.merge() == 1

    assert [(entry["name"], entry["rows"], entry["deleted"]) for entry in manifest(root)["segments"]] == \
        [("seg-000005", 14, 0), ("seg-000004", 1, 0)]
    assert_same_results(results(store, QUERIES), before)
    assert store.chunk_ids("2") == [2000, 2001, 2002, 2003] and store.chunk_ids("4") == [2004]
    # The sources stay while the generation before the merge does (a reader may be loading it), then go.
    store.apply(upserts={"6": owner_upsert(6)})
    assert segment_dirs(root) == ["seg-000004", "seg-000005", "seg-000006"]


def test_a_segment_mostly_deleted_is_rewritten_on_its_own(root, no_background_merges):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1), "2": owner_upsert(2, chunks=2)})
    store.apply(upserts={"3": owner_upsert(3)})
    store.apply(removals=["1"])

    assert store.merge() == 1

    assert [(entry["rows"], entry["deleted"]) for entry in manifest(root)["segments"]] == [(2, 0), (5, 0)]
    assert store.chunk_ids("2") == [2000, 2001] and store.count() == 7


def test_deletes_made_while_a_merge_runs_reach_the_merged_segment(root, settings, monkeypatch,
                                                                  no_background_merges):
    settings.RAG_INDEX_MERGE_FACTOR = 2
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1)})
    store.apply(upserts={"2": owner_upsert(2)})
    merged = segments.SegmentContents.merged

    def merged_while_writing(parts, dimension):
        monkeypatch.setattr(segments.SegmentContents, "merged", merged)  # one write during the first merge
        contents = merged(parts, dimension)
        EmbeddedStore(root, DIMENSION).apply(removals=["1"], upserts={"3": owner_upsert(3)})
        return contents

    monkeypatch.setattr(segments.SegmentContents, "merged", merged_while_writing)
    assert store.merge() >= 1

    assert store.chunk_ids("1") == [] and store.search_keyword("owner1", 10) == []
    assert store.count() == 10
    assert sorted(chunk_id for chunk_id, _ in store.search_keyword("common", 100)) == \
        [*range(2000, 2005), *range(3000, 3005)]


def test_writes_ask_for_a_background_merge_when_segments_pile_up(root, settings):
    settings.RAG_INDEX_MERGE_FACTOR = 3
    store = EmbeddedStore(root, DIMENSION)
    for owner in range(1, 4):
        store.apply(upserts={str(owner): owner_upsert(owner)})

    deadline = time.monotonic() + 20
    while len(manifest(root)["segments"]) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(manifest(root)["segments"]) == 1
    assert store.count() == 15


def merge_forever(root: Path) -> None:
    """Run in a child process until killed: a write, then the merges it calls for, in this thread."""
    store = EmbeddedStore(root, 32)
    owner = 1
    while True:
        store.apply(upserts={str(owner): owner_upsert(owner, chunks=400, dimension=32)})
        store.merge()
        owner += 1


def test_a_process_killed_mid_merge_loses_nothing_and_doubles_nothing(root, monkeypatch):
    monkeypatch.setenv("FACTORY_RAG_INDEX_MERGE_FACTOR", "2")  # read by the child's settings: a merge every write
    spawn = multiprocessing.get_context("spawn")
    interrupted = 0
    for delay in (0.0, 0.001, 0.005, 0.02):
        merger = spawn.Process(target=merge_forever, args=(root,))
        merger.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                read_current(root) >= 4 and any(entry.name.startswith("merging-") for entry in root.iterdir())):
            time.sleep(0.0005)
        time.sleep(delay)
        os.kill(merger.pid, signal.SIGKILL)
        merger.join()
        interrupted += any(entry.name.startswith("merging-") for entry in root.iterdir())

        store = EmbeddedStore(root, 32)
        found = [chunk_id for chunk_id, _ in store.search_keyword("common", 10**7)]
        assert len(found) == len(set(found)) == store.count()  # nothing doubled
        owners = sorted({chunk_id // 1000 for chunk_id in found})
        assert owners == list(range(1, len(owners) + 1))  # every completed write's owner, none lost
        assert sorted(found) == [owner * 1000 + i for owner in owners for i in range(400)]

    assert interrupted, "no kill landed mid-merge"
    store.merge()  # the next merge sweeps the dead one's leftovers
    assert not any(entry.name.startswith("merging-") for entry in root.iterdir())
    assert store.count() == 400 * len(owners)


def clustered_vectors(rng: np.random.Generator, centres: np.ndarray, count: int) -> np.ndarray:
    """Unit vectors around topic centres, as embeddings of texts on a few hundred topics are."""
    vectors = centres[rng.integers(0, len(centres), count)] + 0.1 * rng.standard_normal((count, centres.shape[1]))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def test_past_the_threshold_dense_search_is_approximate_with_high_recall(root, settings, no_background_merges):
    settings.RAG_INDEX_ANN_THRESHOLD = 3000
    dimension, rng = 32, np.random.default_rng(5)
    centres = rng.standard_normal((60, dimension))
    vectors = clustered_vectors(rng, centres, 6000)
    store = EmbeddedStore(root, dimension)
    store.apply(upserts={"small": (list(range(500)), vectors[:500], ["text"] * 500)})
    assert store.search_method() == "exact"
    store.apply(upserts={"big": (list(range(500, 6000)), vectors[500:], ["text"] * 5500)})
    store.apply(removals=["small"])
    assert store.search_method() == "ivf"
    assert (root / manifest(root)["segments"][1]["name"] / "ann.faiss").exists()

    live = vectors[500:]
    recalls, means = [], []
    for query in clustered_vectors(rng, centres, 50):
        stats = {}
        found = [chunk_id for chunk_id, _ in store.search_dense(query, 10, stats)]
        exact = (500 + np.argsort(-(live @ query))[:10]).tolist()
        recalls.append(len(set(found) & set(exact)) / 10)
        assert all(chunk_id >= 500 for chunk_id in found)  # tombstoned chunks never come back
        means.append((stats["mean"], float((live @ query).mean())))
    assert np.mean(recalls) >= 0.95
    assert np.allclose(*zip(*means), atol=0.03)  # the sampled statistics track the exact ones
