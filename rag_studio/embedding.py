"""Turns chunk texts and queries into vectors with a knowledge base's embedding model: in process with
sentence-transformers for a local model (no network hop on the ingest or query path), or through the gateway for
an embedding deployment. Vectors come back L2-normalised float32."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor
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

    torch.set_num_threads(max(1, settings.RAG_EMBED_CONCURRENCY))
    with _load_lock:
        return SentenceTransformer(path, device="cpu")


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
        """One batch, in one model call or request (queries, small batches)."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if self.deployment:
            return _normalised(self._embed_remote(texts))
        return _normalised(_local_model(self.model_path).encode(texts, batch_size=len(texts),
                                                                 convert_to_numpy=True))

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
