"""The embedded store: one KB's dense + keyword indexes on disk, written by several processes, read by others."""

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rag_studio.search.embedded.layout import generation_name, read_current
from rag_studio.search.embedded.readers import Generation
from rag_studio.search.embedded.store import EmbeddedStore
from rag_studio.search.keywords import keyword_tokens

DIMENSION = 8


def unit(axis: int) -> np.ndarray:
    vector = np.zeros(DIMENSION, dtype=np.float32)
    vector[axis % DIMENSION] = 1.0
    return vector


def random_vectors(seed: int, count: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, DIMENSION)).astype(np.float32)


def owner_upsert(owner_number: int, chunks: int = 5) -> tuple[list[int], np.ndarray, list[str]]:
    """Chunks whose ids and texts tell which owner wrote them; every text contains "common"."""
    ids = [owner_number * 100 + i for i in range(chunks)]
    return ids, random_vectors(owner_number, chunks), [f"common owner{owner_number} part{i}" for i in range(chunks)]


def generation_dirs(root: Path) -> list[str]:
    return sorted(entry.name for entry in root.iterdir() if entry.name.startswith("gen-"))


def staging_dirs(root: Path) -> list[str]:
    return [entry.name for entry in root.iterdir() if entry.name.startswith("tmp-")]


def assert_consistent(store: EmbeddedStore, owners: list[int], chunks: int) -> None:
    """Both indexes hold exactly the chunks of `owners`, once each, and each owner's chunks are findable."""
    expected = {owner * 100 + i for owner in owners for i in range(chunks)}
    assert store.count() == len(expected)
    dense_ids = [chunk_id for chunk_id, _ in store.search_dense(unit(0), 10**6)]
    keyword_ids = [chunk_id for chunk_id, _ in store.search_keyword("common", 10**6)]
    assert sorted(dense_ids) == sorted(keyword_ids) == sorted(expected)
    for owner in owners:
        assert sorted(store.chunk_ids(str(owner))) == [owner * 100 + i for i in range(chunks)]
        assert {chunk_id for chunk_id, _ in store.search_keyword(f"owner{owner}", 100)} == \
            {owner * 100 + i for i in range(chunks)}


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "kb-1" / "model-a"


def test_a_store_that_was_never_written_is_empty(root):
    store = EmbeddedStore(root, DIMENSION)
    assert (store.count(), store.generation(), store.chunk_ids("1")) == (0, 0, [])
    assert store.search_dense(unit(0), 5) == []
    assert store.search_keyword("anything", 5) == []
    assert not root.exists()


def test_upserted_chunks_are_found_by_vector_and_by_keyword(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"7": ([70, 71, 72], np.stack([unit(0) * 3, unit(1), unit(2)]),
                               ["The warranty lasts two years", "Battery life is ten hours", "Shipping is free"])})

    assert store.count() == 3
    assert store.generation() == 1
    assert store.chunk_ids("7") == [70, 71, 72]
    best_id, best_score = store.search_dense(unit(0) * 0.5, 2)[0]
    assert best_id == 70 and best_score == pytest.approx(1.0)  # both sides are normalised: a cosine
    assert [chunk_id for chunk_id, _ in store.search_dense(unit(1) + 0.1 * unit(2), 3)] == [71, 72, 70]
    keyword = store.search_keyword("How long is the WARRANTY?", 10)
    assert [chunk_id for chunk_id, _ in keyword] == [70] and keyword[0][1] > 0


def test_keyword_tokens_of_mixed_chinese_and_english_text():
    # jieba's words, then the run's overlapping character bigrams (which match however jieba splits a run)
    assert keyword_tokens("NW-7 机器人的保修期为两年") == [
        "nw", "7", "nw-7", "机器", "机器人", "保修", "保修期", "两年",
        "机器", "器人", "人的", "的保", "保修", "修期", "期为", "为两", "两年"]
    assert keyword_tokens("The ＧＰＵ driver v1.2, of course!") == ["gpu", "driver", "v1", "2", "cours", "v1.2"]
    assert keyword_tokens("，。！ ... 的了是") == []


def test_chinese_keyword_search_finds_the_chinese_chunk(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": ([1, 2, 3], np.stack([unit(0), unit(1), unit(2)]),
                               ["NW-7 机器人的保修期为两年。", "电池续航时间为十小时。", "The NW-7 ships worldwide."])})

    assert [chunk_id for chunk_id, _ in store.search_keyword("保修多久", 10)] == [1]
    assert [chunk_id for chunk_id, _ in store.search_keyword("电池", 10)] == [2]
    assert {chunk_id for chunk_id, _ in store.search_keyword("nw-7", 10)} == {1, 3}


