"""Turns chunk texts and queries into vectors with a knowledge base's embedding model: in process with
sentence-transformers for a local model (no network hop on the ingest or query path), or through the gateway for
an embedding deployment. Vectors come back L2-normalised float32."""

import os
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache

import httpx
import numpy as np
from django.conf import settings

from accounts.errors import ValidationFailed
from accounts.services import service_token

# Weights come from a local path only; never let a missing file turn into a download attempt.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_load_lock = threading.Lock()


class EmbeddingFailed(Exception):
    pass


@lru_cache(maxsize=4)
def _local_model(path: str):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(max(1, settings.TORCH_THREADS))
    with _load_lock:
        return SentenceTransformer(path, device="cpu")


class _ConcurrentBatcher:
    """Encodes the texts of concurrent callers together, one model call at a time on one thread: each call takes
    every text that arrived while the previous one ran. Under load, a query then shares its forward pass (and
    sentence-transformers' per-call Python work) with the others instead of competing with them for the cores.

    Written here because sentence-transformers encodes one caller's list only, and the embedding engine's batcher
    is asyncio-based and lives in a process of its own; callers here are the web process's worker threads."""

    def __init__(self, model, *, max_batch_size: int):
        self._model = model
        self._max_batch_size = max_batch_size
        self._waiting: queue.SimpleQueue[tuple[list[str], Future]] = queue.SimpleQueue()
        threading.Thread(target=self._encode_forever, name="embed-batcher", daemon=True).start()

    def encode(self, texts: list[str]) -> np.ndarray:
        done: Future = Future()
        self._waiting.put((texts, done))
        return done.result()

    def _next_batch(self) -> list[tuple[list[str], Future]]:
        batch = [self._waiting.get()]
        size = len(batch[0][0])
        while size < self._max_batch_size:
            try:
                texts, done = self._waiting.get_nowait()
            except queue.Empty:
                break
            batch.append((texts, done))
            size += len(texts)
        return batch

    def _encode_forever(self) -> None:
        while True:
            batch = self._next_batch()
            texts = [text for texts, _ in batch for text in texts]
            try:
                vectors = self._model.encode(texts, batch_size=len(texts), convert_to_numpy=True,
                                             show_progress_bar=False)
            except Exception as exc:
                for _, done in batch:
                    done.set_exception(exc)
                continue
            start = 0
            for texts, done in batch:
                done.set_result(vectors[start:start + len(texts)])
                start += len(texts)


@lru_cache(maxsize=4)
def _batcher(path: str, pid: int) -> _ConcurrentBatcher:
    # Keyed by process: a forked worker inherits this cache but not the parent's batcher thread.
    return _ConcurrentBatcher(_local_model(path), max_batch_size=settings.RAG_EMBED_BATCH_SIZE)


def _normalised(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


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
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if self.deployment:
            return _normalised(self._embed_remote(texts))
        return _normalised(_batcher(self.model_path, os.getpid()).encode(texts))

    def embed_many(self, texts: list[str]) -> np.ndarray:
        """Any number of texts, RAG_EMBED_BATCH_SIZE per model call. A local model takes them all at once and
        batches them by length (sentence-transformers sorts them), so a batch holds little padding; a deployment
        gets RAG_EMBED_CONCURRENCY requests at a time."""
        size = settings.RAG_EMBED_BATCH_SIZE
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if not self.deployment:
            return _normalised(_local_model(self.model_path).encode(
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
