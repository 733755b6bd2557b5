"""Vector normalisation, defined once. Every vector compared by cosine (a knowledge base's chunks and queries, an
agent's long-term memories) is scaled to length 1 first, so that a dot product (FAISS's inner-product index, numpy's
`@`) is the cosine similarity."""

import numpy as np


def normalised(vectors) -> np.ndarray:
    """A float32, C-ordered copy of a [n, dimension] matrix with each row scaled to length 1 (a zero row stays
    zero)."""
    matrix = np.array(vectors, dtype=np.float32, order="C")
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    return matrix