def test_keyword_ranking_favours_rare_words_repeated_words_and_short_chunks(root):
    store = EmbeddedStore(root, DIMENSION)
    texts = {
        1: "robot arm",  # both words, one of them rare
        2: "robot robot robot wheel",  # the common word, often
        3: "robot wheel",  # the common word, once, in a short chunk
        4: "robot " + " ".join(f"filler{i}" for i in range(40)),  # the common word, once, in a long chunk
        5: "nothing relevant here",
    }
    store.apply(upserts={"1": (list(texts), random_vectors(1, len(texts)), list(texts.values()))})

    ranked = [chunk_id for chunk_id, _ in store.search_keyword("robot arm", 10)]
    assert ranked == [1, 2, 3, 4]
    # After a write that leaves a word unused, a query for it finds nothing, and the other scores still hold.
    store.apply(removals=["1"])
    store.apply(upserts={"2": ([9], random_vectors(2, 1), ["robot"])})
    assert store.search_keyword("arm", 10) == []
    assert [chunk_id for chunk_id, _ in store.search_keyword("robot", 10)] == [9]


def test_keyword_search_edge_cases(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": ([5], unit(0)[None, :], ["a lonely document about robots"])})

    assert [chunk_id for chunk_id, _ in store.search_keyword("robots", 50)] == [5]  # one document, k > corpus
    assert store.search_keyword("unknown words only", 50) == []
    assert store.search_keyword("the of ，。!", 50) == []  # nothing but stopwords and punctuation
    assert [chunk_id for chunk_id, _ in store.search_dense(unit(0), 50)] == [5]
    assert store.search_dense(unit(0), 0) == []


def test_rerunning_the_same_upsert_keeps_one_copy_of_each_chunk(root):
    store = EmbeddedStore(root, DIMENSION)
    for _ in range(3):
        store.apply(upserts={"1": owner_upsert(1), "2": owner_upsert(2)})

    assert_consistent(store, owners=[1, 2], chunks=5)
    assert store.generation() == 3


def test_an_upsert_replaces_every_chunk_the_owner_had(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1), "2": owner_upsert(2)})
    store.apply(upserts={"1": ([900, 901], np.stack([unit(3), unit(4)]), ["fresh text", "more fresh text"])})

    assert store.chunk_ids("1") == [900, 901]
    assert store.count() == 7
    assert store.search_keyword("owner1", 10) == []
    assert [chunk_id for chunk_id, _ in store.search_keyword("fresh", 10)] == [900, 901]
    dense_ids = {chunk_id for chunk_id, _ in store.search_dense(unit(3), 100)}
    assert dense_ids == {900, 901, *range(200, 205)}


def test_an_empty_upsert_leaves_the_owner_without_chunks(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1), "2": owner_upsert(2)})
    store.apply(upserts={"1": ([], np.empty((0, DIMENSION)), [])})

    assert_consistent(store, owners=[2], chunks=5)
    assert store.chunk_ids("1") == []


def test_removals_drop_the_owners_chunks_from_both_indexes(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1), "2": owner_upsert(2), "3": owner_upsert(3)})
    store.apply(removals=["2", "not-indexed"])

    assert_consistent(store, owners=[1, 3], chunks=5)
    assert store.chunk_ids("2") == []

    store.apply(removals=["1", "3"])
    assert store.count() == 0
    assert store.search_dense(unit(0), 5) == [] and store.search_keyword("common", 5) == []


def test_an_owner_both_removed_and_upserted_keeps_its_upserted_chunks(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1)})
    store.apply(upserts={"1": owner_upsert(1, chunks=2)}, removals=["1"])

    assert store.chunk_ids("1") == [100, 101]


def test_a_chunk_upserted_under_another_owner_moves_there(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1)})
    store.apply(upserts={"2": ([104], unit(5)[None, :], ["moved chunk"])})

    assert store.chunk_ids("1") == [100, 101, 102, 103]
    assert store.chunk_ids("2") == [104]
    assert store.count() == 5
    assert [chunk_id for chunk_id, _ in store.search_keyword("moved", 10)] == [104]


@pytest.mark.parametrize("upsert, message", [
    (([1, 2], np.zeros((2, DIMENSION + 1), np.float32), ["a", "b"]), "expected one 8-dimension vector"),
    (([1, 2], np.zeros((3, DIMENSION), np.float32), ["a", "b"]), "expected one 8-dimension vector"),
    (([1, 2], np.zeros((2, DIMENSION), np.float32), ["a"]), "expected one 8-dimension vector"),
    (([1, 1], np.zeros((2, DIMENSION), np.float32), ["a", "b"]), "more than once"),
    (([1], np.full((1, DIMENSION), np.nan), ["a"]), "NaN"),
])
def test_invalid_upserts_are_refused_before_anything_is_written(root, upsert, message):
    with pytest.raises(ValueError, match=message):
        EmbeddedStore(root, DIMENSION).apply(upserts={"1": upsert})
    assert EmbeddedStore(root, DIMENSION).generation() == 0


def test_a_query_vector_of_the_wrong_dimension_is_refused(root):
    with pytest.raises(ValueError, match="dimensions"):
        EmbeddedStore(root, DIMENSION).search_dense(np.ones(DIMENSION + 1), 3)


def test_a_second_instance_sees_writes_made_through_the_first(root):
    reader, writer = EmbeddedStore(root, DIMENSION), EmbeddedStore(root, DIMENSION)
    assert reader.count() == 0
    writer.apply(upserts={"1": owner_upsert(1)})
    assert reader.count() == 5
    writer.apply(upserts={"2": owner_upsert(2)})
    assert_consistent(reader, owners=[1, 2], chunks=5)


def test_searches_in_threads_while_the_index_changes(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1)})
    errors, done = [], threading.Event()

    def search_until_done():
        try:
            while not done.is_set():
                assert store.search_dense(unit(0), 100) and store.search_keyword("common", 100)
        except Exception as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    searchers = [threading.Thread(target=search_until_done) for _ in range(3)]
    for searcher in searchers:
        searcher.start()
    for owner in range(2, 7):
        EmbeddedStore(root, DIMENSION).apply(upserts={str(owner): owner_upsert(owner)})
    done.set()
    for searcher in searchers:
        searcher.join()

    assert errors == []
    assert_consistent(store, owners=list(range(1, 7)), chunks=5)


def test_a_reader_follows_current_when_its_generation_is_deleted_under_it(root, monkeypatch):
    EmbeddedStore(root, DIMENSION).apply(upserts={"1": owner_upsert(1)})
    load = Generation.load

    def load_after_two_more_writes(root_, number, dimension):
        monkeypatch.setattr(Generation, "load", load)
        EmbeddedStore(root, DIMENSION).apply(upserts={"2": owner_upsert(2)})
        EmbeddedStore(root, DIMENSION).apply(upserts={"3": owner_upsert(3)})  # deletes generation `number`
        return load(root_, number, dimension)

    monkeypatch.setattr(Generation, "load", load_after_two_more_writes)
    store = EmbeddedStore(root, DIMENSION)

    assert_consistent(store, owners=[1, 2, 3], chunks=5)
    assert not (root / generation_name(1)).exists()


def test_only_the_current_and_previous_generations_stay_on_disk(root):
    store = EmbeddedStore(root, DIMENSION)
    for owner in range(4):
        store.apply(upserts={str(owner): owner_upsert(owner)})

    assert generation_dirs(root) == [generation_name(3), generation_name(4)]
    assert (root / "CURRENT").read_text().strip() == generation_name(4)


def test_leftovers_of_a_crashed_writer_are_ignored_then_cleaned(root):
    store = EmbeddedStore(root, DIMENSION)
    store.apply(upserts={"1": owner_upsert(1)})
    # a writer died while building a generation, another after renaming one but before swapping CURRENT
    (root / "tmp-dead-writer").mkdir()
    (root / "tmp-dead-writer" / "dense.faiss").write_bytes(b"half a file")
    (root / generation_name(2)).mkdir()
    (root / "CURRENT.tmp").write_text(generation_name(2))

    assert_consistent(EmbeddedStore(root, DIMENSION), owners=[1], chunks=5)
    store.apply(upserts={"2": owner_upsert(2)})
    assert_consistent(store, owners=[1, 2], chunks=5)
    assert not (root / "tmp-dead-writer").exists()
    assert generation_dirs(root) == [generation_name(1), generation_name(2)]


def write_owners(root: Path, owners: list[int]) -> None:
    """Run in a child process: one apply per owner."""
    store = EmbeddedStore(root, DIMENSION)
    for owner in owners:
        store.apply(upserts={str(owner): owner_upsert(owner)})


def write_forever(root: Path) -> None:
    """Run in a child process until killed: owner after owner, each its own write."""
    store = EmbeddedStore(root, DIMENSION)
    owner = 1
    while True:
        store.apply(upserts={str(owner): owner_upsert(owner, chunks=20)})
        owner += 1


def test_two_processes_writing_at_once_lose_nothing(root):
    reader = EmbeddedStore(root, DIMENSION)
    assert reader.count() == 0  # loaded (empty) before the writers start: it must notice their writes
    spawn = multiprocessing.get_context("spawn")
    writers = [spawn.Process(target=write_owners, args=(root, owners))
               for owners in (list(range(1, 13)), list(range(13, 25)))]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
        assert writer.exitcode == 0

    assert_consistent(reader, owners=list(range(1, 25)), chunks=5)
    assert reader.generation() >= 24  # one per write, and one per background merge


def test_a_writer_killed_mid_write_leaves_a_loadable_consistent_index(root):
    spawn = multiprocessing.get_context("spawn")
    interrupted = 0
    for delay in (0.0, 0.005, 0.02):  # kill points from just after a write starts to around its end
        writer = spawn.Process(target=write_forever, args=(root,))
        writer.start()
        started = read_current(root)
        deadline = time.monotonic() + 30
        while not (read_current(root) >= started + 3 and staging_dirs(root)) and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        interrupted += bool(staging_dirs(root))

        store = EmbeddedStore(root, DIMENSION)
        assert store.generation() >= started + 3
        written = sorted({chunk_id // 100 for chunk_id, _ in store.search_keyword("common", 10**6)})
        assert_consistent(store, owners=written, chunks=20)

    assert interrupted, "no kill landed mid-write"
    # the lock died with the writer: the next write goes through and sweeps its leftovers
    store.apply(upserts={"999": owner_upsert(999, chunks=20)})
    assert staging_dirs(root) == []
    assert_consistent(store, owners=[*written, 999], chunks=20)
